"""One loader for every study file: each file in sweeps/ loads, as the kind its ``study:`` key says."""

from __future__ import annotations

from pathlib import Path

import pytest

from isosweep.experiments.hpo_table import load_table_spec
from isosweep.spec.grid import Sweep
from isosweep.spec.hpo import HPOStudy
from isosweep.spec.study import load_study
from isosweep.spec.trial import load_trial, steps
from isosweep.spec.yamlio import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SWEEP_FILES = sorted((ROOT / "sweeps").rglob("*.yaml"))


@pytest.mark.parametrize("path", SWEEP_FILES, ids=[str(p.relative_to(ROOT / "sweeps")) for p in SWEEP_FILES])
def test_every_file_in_sweeps_loads(path):
    if path.parent.name == "trials":
        assert steps(load_trial(path)) >= 1
        return
    if path.parent.name == "tables":  # tables of learning curves for the HPO benchmark (isosweep hpo-table)
        spec, grid = load_table_spec(path)
        assert spec.default in grid
        return
    study = load_study(path)
    if isinstance(study, HPOStudy):
        assert study.sweep_id.startswith(f"{study.spec.name}-{study.spec.search}-")
        assert study.study_budget >= study.cost(study.space.ladder[0][0], study.space.budget_min)
        return
    assert isinstance(study, Sweep)
    assert study.trials and study.sweep_id.startswith(study.spec.name + "-")
    for point in study.trials:
        assert steps(point.cfg) >= 1 and point.cfg.budget == study.budget


def test_the_study_key_decides_the_kind(tmp_path):
    assert isinstance(load_study(ROOT / "sweeps" / "jfhpo.yaml"), HPOStudy)
    assert isinstance(load_study(ROOT / "sweeps" / "smoke.yaml"), Sweep)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nstudy: grid\ntrial: t.yaml\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: key 'study': 'grid' is not a study kind; allowed: isocompute, "
                                          r"fixed-batch, hpo"):
        load_study(bad)
    with pytest.raises(ConfigError, match="--study-budget .* is for HPO studies"):
        load_study(ROOT / "sweeps" / "smoke.yaml", study_budget="4x")
