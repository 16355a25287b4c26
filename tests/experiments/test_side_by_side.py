"""The side-by-side of ``make bench``: what each contender is given, the summary statistics, and a real run."""

from __future__ import annotations

import importlib.util
import statistics

import pytest

from isosweep.experiments.side_by_side import CONTENDERS, WARMUP_STEPS, Setup, side_by_side, summarize, table
from isosweep.spec.trial import kl_coef, learning_rate, rollout_engine, steps
from isosweep.trial.loop import batch_problems, problem_sets


def test_summary_is_the_median_over_repeats_of_each_runs_steady_state_median():
    runs = [{"seconds": [9.0, 9.0, 0.2, 0.4, 0.3]}, {"seconds": [5.0, 5.0, 0.6, 0.5, 0.7]},
            {"seconds": [1.0, 1.0, 0.1, 0.1, 0.2]}, {"error": "boom"}]
    assert WARMUP_STEPS == 2
    fig = summarize(runs, rollouts_per_step=128)
    per_run = [0.3, 0.6, 0.1]  # the first WARMUP_STEPS of each run left out
    assert fig["s_per_step"] == pytest.approx(statistics.median(per_run))
    assert (fig["s_per_step_min"], fig["s_per_step_max"]) == (pytest.approx(0.1), pytest.approx(0.6))
    assert fig["rollouts_per_s"] == pytest.approx(128 / 0.3)
    assert (fig["repeats"], fig["failed"]) == (3, 1)
    assert summarize([{"error": "no trl"}], 128)["error"] == "no trl"


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
    for contender in CONTENDERS:
        assert "error" not in results[contender], results[contender]
        assert results[contender]["s_per_step"] > 0 and len(results[contender]["runs"][0]["seconds"]) == 4
    iso = results["isosweep"]["runs"][0]
    assert iso["engine"] == "hf" and iso["launcher"] == "in_process" and iso["fixed_s"] > 0
    phases = {"imports_s", "distributed_s", "model_s", "engine_s", "problems_s", "learner_s", "resume_s"}
    assert phases <= set(iso["start_s"])
    # in process: no Ray Train job to start, so no job_s; the phases it has fit in the trial's wall time
    assert "job_s" not in iso["start_s"]
    assert 0 < sum(iso["start_s"][phase] for phase in phases) < iso["trial_wall_s"]
    assert results["speedup_vs_trl"] == pytest.approx(results["trl"]["s_per_step"] / results["isosweep"]["s_per_step"])
    assert results["overlap_speedup"] == pytest.approx(
        results["torch"]["s_per_step"] / results["torch-overlap"]["s_per_step"])
    assert "| tiny-1m | isosweep / TRL |" in table({"tiny-1m": results})
    assert "| tiny-1m | torch-overlap / torch |" in table({"tiny-1m": results})
