"""``make bench``'s sweep part: the files of its repeated fixed-cost sweeps."""

from __future__ import annotations

from pathlib import Path

from isosweep.experiments.bench import SWEEP_BUDGET, fixed_cost_sweep_file
from isosweep.spec.grid import load_sweep

EASY = Path(__file__).resolve().parents[2] / "sweeps" / "trials" / "easy.yaml"


def test_each_repeat_of_the_fixed_cost_sweep_is_a_sweep_of_its_own(tmp_path):
    """A repeat under the same sweep id would find the first repeat's MLflow parent run, which names another runs
    folder, and be refused; every (concurrency, repeat) is its own sweep of the same four trials."""
    sweeps = []
    for repeat in (0, 1):
        for concurrency in (1, None):
            work = tmp_path / f"r{repeat}-{concurrency}"
            work.mkdir()
            sweeps.append(load_sweep(fixed_cost_sweep_file(work, concurrency, str(EASY), repeat)))
    assert len({s.sweep_id for s in sweeps}) == 4
    for sweep in sweeps:
        assert sweep.spec.budget == SWEEP_BUDGET and len(sweep.trials) == 4
        assert [p.key for p in sweep.trials] == [p.key for p in sweeps[0].trials]
