"""Adaptive sweeps, live: trials pause at their rung and resume to the same curve, the rule decides at every rung,
its decisions survive a rerun, and a rerun without ``adaptive`` resumes the stopped trials. The trials are the
tabular control's (seconds each), run through the real trial loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from isosweep.run.adaptive import ADAPTIVE_FILE, Decisions, rule_of, run_phases, stopped_trials, trial_curve
from isosweep.run.core import is_finished, trial_of
from isosweep.spec.grid import AdaptiveSpec, load_sweep
from isosweep.spec.trial import load_trial
from isosweep.spec.yamlio import ConfigError
from isosweep.track import runs
from isosweep.trial.files import TrialDir
from isosweep.trial.job import run_trial

ROOT = Path(__file__).resolve().parents[2]
TRIAL = ROOT / "sweeps" / "trials" / "tabular-hard.yaml"


def quiet(*_):
    pass


def test_a_paused_trial_ends_at_its_first_evaluation_past_the_rung_and_resumes_to_the_same_curve(tmp_path):
    cfg = load_trial(TRIAL, ["budget=4096", "n=8", "eval.every=4", "eval.samples=8"])  # M = 32, evals every 4
    straight = run_trial(cfg, tmp_path / "straight", log=quiet)
    paused = TrialDir(tmp_path / "paused")
    paused.request_pause(1000)
    records = run_trial(cfg, paused.path, log=quiet)
    assert [r["rollouts"] for r in records] == [0, 512, 1024]  # the first evaluation at or past 1,000
    assert not is_finished(paused, cfg) and paused.pause_at() == 1000
    assert run_trial(cfg, paused.path, log=quiet) == records  # still paused there: nothing runs
    paused.clear_pause()
    resumed = run_trial(cfg, paused.path, log=quiet)
    assert is_finished(paused, cfg)
    key = "eval/mean@4"
    assert [(r["rollouts"], r[key]) for r in resumed] == [(r["rollouts"], r[key]) for r in straight]


def sweep_file(tmp_path: Path, adaptive: dict | None) -> Path:
    spec = {"name": "adaptive-test", "study": "isocompute", "trial": str(TRIAL), "budget": 6144,
            "grid": {"n": [4, 32], "Bp": [16]}, "seeds": [0],
            "set": {"eval.points": 6, "eval.samples": 8}, "frontier": {"points": 4, "bootstrap": 20}}
    if adaptive is not None:
        spec["adaptive"] = adaptive
    path = tmp_path / ("adaptive.yaml" if adaptive is not None else "full.yaml")
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_adaptive_section_is_checked_and_left_out_of_the_sweep_id(tmp_path):
    adaptive = load_sweep(sweep_file(tmp_path, {"method": "asha", "rungs": [4]}))
    full = load_sweep(sweep_file(tmp_path, None))
    assert adaptive.sweep_id == full.sweep_id  # the same trials: a run without adaptive resumes this one
    assert rule_of(adaptive.spec.adaptive).rungs == (0.25,)
    assert rule_of(AdaptiveSpec()).rungs == (1 / 64, 1 / 16, 1 / 4)
    for bad in ({"rungs": [4, 16]}, {"rungs": [1]}, {"confidence": 1.0}, {"method": "pbt"}):
        with pytest.raises(ConfigError, match="adaptive"):
            load_sweep(sweep_file(tmp_path, bad))


def test_an_adaptive_sweep_decides_at_its_rungs_keeps_its_decisions_and_a_full_rerun_resumes_the_stopped(
        mlflow_server, tmp_path):
    uri, _ = mlflow_server
    sweep = load_sweep(sweep_file(tmp_path, {"method": "asha", "rungs": [4]}))
    out = tmp_path / "runs" / sweep.sweep_id
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, out)
    launched: list[list[str]] = []

    def launch(points) -> bool:
        launched.append([p.key for p in points])
        for p in points:
            run_trial(p.cfg, trial_of(out, p.key).path, log=quiet)
        return True

    lines: list[str] = []
    decisions = run_phases(sweep, out, sweep.spec.adaptive, launch, client, parent, lines.append)
    # the rung C/4 = 1,536: both configurations run to it, ASHA (eta 4) keeps one, the last phase runs it to C
    assert launched == [["n4-Bp16", "n32-Bp16"], [next(iter({"n4-Bp16", "n32-Bp16"} - decisions.stopped))]]
    assert decisions.rungs_done == [1536.0] and len(decisions.stops) == 1
    [stop] = decisions.stops
    assert stop.C == 1536 and "asha: ranked 2 of 2" in stop.reason
    loser = next(p for p in sweep.trials if p.config_key == stop.config)
    winner = next(p for p in sweep.trials if p.config_key != stop.config)
    # the decision is the real rule's on the curves as the trials left them: the loser's running best is lower
    best = {p.config_key: float(trial_curve(p, trial_of(out, p.key)).values["mean@4"].max()) for p in sweep.trials}
    assert best[winner.config_key] >= best[loser.config_key]
    assert is_finished(trial_of(out, winner.key), winner.cfg)
    stopped_dir = trial_of(out, loser.key)
    assert not is_finished(stopped_dir, loser.cfg) and stopped_dir.pause_at() is None
    assert stopped_trials(sweep, out) == {loser.key}
    assert f"[adaptive] stopped at C = 1,536 ({stopped_dir.last_step_rollouts():,} rollouts trained): asha" in \
        stopped_dir.log_file.read_text()
    assert json.loads((out / ADAPTIVE_FILE).read_text()) == Decisions.load(out).to_json()
    assert any(a.path == ADAPTIVE_FILE for a in client.list_artifacts(parent))
    assert any(line.startswith(f"[adaptive] stopped {loser.config_key} at C = 1,536: asha") for line in lines)

    # a rerun goes on from the decisions: nothing runs again
    launched.clear()
    assert run_phases(sweep, out, sweep.spec.adaptive, launch, client, parent, quiet).to_json() == decisions.to_json()
    assert launched == []
    # the same sweep without adaptive: the stopped trial resumes from its checkpoint and runs to C
    before = len(stopped_dir.records())
    records = run_trial(loser.cfg, stopped_dir.path, log=quiet)
    assert is_finished(stopped_dir, loser.cfg) and records[:before] == stopped_dir.records()[:before]
