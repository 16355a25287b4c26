"""The side-by-side of ``make bench``: what each contender is given, the summary statistics, and a real run."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from isosweep.experiments.side_by_side import (
    CONTENDERS,
    WARMUP_STEPS,
    ContenderRun,
    ContenderSummary,
    Setup,
    SizeResult,
    Speed,
    TrialCost,
    side_by_side,
    summarize,
    table,
)
from isosweep.spec.trial import kl_coef, learning_rate, rollout_engine, steps
from isosweep.trial.loop import batch_problems, problem_sets


def test_summary_is_the_median_over_repeats_of_each_runs_steady_state_median():
    runs = [ContenderRun((9.0, 9.0, 0.2, 0.4, 0.3)), ContenderRun((5.0, 5.0, 0.6, 0.5, 0.7)),
            ContenderRun((1.0, 1.0, 0.1, 0.1, 0.2)), ContenderRun(None, error="boom")]
    assert WARMUP_STEPS == 2
    fig = summarize(runs, rollouts_per_step=128).speed
    per_run = [0.3, 0.6, 0.1]  # the first WARMUP_STEPS of each run left out
    assert fig.s_per_step == pytest.approx(statistics.median(per_run))
    assert (fig.s_per_step_min, fig.s_per_step_max) == (pytest.approx(0.1), pytest.approx(0.6))
    assert fig.rollouts_per_s == pytest.approx(128 / 0.3)
    assert (fig.repeats, fig.failed) == (3, 1)
    failed = summarize([ContenderRun(None, error="no trl")], 128)
    assert failed.speed is None and failed.error == "no trl"
    assert failed.to_json() == {"error": "no trl", "runs": [{"error": "no trl"}]}


ROOT = Path(__file__).parents[2]


def test_the_committed_figures_read_back_and_write_again_unchanged():
    """``bench/results.json``'s side-by-side, read as :class:`SizeResult` per size and written again: the same
    JSON (runs of an older isosweep, with ``ray_start_s`` and no ``launcher``, included) and the same table as
    ``bench/side_by_side.md``."""
    text = (ROOT / "bench" / "results.json").read_text()
    figures = json.loads(text)["side_by_side"]
    rows = {size: SizeResult.from_json(row) for size, row in figures.items()}
    assert {size: row.to_json() for size, row in rows.items()} == figures
    written = {**json.loads(text), "side_by_side": {size: row.to_json() for size, row in rows.items()}}
    assert json.dumps(written, indent=2) == text  # as bench.main writes the file
    assert table(rows) + "\n" == (ROOT / "bench" / "side_by_side.md").read_text()
    first = rows["tiny-1m"]
    assert first.speedups["trl"] == figures["tiny-1m"]["speedup_vs_trl"] and first.overlap_speedup is not None
    assert first.contenders["isosweep"].runs[0].trial.ray_start_s is not None


def test_every_run_and_summary_reads_back_from_its_json():
    """The child's figures file, a failed run, a summary and a row: ``from_json(to_json(x)) == x`` through JSON
    text; a row without a finished isosweep run has no speed-ups."""
    through = lambda data: json.loads(json.dumps(data))  # noqa: E731
    cost = TrialCost("hf", "in_process", 9.5, 4.0, 1.25, {"step_s": 0.3}, {"model_s": 0.5})
    iso = ContenderRun((0.5, 0.4, 0.3), trial=cost)
    child = iso.to_json()
    assert list(child) == ["seconds", "engine", "launcher", "trial_wall_s", "fixed_s", "first_eval_s", "split_s",
                           "start_s"]  # no process_s: the parent times the subprocess
    timed = ContenderRun.from_json(through({**child, "process_s": 12.0}))
    assert timed.process_s == 12.0 and timed.trial == cost and timed.seconds == iso.seconds
    for run in (iso, ContenderRun((0.1, 0.2)), ContenderRun(None, error="boom", process_s=1.5), timed):
        assert ContenderRun.from_json(through(run.to_json())) == run
    assert TrialCost.from_json(through(cost.to_json())) == cost
    setup = Setup("tiny-1m", "/m", "arithmetic", 0, 16, 8, 8, 1.0, 1e-5, 1e-3, 0.2, 0.28, 1.0, ("Bp=16", "n=8"))
    assert Setup.from_json(through(setup.to_json())) == setup
    summary = summarize([timed, ContenderRun(None, error="x")], 128)
    assert ContenderSummary.from_json(through(summary.to_json())) == summary
    assert Speed.from_json(through(summary.speed.to_json())) == summary.speed
    row = SizeResult(setup, {"isosweep": summarize([ContenderRun(None, error="x")], 128), "torch": summary}, {})
    assert SizeResult.from_json(through(row.to_json())) == row and "overlap_speedup" not in row.to_json()
    assert "| tiny-1m | isosweep | failed: x | |" in table({"tiny-1m": row})


def test_every_contender_gets_the_trial_setting(base_model):
    setup = Setup.of("tiny-1m")
    cfg = setup.trial_config(steps=5)
    assert steps(cfg) == 5 and (cfg.Bp, cfg.n, cfg.rollout.max_new_tokens) == (16, 8, 8)
    assert (setup.lr, setup.kl_coef) == (learning_rate(cfg), kl_coef(cfg)) == (cfg.algorithm.lr_ref, 1e-3)  # B = batch_ref
    assert rollout_engine(cfg) == "hf"  # a sweep's default engine for this model here
    problems = setup.step_problems(3)
    assert len(problems) == 3 * 16
    train = problem_sets(cfg, setup.model_path, None).train  # the trial's own order, step by step
    assert problems[16:32] == batch_problems(train, 16, 1, setup.seed)


@pytest.mark.slow
def test_side_by_side_runs_every_contender_and_reports_ratios(base_model, tmp_path):
    if importlib.util.find_spec("trl") is None:
        pytest.skip("TRL (the bench extra) is not installed: pip install -e '.[bench]'")
    results = side_by_side(["tiny-1m"], repeats=1, steps=WARMUP_STEPS + 2, log=lambda _: None)["tiny-1m"]
    speed = {}
    for contender in CONTENDERS:
        summary = results.contenders[contender]
        assert summary.speed is not None, summary.error
        assert summary.speed.s_per_step > 0 and len(summary.runs[0].seconds) == 4
        speed[contender] = summary.speed.s_per_step
    iso = results.contenders["isosweep"].runs[0].trial
    assert iso.engine == "hf" and iso.launcher == "in_process" and iso.fixed_s > 0
    phases = {"imports_s", "distributed_s", "model_s", "engine_s", "problems_s", "learner_s", "resume_s"}
    assert phases <= set(iso.start_s)
    # in process: no Ray Train job to start, so no job_s; the phases it has fit in the trial's wall time
    assert "job_s" not in iso.start_s
    assert 0 < sum(iso.start_s[phase] for phase in phases) < iso.trial_wall_s
    assert results.speedups["trl"] == pytest.approx(speed["trl"] / speed["isosweep"])
    assert results.overlap_speedup == pytest.approx(speed["torch"] / speed["torch-overlap"])
    assert "| tiny-1m | isosweep / TRL |" in table({"tiny-1m": results})
    assert "| tiny-1m | torch-overlap / torch |" in table({"tiny-1m": results})
