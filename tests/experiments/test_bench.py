"""``make bench``: the files of its repeated fixed-cost sweeps, its throughput figure and its typed parts."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace


from isosweep.experiments.bench import (
    SWEEP_BUDGET,
    EngineRow,
    SweepPart,
    Throughput,
    TrialSplit,
    fixed_cost_sweep_file,
    throughput,
)
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


ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_parts_read_back_and_write_again_unchanged():
    """``bench/results.json``'s engine table, trial splits and sweep part, read as their dataclasses and written
    again: the same JSON, the same file."""
    text = (ROOT / "bench" / "results.json").read_text()
    figures = json.loads(text)
    engines = [EngineRow.from_json(row) for row in figures["engines"]]
    trials = {name: TrialSplit.from_json(split) for name, split in figures["trial"].items()}
    sweep = SweepPart.from_json(figures["sweep"])
    written = {**figures, "engines": [row.to_json() for row in engines],
               "trial": {name: split.to_json() for name, split in trials.items()}, "sweep": sweep.to_json()}
    assert json.dumps(written, indent=2) == text
    assert engines[0].throughput.batch == 32 and trials["hf"].per_step_s["eval_s_per_eval"] > 0
    assert [run.concurrency for run in sweep.runs] == [1, "packed", 1, "packed"]
    assert sweep.runs[1].fixed_s_per_trial is None  # packed: no fixed cost per trial


def test_throughput_is_the_best_of_the_repeats_after_a_warm_up(monkeypatch):
    clock = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.75])  # the three timed calls take 0.5, 0.25 and 0.75 s
    monkeypatch.setattr("isosweep.experiments.bench.time.perf_counter", lambda: next(clock))

    class Engine:
        def __init__(self) -> None:
            self.seeds: list[int] = []

        def generate(self, prompts, n, seed):
            self.seeds.append(seed)
            return SimpleNamespace(num_tokens=len(prompts) * n * 4)

    engine = Engine()
    found = throughput(engine, [f"p{i}" for i in range(10)], 32, repeats=3)
    assert engine.seeds == [0, 1, 2, 3] and found == Throughput(32, 0.25, 32 / 0.25, 4 * 32 / 0.25)
    assert Throughput.from_json(json.loads(json.dumps(found.to_json()))) == found
    row = EngineRow("hf", "tiny-1m", 1.5, found)
    assert EngineRow.from_json(json.loads(json.dumps(row.to_json()))) == row
    assert list(row.to_json()) == ["engine", "size", "startup_s", "batch", "seconds", "rollouts_per_s", "tokens_per_s"]
