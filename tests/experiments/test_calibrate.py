"""The learning-rate pilot's judgement of a trial, its pick and its summary (on made-up trials)."""

import dataclasses
import math
from pathlib import Path

import pytest

from isosweep.experiments.calibrate import (
    COLLAPSE_DROP,
    KL_MAX,
    PEAK_DROP,
    Judgement,
    PilotTrial,
    grid_batches,
    judge,
    pick,
    write_outputs,
)
from isosweep.spec.yamlio import ConfigError

SWEEP = Path(__file__).parents[2] / "sweeps" / "isocompute-easy.yaml"


def trial(values, entropy=(0.4, 0.4, 0.4), kl=(0.01, 0.01, 0.01)):
    records = [{"rollouts": 1000 * i, "eval/mean@4": v} for i, v in enumerate(values)]
    steps = [{"train/entropy": e, "train/kl": x} for e, x in zip(entropy, kl)]
    return records, steps


def test_gain_is_the_mean_of_the_last_two_evals_minus_the_base():
    verdict = judge(*trial([0.60, 0.62, 0.66, 0.70]), k=4)
    assert verdict.gain == pytest.approx(0.68 - 0.60) and verdict.healthy and verdict.problems == ""
    assert math.isnan(verdict.eval_se) and list(verdict.to_json())[:3] == ["base", "end", "gain"]


@pytest.mark.parametrize("values, entropy, kl, problem", [
    ([0.60, 0.60 - COLLAPSE_DROP - 0.01, 0.62, 0.63], None, None, "fell to"),
    ([0.60, 0.80, 0.80 - PEAK_DROP - 0.02, 0.80 - PEAK_DROP - 0.02], None, None, "below its best"),
    ([0.60, 0.62, 0.63, 0.64], (0.4, 0.05, 0.05), None, "entropy"),
    ([0.60, 0.62, 0.63, 0.64], None, (0.01, KL_MAX * 2, KL_MAX * 2), "KL"),
])
def test_each_health_rule_flags_its_failure(values, entropy, kl, problem):
    verdict = judge(*trial(values, entropy or (0.4, 0.4, 0.4), kl or (0.01, 0.01, 0.01)), k=4)
    assert not verdict.healthy and problem in verdict.problems


def test_a_dip_within_the_collapse_margin_is_healthy():
    assert judge(*trial([0.60, 0.60 - COLLAPSE_DROP / 2, 0.62, 0.63]), k=4).healthy


def rows(table, eval_se=math.nan):
    """``{lr: {batch: [(gain, healthy) per seed]}}`` as pilot trials."""
    def judged(g, h):
        return Judgement(0.6, 0.6 + g, g, eval_se, 0.6 + g, 0.4, 0.4, 0.01, h, "" if h else "fell")

    return [PilotTrial(lr, 16, b // 16, b, lr * (b / 128) ** 0.5, s, judged(g, h),
                       trial([0.6, 0.6 + g, 0.6 + g])[0])
            for lr, by_batch in table.items() for b, seeds in by_batch.items() for s, (g, h) in enumerate(seeds)]


def test_the_pick_is_the_best_worst_batch_gain_among_lrs_healthy_at_both_batches():
    table = {1e-5: {64: [(0.02, True)] * 2, 512: [(0.01, True)] * 2},
             3e-5: {64: [(0.06, True)] * 2, 512: [(0.03, True)] * 2},
             1e-4: {64: [(0.20, True)] * 2, 512: [(0.02, True)] * 2},     # better at 64, worse at 512
             3e-4: {64: [(0.30, True), (0.30, False)], 512: [(0.3, True)] * 2}}  # one unhealthy seed
    chosen, per_lr = pick(rows(table))
    assert chosen == 3e-5
    assert per_lr[1e-4].worst_gain == pytest.approx(0.02) and not per_lr[3e-4].healthy


def test_worst_batch_gains_within_their_noise_tie_and_the_larger_lr_is_picked():
    table = {4e-6: {64: [(0.015, True), (0.017, True)], 512: [(0.007, True), (0.007, True)]},
             1e-5: {64: [(0.030, True), (0.014, True)], 512: [(0.009, True), (-0.009, True)]},
             2.5e-5: {64: [(0.05, True)] * 2, 512: [(-0.04, False)] * 2}}
    chosen, per_lr = pick(rows(table))
    assert per_lr[1e-5].worst_gain == pytest.approx(0.0) and per_lr[1e-5].se == pytest.approx(0.009)
    assert per_lr[1e-5].tied and per_lr[4e-6].tied and chosen == 1e-5
    # the eval noise sets a floor under two seeds that happen to agree
    assert pick(rows(table, eval_se=0.013))[1][4e-6].se == pytest.approx(0.013 * 1.5 ** 0.5 / 2 ** 0.5)


def test_a_measurably_better_smaller_lr_wins():
    table = {4e-6: {64: [(0.04, True)] * 2, 512: [(0.03, True), (0.031, True)]},
             1e-5: {64: [(0.05, True)] * 2, 512: [(0.00, True), (0.001, True)]}}
    assert pick(rows(table))[0] == 4e-6


def test_nothing_is_picked_when_no_lr_is_healthy_everywhere():
    assert pick(rows({1e-5: {64: [(0.1, False)], 512: [(0.1, True)]}}))[0] is None


def test_the_summary_says_when_the_pick_is_at_the_edge_of_the_grid(tmp_path):
    table = {1e-5: {64: [(0.02, True)] * 2, 512: [(0.01, True)] * 2},
             3e-5: {64: [(0.06, True)] * 2, 512: [(-0.03, False)] * 2}}
    data = rows(table)
    chosen, per_lr = pick(data)
    write_outputs(tmp_path, data, chosen, per_lr, 20000, Path("easy.yaml"))
    summary = (tmp_path / "summary.md").read_text()
    assert "lr_ref = 1e-05" in summary and "smallest lr_ref tried" in summary and "Extend the grid down" in summary
    assert "| 3e-05 | +0.060 ± 0.000 (lr 2.1e-05) | -0.030 ± 0.000 ✗ (lr 6e-05) | no |" in summary
    assert (tmp_path / "pilot.csv").read_text().count("\n") == len(data) + 1 and (tmp_path / "calibration.png").exists()
    header = (tmp_path / "pilot.csv").read_text().splitlines()[0]
    judged = [f.name for f in dataclasses.fields(Judgement)]
    assert header == ",".join(["lr_ref", "Bp", "n", "batch", "lr", "seed", *judged])


def test_the_pilot_batches_are_the_smallest_and_largest_of_the_default_grid():
    (bp_small, n_small), (bp_large, n_large) = grid_batches(SWEEP)
    assert bp_small * n_small < bp_large * n_large
    assert grid_batches(SWEEP.parent / "n-only.yaml") == [(16, 2), (16, 32)]


def test_a_grid_of_one_batch_is_refused_naming_the_file_before_any_folder_is_made(tmp_path, capsys):
    from isosweep.cli import main

    fixed = SWEEP.parent / "fixed-batch.yaml"
    with pytest.raises(ConfigError) as err:
        grid_batches(fixed)
    assert str(fixed) in str(err.value) and "Bp*n = 128" in str(err.value)
    assert main(["calibrate", "--sweep", str(fixed), "--out", str(tmp_path / "pilot")]) == 2
    assert "Bp*n = 128" in capsys.readouterr().err and not (tmp_path / "pilot").exists()


def test_a_rerun_over_finished_trials_reads_them_without_starting_ray(tmp_path):
    import ray

    from isosweep.experiments.calibrate import run_pilot
    from isosweep.spec.trial import load_trial, steps
    from isosweep.trial.files import TrialDir

    trial_file = SWEEP.parent / "trials" / "easy.yaml"
    lrs, gains = (1e-5, 3e-5), {1e-5: 0.02, 3e-5: 0.05}
    for lr in lrs:
        for bp, n in grid_batches(SWEEP):
            cfg = load_trial(trial_file, ["budget=20000", f"Bp={bp}", f"n={n}", "seed=0", f"algorithm.lr_ref={lr:g}"])
            trial = TrialDir(tmp_path / "runs" / f"lr{lr:g}-Bp{bp}-n{n}-s0")
            trial.path.mkdir(parents=True)
            last = steps(cfg)
            for step, value in ((0, 0.6), (last // 2, 0.6 + gains[lr]), (last, 0.6 + gains[lr])):
                trial.append_record({"step": step, "rollouts": step * bp * n, "eval/mean@4": value})
            for step in range(1, last + 1):
                trial.append_step({"step": step, "train/entropy": 0.4, "train/kl": 0.01})
    chosen, rows = run_pilot(tmp_path, 20000, trial_file=trial_file, sweep_file=SWEEP, lrs=lrs, seeds=(0,),
                             log=lambda _: None)
    assert not ray.is_initialized()
    assert chosen == 3e-5 and len(rows) == 4 and all(r.judged.gain == pytest.approx(gains[r.lr_ref]) for r in rows)
    assert "**Pick**: lr_ref = 3e-05" in (tmp_path / "summary.md").read_text()


def test_the_cli_pilots_the_trial_and_grid_it_is_given(tmp_path):
    """``isosweep calibrate --trial T --sweep S`` pilots T at the smallest and largest batch of S's grid (here the
    hard set and its grid, whose smallest batch is Bp 16 x n 2): every trial already finished, so the run only
    reads them back and writes the summary, which names the trial file."""
    from isosweep.cli import main
    from isosweep.experiments.calibrate import LRS, SEEDS
    from isosweep.spec.trial import load_trial, steps
    from isosweep.trial.files import TrialDir

    trial_file, sweep_file = SWEEP.parent / "trials" / "hard.yaml", SWEEP.parent / "isocompute-hard.yaml"
    assert grid_batches(sweep_file) == [(16, 2), (32, 16)]
    for seed in SEEDS:
        for lr in LRS:
            for bp, n in grid_batches(sweep_file):
                cfg = load_trial(trial_file, ["budget=20000", f"Bp={bp}", f"n={n}", f"seed={seed}",
                                              f"algorithm.lr_ref={lr:g}"])
                trial = TrialDir(tmp_path / "runs" / f"lr{lr:g}-Bp{bp}-n{n}-s{seed}")
                trial.path.mkdir(parents=True)
                last = steps(cfg)
                for step, value in ((0, 0.2), (last // 2, 0.2 + lr * 1e3), (last, 0.2 + lr * 1e3)):
                    trial.append_record({"step": step, "rollouts": step * bp * n, "eval/mean@4": value})
                for step in range(1, last + 1):
                    trial.append_step({"step": step, "train/entropy": 0.4, "train/kl": 0.01})
    assert main(["calibrate", "--trial", str(trial_file), "--sweep", str(sweep_file), "--out", str(tmp_path)]) in (0, None)
    summary = (tmp_path / "summary.md").read_text()
    assert f"({trial_file}, C = 20,000 rollouts per trial)" in summary and "gain, batch 32" in summary
    assert f"**Pick**: lr_ref = {max(LRS):g}" in summary  # the gains grow with lr here, every trial healthy
