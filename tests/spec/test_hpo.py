"""HPO study files: what loads, the cost units, and the bad input that must stop before any trial."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from isosweep.models.sizes import param_count
from isosweep.spec.hpo import load_hpo
from isosweep.spec.yamlio import ConfigError

ROOT = Path(__file__).resolve().parents[2]
JFHPO = ROOT / "sweeps" / "jfhpo.yaml"
SMOKE = ROOT / "sweeps" / "hpo-smoke.yaml"
EASY = ROOT / "sweeps" / "trials" / "easy.yaml"


def write(tmp_path: Path, **changes) -> Path:
    """A copy of the smoke study with ``changes`` (the trial path made absolute so the copy can live anywhere)."""
    data = {**yaml.safe_load(SMOKE.read_text()), "trial": str(EASY), **changes}
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_shipped_study_loads_with_its_units():
    study = load_hpo(JFHPO)
    space = study.space
    assert study.target == "tiny-5m" and list(space.sizes) == ["tiny-0.3m", "tiny-1m", "tiny-5m"]
    assert space.sizes["tiny-5m"] == param_count("tiny-5m")
    assert space.size_fidelities[-1] == 1.0 and space.size_fidelities[0] == pytest.approx(322880 / 4830464)
    assert (space.budget_min, space.budget_max, study.batch) == (1024, 8192, 128)
    assert space.names == ("algorithm.lr_ref", "rollout.temperature", "algorithm.kl_coef")
    assert [p.log for p in space.params] == [True, False, True]
    # "4x" = what four full-fidelity trials cost, per-trial charge included
    assert study.study_budget == pytest.approx(4 * 8192 * 1.25)
    assert study.cost("tiny-5m", 8192) == pytest.approx(8192 * 1.25)
    assert study.cost("tiny-1m", 1000) == pytest.approx(1000 * 955776 / 4830464 + 0.25 * 8192)


def test_overrides_and_the_trial_config_of_a_suggestion():
    study = load_hpo(JFHPO, budget="4096", study_budget="20000", overrides={"search": "asha", "seed": 2})
    assert study.budget == 4096 and study.study_budget == 20000 and study.spec.search == "asha"
    assert study.sweep_id.startswith("jfhpo-asha-s2-4096-")
    assert study.sweep_id != load_hpo(JFHPO, budget="4096", study_budget="20000").sweep_id
    cfg = study.trial_config({"algorithm.lr_ref": 1e-5, "rollout.temperature": 0.7, "algorithm.kl_coef": 0.01},
                             "tiny-1m", 2048)
    assert (cfg.model.name, cfg.budget, cfg.algorithm.lr_ref, cfg.algorithm.kl_coef) == ("tiny-1m", 2048, 1e-5, 0.01)
    assert (cfg.rollout.temperature, cfg.eval.temperature) == (0.7, 1.0)  # searched; scored at 1 whatever it is
    assert cfg.profile == "cpu-half" and cfg.rollout.engine == "hf"  # the study's `set` applies


@pytest.mark.parametrize("changes, words", [
    ({"space": {"algorithm.lr_ref": {"low": 1e-4, "high": 1e-5, "log": True}}},
     ["space.algorithm.lr_ref", "empty range"]),
    ({"space": {"algorithm.clip_high": {"low": 0.2, "high": 0.2}}}, ["space.algorithm.clip_high", "empty range"]),
    ({"space": {"algorithm.kl_coef": {"low": 0.0, "high": 0.1, "log": True}}}, ["low > 0"]),
    ({"sizes": ["tiny-1m", "tiny-0.3m"]}, ["'sizes'", "target", "largest", "tiny-1m"]),
    ({"sizes": {"org/small": 1000, "org/big": 500}}, ["'sizes'", "strictly largest", "org/small"]),
    ({"budget_min": 0.01}, ["'budget_min'", "less than one optimizer step", "Bp * n = 64"]),
    ({"study_budget": "50"}, ["'study_budget'", "cannot pay for one trial at the lowest fidelity"]),
    ({"study_budget": "lots"}, ["'study_budget'", "not a number"]),
    # random search and ASHA start every trial at the target's full fidelity
    ({"search": "random", "study_budget": "0.9x"}, ["'study_budget'", "random uses (tiny-1m at 512 rollouts"]),
    ({"search": "bayes"}, ["'search'", "jfhpo", "asha"]),
    ({"space": {"budget": {"low": 1, "high": 2}}}, ["'budget' cannot be searched"]),
    ({"space": {"algorithm.lr_reff": {"low": 1e-6, "high": 1e-4}}}, ["'space'", "lr_reff", "unknown key"]),
    ({"sizes": ["tiny-0.3m", "tiny-9m"]}, ["'sizes'", "tiny-9m"]),
    ({"stoping": {"tau1": 1}}, ["'stoping'", "unknown key"]),
    # a searched temperature needs a fixed scoring temperature, or values would not compare
    ({"space": {"rollout.temperature": {"low": 0.5, "high": 1.5}}}, ["'space'", "eval.temperature", "would not compare"]),
])
def test_bad_input_names_the_file_and_the_key(tmp_path, changes, words):
    path = write(tmp_path, **changes)
    with pytest.raises(ConfigError) as err:
        load_hpo(path)
    message = str(err.value)
    assert str(path) in message
    for word in words:
        assert word in message, message


def test_a_searched_temperature_loads_once_evaluation_has_its_own(tmp_path):
    study = load_hpo(write(tmp_path, space={"rollout.temperature": {"low": 0.5, "high": 1.5}},
                           set={**yaml.safe_load(SMOKE.read_text())["set"], "eval.temperature": 1.0}))
    cfg = study.trial_config({"rollout.temperature": 0.7}, "tiny-1m", 512)
    assert cfg.rollout.temperature == 0.7 and cfg.eval.temperature == 1.0


def test_a_too_small_budget_or_study_budget_from_the_command_line(tmp_path):
    with pytest.raises(ConfigError, match="less than one optimizer step"):
        load_hpo(SMOKE, budget="128")  # budget_min 0.25 x 128 < one step of 64
    with pytest.raises(ConfigError, match="cannot pay for one trial"):
        load_hpo(SMOKE, study_budget="0.01x")


def test_the_cli_rejects_a_bad_study_before_any_trial(tmp_path):
    path = write(tmp_path, sizes=["tiny-1m", "tiny-0.3m"])
    runs = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "platform")}
    done = subprocess.run([sys.executable, "-m", "isosweep.cli", "sweep", str(path), "--runs", str(runs)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "configuration error" in done.stderr and "largest" in done.stderr
    assert not runs.exists()  # nothing started: no Ray, no MLflow run, no trial directory
    dry = subprocess.run([sys.executable, "-m", "isosweep.cli", "sweep", str(JFHPO), "--dry-run",
                          "--study-budget", "6x"], env=env, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0 and "6.00 full-fidelity trials" in dry.stdout
    grid = subprocess.run([sys.executable, "-m", "isosweep.cli", "sweep", str(ROOT / "sweeps" / "smoke.yaml"),
                           "--dry-run", "--study-budget", "6x"], env=env, capture_output=True, text=True, timeout=120)
    assert grid.returncode == 2 and "STUDY_BUDGET" in grid.stderr
    # submitting checks the study the same way before anything is uploaded
    sub = subprocess.run([sys.executable, "-m", "isosweep.cli", "submit", str(SMOKE), "--address", "http://127.0.0.1:9",
                          "--study-budget", "0.01x"], env=env, capture_output=True, text=True, timeout=120)
    assert sub.returncode == 2 and "cannot pay for one trial" in sub.stderr



def test_the_proxy_guard_keys_reach_the_searcher_and_leave_an_existing_studys_id_alone(tmp_path):
    from isosweep.run.hpo import make_searcher

    plain = load_hpo(write(tmp_path))
    searcher = make_searcher(plain)
    assert (searcher.proxy_check, searcher.proxy_budget) == (0, None)
    data = yaml.safe_load(write(tmp_path).read_text())
    for jfhpo in ({"proxy_check": 0}, {"proxy_check": 0, "proxy_rho": 0.6, "proxy_share": None}):
        path = tmp_path / "same.yaml"
        path.write_text(yaml.safe_dump({**data, "jfhpo": {**data.get("jfhpo", {}), **jfhpo}}))
        assert load_hpo(path).sweep_id == plain.sweep_id  # keys at their defaults: the id a rerun resumes
    path = tmp_path / "guarded.yaml"
    path.write_text(yaml.safe_dump({**data, "jfhpo": {**data.get("jfhpo", {}), "proxy_check": 4, "proxy_rho": 0.5,
                                                      "proxy_share": 0.5}}))
    guarded = load_hpo(path)
    assert guarded.sweep_id != plain.sweep_id
    searcher = make_searcher(guarded)
    assert (searcher.proxy_check, searcher.proxy_rho) == (4, 0.5)
    assert searcher.proxy_budget == pytest.approx(0.5 * guarded.study_budget)
    path.write_text(yaml.safe_dump({**data, "jfhpo": {"proxy_check": 2}}))
    with pytest.raises(ConfigError, match="proxy_check"):
        load_hpo(path)
