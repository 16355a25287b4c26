"""The sweep's frontier analysis on synthetic sweeps whose answer is known."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace

import numpy as np
import pytest

from isosweep.report import frontier as F
from isosweep.report.analysis import analyse
from isosweep.report.render import table_text, write_outputs
from isosweep.report.schema import DecisionHoldout, read_analysis
from isosweep.track.curves import Curve, ZeroSignalCheck

BUDGET = 100_000
COMPUTE = np.concatenate([[0.0], np.unique(np.round(np.geomspace(BUDGET / 64, BUDGET, 12)))])

# Small n learns fast and plateaus low; large n starts slow and goes higher: n* grows with C
# and the crossing points are known from the curves themselves.
TRUE = {
    "n4-Bp16": dict(R0=0.50, A=0.62, C_mid=4_000.0, B=2.0),
    "n8-Bp16": dict(R0=0.50, A=0.70, C_mid=15_000.0, B=2.0),
    "n16-Bp16": dict(R0=0.50, A=0.74, C_mid=60_000.0, B=2.0),
}


def curve(key: str, noise: float, seed: int, tweak: float = 0.0) -> Curve:
    rng = np.random.default_rng(seed)
    p = TRUE[key]
    clean = np.where(COMPUTE > 0, F.sigmoid(np.maximum(COMPUTE, 1.0), **p), p["R0"])
    values = {}
    for name, shift in (("mean@4", 0.0), ("best@4", 0.2), ("worst@4", -0.3)):
        values[name] = clean + shift + tweak + rng.normal(0.0, noise, len(COMPUTE))
    n = int(key.split("-")[0][1:])
    return Curve(key=key, config=key, fields={"n": n, "Bp": 16, "M": BUDGET // (16 * n), "seed": seed},
                 compute=COMPUTE.copy(), values=values)


def true_best(C: float) -> str:
    return max(TRUE, key=lambda k: F.sigmoid(C, **TRUE[k]))


def test_noise_free_sweep_recovers_the_true_frontier_and_n_star():
    curves = [curve(key, 0.0, 0) for key in TRUE]
    result = analyse(curves, title="synthetic", study="isocompute", budget=BUDGET, primary="mean@4", points=8, bootstrap=0)
    rows = result.metrics["mean@4"].rows
    for row in rows:
        assert row.config == true_best(row.C), row
        assert row.value == pytest.approx(F.sigmoid(row.C, **TRUE[row.config]), abs=2e-3)
        assert row.n == int(row.config.split("-")[0][1:]) and row.Bp == 16
    ns = [row.n for row in rows]
    assert ns == sorted(ns) and ns[0] < ns[-1]  # n* grows with C here
    for key, fit in result.metrics["mean@4"].fits.items():
        assert fit.params["A"] == pytest.approx(TRUE[key]["A"], abs=0.01)
        assert fit.params["C_mid"] == pytest.approx(TRUE[key]["C_mid"], rel=0.1)


@pytest.mark.parametrize("seed", range(4))
def test_noisy_sweep_puts_the_true_frontier_inside_the_bootstrap_band_at_the_budget(seed):
    curves = [curve(key, 0.01, seed * 10 + i) for i, key in enumerate(TRUE)]
    result = analyse(curves, title="noisy", study="isocompute", budget=BUDGET, primary="mean@4", points=6,
                     bootstrap=100, seed=seed)
    last = result.metrics["mean@4"].rows[-1]
    truth = max(F.sigmoid(BUDGET, **p) for p in TRUE.values())
    # Deterministic (seeded noise and bootstrap). Seeds 0-3 put the truth inside the band, 0.015 at most
    # from the value, with n8 winning. Over seeds 0-59 the band held the truth in 49 (in 10 of the 11 misses
    # the band lay above it: the fit follows running-max records, which noise lifts), the value was over 0.04
    # away in 3 (up to 0.15) and n4 won at the budget in 3: the name's claim holds for these seeds only.
    assert last.low <= last.high
    assert abs(last.value - truth) < 0.04
    assert last.config in ("n8-Bp16", "n16-Bp16")  # the low-plateau config never wins at C_max


def test_seeds_of_one_config_are_pooled_into_one_fit():
    curves = [curve("n8-Bp16", 0.005, 1), curve("n8-Bp16", 0.005, 2, tweak=0.01), curve("n4-Bp16", 0.005, 3)]
    curves[1].key = "n8-Bp16-s1"
    result = analyse(curves, title="seeds", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0)
    assert set(result.configs) == {"n8-Bp16", "n4-Bp16"}
    records = result.metrics["mean@4"].records["n8-Bp16"][0]
    single = int(np.sum(curves[0].compute > 0))  # one seed's running best at each of its evaluations
    assert len(records) == 2 * single  # both seeds' points are in the fit


def test_a_config_without_enough_records_is_reported_not_fitted():
    flat = curve("n4-Bp16", 0.0, 0)
    flat.values = {name: np.full(len(COMPUTE), 0.5) - np.linspace(0, 0.01, len(COMPUTE)) for name in flat.values}
    good = curve("n8-Bp16", 0.0, 0)
    result = analyse([flat, good], title="flat", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0)
    m = result.metrics["mean@4"]
    assert "n4-Bp16" in m.unfitted and "rose above the base model fewer than twice" in m.unfitted["n4-Bp16"]
    assert {row.config for row in m.rows} == {"n8-Bp16"}
    assert "n4-Bp16      no fit" in table_text(result.saved())


def test_no_fit_at_all_still_gives_a_table_of_observed_bests():
    flat = curve("n4-Bp16", 0.0, 0)
    flat.values = {name: np.full(len(COMPUTE), 0.5) for name in flat.values}
    result = analyse([flat], title="flat", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0)
    m = result.metrics["mean@4"]
    assert not m.fits and math.isnan(m.saturation)
    assert all(row.config is None and row.observed_value == 0.5 for row in m.rows)
    assert "no config could be fitted" in table_text(result.saved())


def test_observed_best_is_the_running_max_over_configs():
    curves = [curve(key, 0.01, i) for i, key in enumerate(TRUE)]
    result = analyse(curves, title="obs", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0)
    for row in result.metrics["mean@4"].rows:
        expected = max(c.values["mean@4"][c.compute <= row.C].max() for c in curves)
        assert row.observed_value == pytest.approx(expected)


def test_outputs_are_written_and_consistent(tmp_path):
    curves = [curve(key, 0.01, i) for i, key in enumerate(TRUE)]
    result = analyse(curves, title="files", study="fixed-batch", budget=BUDGET, primary="mean@4", points=5, bootstrap=20)
    paths = write_outputs(result, tmp_path)
    assert {"frontier.csv", "fits.json", "frontier.png", "allocation.png", "fixed_batch.png", "report.html",
            "frontier.txt"} <= {p.name for p in paths.values()}
    for name in ("frontier.png", "allocation.png", "fixed_batch.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(open(tmp_path / "frontier.csv")))
    assert {r["metric"] for r in rows} == {"mean@4", "best@4", "worst@4"} and len(rows) == 15
    primary = [r for r in rows if r["metric"] == "mean@4"]
    assert [r["config"] for r in primary] == [r.config for r in result.metrics["mean@4"].rows]
    fits = json.loads((tmp_path / "fits.json").read_text())
    assert set(fits["metrics"]["mean@4"]["fits"]) == set(TRUE)
    assert fits["metrics"]["mean@4"]["fits"]["n8-Bp16"]["params"]["A"] == pytest.approx(
        result.metrics["mean@4"].fits["n8-Bp16"].params["A"])
    report = (tmp_path / "report.html").read_text()
    assert report.count("data:image/png;base64,") == 3 and "frontier of mean@4" in report


def test_saturation_is_none_while_n_star_still_changes_and_a_compute_once_it_stops():
    curves = [curve(key, 0.0, 0) for key in TRUE]
    result = analyse(curves, title="sat", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0)
    grid = np.geomspace(result.metrics["mean@4"].rows[0].C, BUDGET, 64)
    truth = [int(true_best(c).split("-")[0][1:]) for c in grid]
    # the true saturation point: the first C from which the true n* stays put to the end (None: it changes at the
    # last grid point, still moving where the grid ends)
    changes = [i for i in range(1, len(truth)) if truth[i] != truth[i - 1]]
    expected = None if changes and changes[-1] == len(grid) - 1 else float(grid[changes[-1] if changes else 0])
    saturation = result.metrics["mean@4"].saturation
    assert (saturation is None) == (expected is None)
    if expected is not None:
        assert saturation == pytest.approx(expected, rel=0.15)


def test_gains_are_best_observed_minus_the_base_value():
    from isosweep.report.analysis import gains

    curves = [curve(key, 0.0, 0) for key in TRUE]
    result = analyse(curves, title="gains", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0)
    g = gains(result)
    assert g["mean@4"].base == pytest.approx(0.50)
    assert g["mean@4"].best == pytest.approx(max(c.values["mean@4"].max() for c in curves))
    assert g["worst@4"].gain == pytest.approx(g["mean@4"].gain)  # shifted copies here
    assert "gain over the base model" in table_text(result.saved())


def test_fixed_batch_rows_use_fits_and_fall_back_to_observed_values():
    from isosweep.report.render import fixed_batch_rows

    flat = curve("n4-Bp16", 0.0, 0)
    flat.values = {name: np.full(len(COMPUTE), 0.5) for name in flat.values}
    curves = [flat, curve("n8-Bp16", 0.0, 0), curve("n16-Bp16", 0.0, 0)]
    result = analyse(curves, title="fb", study="fixed-batch", budget=BUDGET, primary="mean@4", points=8, bootstrap=0)
    rows = fixed_batch_rows(result, budgets=4)
    assert len(rows) == 4 and rows[-1][0] == BUDGET and len({C for C, *_ in rows}) == 4
    for C, ns, values, fitted in rows:
        assert ns == [4, 8, 16] and fitted == [False, True, True]
        assert values[0] == 0.5
        assert values[2] == pytest.approx(result.metrics["mean@4"].fits["n16-Bp16"].predict(C))


def test_eval_noise_is_the_sampling_se_of_each_evaluation_from_its_counts():
    """The analysis states its eval set (problems x samples) and one evaluation's sampling-only standard error,
    the same number each trial logged as ``eval/sampling_se_mean@k`` (both from the per-problem counts)."""
    from isosweep.algo.estimators import summarize
    from isosweep.report.analysis import eval_noise

    rng = np.random.default_rng(3)
    rates = rng.uniform(0.1, 0.9, 40)
    tables = [(rng.random((40, 16)) < rates[:, None]).astype(int) for _ in COMPUTE]
    counted = curve("n8-Bp16", 0.0, 0)
    counted.counts, counted.samples = np.array([t.sum(axis=1) for t in tables], dtype=float), 16
    noise = eval_noise([counted, curve("n4-Bp16", 0.0, 0)])  # a trial without counts adds nothing
    per_eval = [summarize(t, 4)["sampling_se_mean@4"] for t in tables]
    assert (noise.problems, noise.samples) == (40, 16) and noise.evaluations == len(tables)
    assert noise.se_median == pytest.approx(float(np.median(per_eval)))
    assert noise.se_max == pytest.approx(max(per_eval))
    assert eval_noise([curve("n4-Bp16", 0.0, 0)]) is None
    result = analyse([counted], title="noise", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0)
    assert "eval: 40 fixed problems x 16 samples" in table_text(result.saved())
    assert result.to_json()["eval"] == noise.to_json()


def test_each_configs_holdout_is_the_frontiers_own_fit_on_the_first_quarter_and_agrees_with_the_decision_line():
    """The per-config hold-out column refits what the frontier fits (each seed's running best, R0 fixed to the
    measured base value) on C <= C_max/4 and scores it against the seeds' mean at C_max, so the config the decision
    hold-out names shows the same predicted value in the column. (It once refitted with R0 free and scored against
    the best seed: on long-easy-bp64 the column said 0.854 for n2-Bp64 where the decision line said 0.885.)"""
    curves = [curve(key, 0.01, 7 + i + 10 * seed) for seed in (0, 1) for i, key in enumerate(TRUE)]
    for c in curves[len(TRUE):]:
        c.key, c.fields["seed"] = f"{c.key}-s1", 1
    base = float(np.mean([c.values["mean@4"][0] for c in curves]))
    m = analyse(curves, title="h", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0).metrics["mean@4"]
    assert m.base == pytest.approx(base)
    for key in TRUE:
        mine = [c for c in curves if c.config == key]
        best = [np.maximum.accumulate(c.values["mean@4"]) for c in mine]
        window = (COMPUTE > 0) & (COMPUTE <= BUDGET / 4)
        c = np.concatenate([COMPUTE[window]] * len(mine))
        v = np.concatenate([b[window] for b in best])
        reference = F.fit_sigmoid(c, v, R0=base).predict(BUDGET)
        h = m.holdout[key]
        assert h.predicted == pytest.approx(reference, abs=1e-6)
        assert h.observed == pytest.approx(np.mean([b[-1] for b in best]))
        assert h.abs_error == pytest.approx(abs(h.predicted - h.observed))
    d = m.decision
    assert d.predicted_value == m.holdout[d.predicted_config].predicted
    assert d.predicted_config == max(m.holdout, key=lambda k: m.holdout[k].predicted)


def test_the_frontier_text_reads_a_decision_holdout_as_the_study_report_does(tmp_path):
    """The sweep's own text and the study report judge a decision hold-out by one rule
    (``analysis.holdout_outcome``): a pick within noise of the observed best at C_max is a miss (or a hit)
    against a tie that decides nothing, not a plain miss."""
    from isosweep.report import analysis as A
    from isosweep.report import studies as S

    result = analyse([curve(key, 0.0, 0) for key in TRUE], title="t", study="isocompute", budget=BUDGET,
                     primary="mean@4", bootstrap=0)
    m = result.metrics["mean@4"]
    last = m.rows[-1]
    other = next(key for key in TRUE if key != last.config)
    cases = [(other, False, None, "-> miss, value error"),
             (other, True, other, "-> a miss against a tie: the predicted config is within noise"),
             (last.config, True, other, "-> a hit against a tie: the observed best at C_max is within noise"),
             (last.config, False, other, "-> hit, value error")]
    for i, (predicted, tie, runner_up, words) in enumerate(cases):
        m.rows[-1] = replace(last, tie=tie, runner_up=runner_up)
        result.metrics["mean@4"] = m = replace(m, decision=DecisionHoldout(
            float(BUDGET), BUDGET / 4, predicted, last.config, predicted == last.config, 0.7, 0.69, 0.01))
        line = next(x for x in table_text(result.saved(), "mean@4").splitlines() if x.startswith("decision hold-out"))
        assert words in line, line
        write_outputs(result, tmp_path / str(i))
        study = S.Study(str(i), read_analysis(tmp_path / str(i) / "fits.json"))
        outcome = S.holdout_outcome(study, "mean@4", study.primary.decision_holdout)
        assert outcome == A.holdout_outcome(m.rows, result.configs, m.decision)
        assert A.holdout_words(outcome, m.decision.hit) in line


def checked(checks: list[tuple[float, float, float] | None]) -> list[Curve]:
    """One curve per ``(observed, expected, sd)`` step-0 zero-signal check (None: a trial without it), over the
    configs of ``TRUE`` in turn, each a seed of its own."""
    curves = []
    for i, check in enumerate(checks):
        key = list(TRUE)[i % len(TRUE)]
        c = curve(key, 0.0, i)
        c.key = f"{key}-s{i}"
        c.zero_signal = None if check is None else ZeroSignalCheck(*check)
        curves.append(c)
    return curves


def test_the_zero_signal_check_is_pooled_into_one_z_score_over_the_trials_that_logged_it(tmp_path):
    checks = [(0.45, 0.40, 0.05), (0.30, 0.38, 0.06), (0.52, 0.41, 0.04), None]
    saved = analyse(checked(checks), title="z", study="isocompute", budget=BUDGET, primary="mean@4",
                    bootstrap=0).saved()
    # by hand: differences +0.05 - 0.08 + 0.11 = +0.08; variances 0.0025 + 0.0036 + 0.0016 = 0.0077
    z = 0.08 / math.sqrt(0.0077)
    s = saved.zero_signal
    assert (s.trials, s.flagged) == (3, False)
    assert s.observed == pytest.approx((0.45 + 0.30 + 0.52) / 3)
    assert s.expected == pytest.approx((0.40 + 0.38 + 0.41) / 3)
    assert s.z == pytest.approx(z) and s.z == pytest.approx(0.9117, abs=1e-4)
    line = next(x for x in table_text(saved).splitlines() if x.startswith("zero-signal check"))
    assert line == ("zero-signal check at step 0 (3 trials): observed 0.423 of groups without signal, the probe "
                    "predicts 0.397; z = +0.9 -> agrees")


@pytest.mark.parametrize("observed, sign", [(0.9, "+"), (0.1, "-")])
def test_a_planted_disagreement_is_flagged_in_the_analysis_its_file_and_its_text(tmp_path, observed, sign):
    saved = analyse(checked([(observed, 0.5, 0.05)] * 3), title="bad", study="isocompute", budget=BUDGET,
                    primary="mean@4", bootstrap=0).saved()
    s = saved.zero_signal
    assert s.flagged and s.z == pytest.approx((observed - 0.5) * 3 / math.sqrt(3 * 0.05 ** 2))  # |z| ~ 13.9
    line = next(x for x in table_text(saved).splitlines() if x.startswith("zero-signal check"))
    assert f"; z = {sign}13.9 -> DISAGREES beyond noise: check the reward, the sampler and the grouping" in line
    # the summary survives the file, and is the only key the check adds to it
    path = tmp_path / "fits.json"
    path.write_text(saved.dumps())
    assert read_analysis(path).zero_signal == s and read_analysis(path).dumps() == path.read_text()  # NaN != NaN
    plain = analyse(checked([None] * 3), title="bad", study="isocompute", budget=BUDGET, primary="mean@4",
                    bootstrap=0).saved()
    assert set(saved.to_json()) - set(plain.to_json()) == {"zero_signal"}


def test_a_disagreement_inside_the_noise_is_not_flagged_and_no_check_means_no_summary():
    # 3 trials each 0.05 above with sd 0.05: z = 0.15 / sqrt(0.0075) = 1.73, inside the threshold
    saved = analyse(checked([(0.55, 0.5, 0.05)] * 3), title="ok", study="isocompute", budget=BUDGET,
                    primary="mean@4", bootstrap=0).saved()
    assert not saved.zero_signal.flagged and saved.zero_signal.z == pytest.approx(0.15 / math.sqrt(0.0075))
    plain = analyse(checked([None] * 3), title="old", study="isocompute", budget=BUDGET, primary="mean@4",
                    bootstrap=0).saved()
    assert plain.zero_signal is None and "zero_signal" not in plain.to_json()
    assert "zero-signal" not in table_text(plain)


def test_with_no_noise_to_measure_against_any_difference_is_flagged():
    from isosweep.report.analysis import zero_signal_summary

    same = zero_signal_summary(checked([(0.5, 0.5, 0.0)] * 2))
    assert math.isnan(same.z) and not same.flagged
    differ = zero_signal_summary(checked([(0.6, 0.5, 0.0)] * 2))
    assert math.isnan(differ.z) and differ.flagged
    assert "z = - -> DISAGREES" in table_text(replace(analyse(checked([None]), title="t", study="isocompute",
                                                              budget=BUDGET, primary="mean@4", bootstrap=0).saved(),
                                                      zero_signal=differ))


def test_the_frontier_plot_marks_where_a_stopped_curve_was_cut(tmp_path, monkeypatch):
    # a curve that ends below its trial's M * Bp * n (an adaptive sweep stopped it) gets a cross at its end, once
    # in the legend; a full sweep's plot has none
    from isosweep.report import render

    full = [curve(key, 0.01, i) for i, key in enumerate(TRUE)]
    cut = [replace(c, compute=c.compute[:6], values={k: v[:6] for k, v in c.values.items()})
           if c.key == "n16-Bp16" else c for c in full]
    assert render.full_compute(cut[2]) > cut[2].compute[-1] and render.full_compute(cut[0]) <= full[0].compute[-1]
    crosses: list[dict] = []
    real_scatter = render.pyplot().Axes.scatter

    def scatter(ax, *args, **kw):
        if kw.get("marker") == "x":
            crosses.append(kw)
        return real_scatter(ax, *args, **kw)

    monkeypatch.setattr(render.pyplot().Axes, "scatter", scatter)
    for curves in (full, cut):
        result = analyse(curves, title="cut", study="isocompute", budget=BUDGET, primary="mean@4", points=5,
                         bootstrap=10)
        assert render.plot_frontier(result)[:8] == b"\x89PNG\r\n\x1a\n"
        if curves is full:
            assert crosses == []
    assert len(crosses) == 3  # one per metric panel
    assert [c["label"] for c in crosses] == ["stopped early (where its curve was cut)"] * 3
