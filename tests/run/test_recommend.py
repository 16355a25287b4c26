"""``isosweep recommend``: from study folders or MLflow, printed, logged to MLflow as a run with its
artifacts, the suggested sweep written; bad input answered with what is there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from isosweep.cli import main
from isosweep.experiments.stats_validation import BUDGET, SYNTHETIC_PARAMS, TRUTH, synthetic_sweep
from isosweep.report import planner as P
from isosweep.run.recommend import from_mlflow, recommend
from isosweep.spec.grid import load_sweep
from isosweep.spec.yamlio import ConfigError
from isosweep.track import runs
from isosweep.track.curves import SweepData

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def studies(tmp_path) -> Path:
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(0))
    data = SweepData("synthetic-100k-abc", BUDGET, dict(SYNTHETIC_PARAMS),
                     {"sweep.file": str(ROOT / "sweeps" / "n-only.yaml"), "spec.trial": "trials/easy.yaml"}, curves)
    P.write_sweep_data(data, tmp_path / "dashboards" / "synthetic")
    return tmp_path / "dashboards"


def test_a_recommendation_is_printed_logged_to_mlflow_and_its_next_sweep_written(mlflow_server, studies, tmp_path):
    uri, _ = mlflow_server
    lines = []
    rec = recommend("4e5", folder=studies, bootstrap=10, suggest=tmp_path / "next", log_to=uri, log=lines.append)
    out = "\n".join(lines)
    assert f"run  n = {rec.n}, Bp = {rec.Bp}, M = {rec.M:,} steps" in out and "P(best) =" in out
    assert "rests on: synthetic-100k-abc (C = 100,000, 6 trials, seeds [0, 1])" in out
    assert rec.extrapolated and "warning: C = 400,000 is beyond every allocation's data" in out
    written = next((tmp_path / "next").glob("*.yaml"))
    assert load_sweep(written).budget == 400_000
    client = runs.client(uri)
    found = client.search_runs([runs.experiment_id(client)],
                               filter_string="tags.`isosweep.kind` = 'recommendation' and tags.`isosweep.budget` = '400000'")
    assert len(found) == 1
    run = found[0]
    assert run.data.tags["isosweep.sweeps"] == "synthetic-100k-abc" and run.data.tags["isosweep.recommended"] == rec.config
    assert run.data.metrics["recommend/predicted"] == pytest.approx(rec.value)
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
        "recommendation-400k.json", "recommendation.png", written.name}


def test_the_command_answers_bad_input_with_what_is_there(mlflow_server, studies, tmp_path, capsys):
    uri, _ = mlflow_server
    assert main(["recommend", "--budget", "lots", "--from", str(studies), "--no-log"]) == 2
    assert "budget 'lots' is not a number" in capsys.readouterr().err
    assert main(["recommend", "--budget=-1e5", "--from", str(studies), "--no-log"]) == 2
    assert "budget '-1e5' must be a positive whole number" in capsys.readouterr().err
    assert main(["recommend", "--budget", "inf", "--from", str(studies), "--no-log"]) == 2
    assert "budget 'inf' must be a positive whole number" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["recommend", "--budget", "1e5", "--from", str(tmp_path / "empty"), "--no-log"]) == 2
    assert "no finished grid sweep to plan from" in capsys.readouterr().err
    assert main(["recommend", "--budget", "1e5", "--from", str(studies), "--no-log", "--difficulty", "hard"]) == 2
    err = capsys.readouterr().err
    assert "no finished sweep of difficulty hard" in err and "synthetic-100k-abc (task synthetic" in err
    assert main(["recommend", "--budget", "1e5", "--from", str(studies), "--no-log", "--sweeps", "nope"]) == 2
    assert "--sweeps 'nope': no such sweep" in capsys.readouterr().err
    assert main(["recommend", "--budget", "1e5", "--from", str(studies), "--no-log", "--metric", "median"]) == 2
    assert "--metric 'median': allowed" in capsys.readouterr().err
    assert main(["recommend", "--budget", "1e5", "--from", str(studies), "--no-log", "--bootstrap", "5"]) == 0
    assert "run  n = " in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--sweeps 'nope': no finished grid sweep with that id in MLflow"):
        from_mlflow(uri, ["nope"])


def test_without_filters_it_plans_for_the_newest_sweeps_kind_and_says_so(studies):
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(1))
    hard = SweepData("zz-hard-100k", BUDGET, {**SYNTHETIC_PARAMS, "task.difficulty": "hard"}, {}, curves)
    P.write_sweep_data(hard, studies / "zz-hard")
    lines = []
    rec = recommend("1e5", folder=studies, bootstrap=5, log=lines.append)
    assert [s.sweep_id for s in rec.sources] == ["synthetic-100k-abc"]
    assert "planning for task synthetic, difficulty easy, model synthetic" in lines[0]
    assert "choose with --task/--difficulty/--model" in lines[0]
    rec = recommend("1e5", folder=studies, bootstrap=5, difficulty="hard", log=lines.append)
    assert [s.sweep_id for s in rec.sources] == ["zz-hard-100k"]
