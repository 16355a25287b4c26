"""The AIS study's rows as data: each row type read back from the file it is written to, unchanged."""

from __future__ import annotations

import csv
import math

import pytest

from isosweep.experiments.ais_study import (
    AlphaPoint,
    ArmRun,
    ArmSummary,
    PairedDiff,
    arm_overrides,
    earlier_rows,
    pool_seeds,
    summarize_arm,
    write_outputs,
)


def run(arm: str, seed: int, final: float) -> ArmRun:
    records = [{"rollouts": 0, "eval/mean@4": 0.5, "eval_correct": [1, 2, 3, 4], "eval_samples": 8},
               {"rollouts": 256, "eval/mean@4": final, "eval_correct": [2, 2, 4, 5], "eval_samples": 8}]
    steps = [{"step": i, "rollouts": 128 * i, "ais/alpha": 0.1 * i, "mismatch/logp_abs_diff_mean": 0.01 * i,
              "mismatch/ratio_max": 1.0 + i} for i in range(1, 7)]
    return ArmRun("easy", arm, seed, summarize_arm(records, steps, 4), records, steps)


def test_an_arm_is_summarised_over_its_evals_and_the_thirds_of_its_steps():
    summary = run("int4", 0, 0.7).summary
    assert (summary.start_mean, summary.final_mean, summary.best_mean) == (0.5, 0.7, 0.7)
    assert summary.ratio_max == 7.0 and summary.logp_abs_diff == pytest.approx(0.035)
    assert summary.alpha_early == pytest.approx(0.15) and summary.alpha_late == pytest.approx(0.55)
    assert arm_overrides("int4") == ["rollout.precision=int4", "algorithm.correction=none"]


@pytest.mark.parametrize("row", [
    ArmRun("easy", "int4+ais", 1, ArmSummary(0.5, 0.625, 0.75, 0.01, 18.5, 0.9, 0.8)),
    PairedDiff("hard", "fp8+tis", 0, -0.0029296875, 0.004426435623393659),
    PairedDiff("hard", "fp8+tis", "all", 0.1, 0.2),
    AlphaPoint("easy", "bf16", 2, 3, 384, 0.9880629777908325, 0.06910375505685806),
])
def test_each_row_round_trips_through_its_json(row):
    assert type(row).from_json(row.to_json()) == row


def test_the_rows_read_back_from_the_files_are_the_rows_written(tmp_path):
    rows = [run(arm, seed, 0.6 + 0.01 * seed) for seed in (0, 1) for arm in ("bf16", "int4")]
    write_outputs(tmp_path, rows)
    kept = earlier_rows(tmp_path, set())
    assert kept.table == rows  # records and steps are not part of a row's identity
    assert [p.to_json() for p in kept.alpha] == [AlphaPoint.of_step(r, s).to_json() for r in rows for s in r.steps]
    assert [d.seed for d in kept.paired] == [0, 1]  # the pooled row is recomputed, not kept
    pooled = pool_seeds(kept.paired)
    assert pooled[0].seed == "all" and pooled[0].diff == pytest.approx(sum(d.diff for d in kept.paired) / 2)
    header = next(csv.reader((tmp_path / "table.csv").open()))
    assert header == ["set", "arm", "seed", "start_mean@k", "final_mean@k", "best_mean@k", "logp_abs_diff",
                      "ratio_max", "alpha_early", "alpha_late"]
    # a rerun of seed 1 keeps seed 0's rows as read back from the files
    assert earlier_rows(tmp_path, {("easy", "bf16", "1"), ("easy", "int4", "1")}).table == rows[:2]
    assert not math.isnan(kept.paired[0].se)
