"""The n trend of the frontier analysis and the study report's verdicts."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from isosweep.experiments.stats_validation import BUDGET, TRUTH, synthetic_sweep, true_value
from isosweep.report import planner as P
from isosweep.report import studies as S
from isosweep.report.analysis import analyse, n_slope
from isosweep.report.render import write_outputs
from isosweep.report.schema import (
    DecisionHoldout,
    EvalNoise,
    FrontierRow,
    NTrend,
    Points,
    SavedAnalysis,
    SavedFit,
    SavedMetric,
    SchemaError,
)
from isosweep.track.curves import Curve, SweepData, ZeroSignalCheck


@pytest.mark.parametrize("seed", range(5))
def test_n_slope_is_the_mean_over_bps_of_each_bps_least_squares_slope_on_log2_n(seed):
    rng = np.random.default_rng(seed)
    configs = [{"n": n, "Bp": bp} for bp in (16, 32, 64) for n in (2, 4, 8, 16)]
    values = rng.uniform(0, 1, len(configs))
    values[rng.integers(len(values))] = np.nan  # a config without a fit
    expected = []
    for bp in (16, 32, 64):
        pts = [(math.log2(c["n"]), v) for c, v in zip(configs, values) if c["Bp"] == bp and not np.isnan(v)]
        expected.append(np.polyfit([x for x, _ in pts], [y for _, y in pts], 1)[0])
    assert n_slope(values, configs) == pytest.approx(np.mean(expected), abs=1e-12)


def test_n_slope_needs_two_n_at_one_bp():
    assert math.isnan(n_slope(np.array([0.5, 0.6]), [{"n": 2, "Bp": 64}, {"n": 4, "Bp": 32}]))


def test_the_n_trend_interval_holds_the_true_slope_of_a_synthetic_sweep():
    curves, offsets = synthetic_sweep(TRUTH, np.random.default_rng(3))
    analysis = analyse(curves, title="t", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=60)
    trend = analysis.metrics["mean@4"].trend
    assert trend.C == pytest.approx(BUDGET)
    truth = np.array([true_value(TRUTH[key], BUDGET, offsets)[0] for key in analysis.configs])
    true_slope = n_slope(truth, list(analysis.configs.values()))
    assert true_slope > 0.015  # the truth grows with n at C_max: n4 0.62, n8 0.69, n16 0.66
    assert trend.low <= true_slope <= trend.high
    assert trend.direction == "grows"


def test_equal_configs_give_no_trend():
    same = dict(R0=0.45, A=0.70, C_mid=15_000.0, B=2.0)
    curves, _ = synthetic_sweep({"n4-Bp16": same, "n8-Bp16": same, "n16-Bp16": same}, np.random.default_rng(1))
    analysis = analyse(curves, title="t", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=60)
    assert analysis.metrics["mean@4"].trend.direction == "tie"


# --------------------------------------------------------------------------------- verdicts


def _row(C, n, tie=False, p_best=0.9, n_range=None):
    return {"C": C, "config": f"n{n}-Bp16", "n": n, "Bp": 16, "tie": tie, "n_tie": tie, "runner_up": "n2-Bp16",
            "p_best": p_best, "n_range": n_range or [n]}


def saved(data: dict) -> SavedAnalysis:
    """The typed analysis of a test's partial ``fits.json`` (each part it leaves out: empty)."""
    def metric(m: dict) -> SavedMetric:
        decision = {"C_max": 0.0, "fit_window": 0.0, **m.get("decision_holdout", {})}
        return SavedMetric(
            {k: SavedFit(f["params"], {}, 0, True, 0, tuple(f.get("not_identified", []))) for k, f in
             m.get("fits", {}).items()}, {}, None,
            {k: Points(tuple(r["compute"]), tuple(r["value"])) for k, r in m.get("records", {}).items()},
            tuple(FrontierRow(**{**r, "n_range": tuple(r.get("n_range", ()))}) for r in m.get("frontier", [])),
            m.get("saturation_C"), m.get("verdict", ""), {}, DecisionHoldout(**decision), 0,
            NTrend(**{**m["n_trend"], "n": tuple(m["n_trend"]["n"])}) if m.get("n_trend") else None)

    return SavedAnalysis(data.get("title", "t"), data.get("study", "isocompute"), data.get("budget", 100_000),
                         data.get("primary", "mean@4"), data.get("difficulty", "easy"), tuple(data.get("seeds", [0, 1])),
                         data.get("trials", 10), data.get("configs", {}), {}, data.get("noise", ""),
                         EvalNoise.from_json(data.get("eval", {})),
                         {name: metric(m) for name, m in data.get("metrics", {}).items()})


def _data(folder, rows, *, study="isocompute", difficulty="easy", saturation=None, trend=None, ns=(2, 4, 8, 16, 32)):
    metric = {"frontier": rows, "verdict": "(the analysis's verdict)", "saturation_C": saturation,
              "n_trend": trend or {}}
    return {"title": folder, "study": study, "difficulty": difficulty, "budget": 100_000, "seeds": [0, 1],
            "trials": 10, "noise": "seeds and paired problems", "primary": "mean@4",
            "configs": {f"n{n}-Bp16": {"n": n, "Bp": 16} for n in ns},
            "metrics": {"mean@4": metric, "worst@4": dict(metric), "best@4": dict(metric)}}


def _study(folder, rows, testbed=S.ARITHMETIC, **kw) -> S.Study:
    return S.Study(folder, saved(_data(folder, rows, **kw)), testbed)


def _with_fits(folder: str, data: dict, fits: dict) -> S.Study:
    data["metrics"]["mean@4"]["fits"] = fits
    return S.Study(folder, saved(data))


def test_n_star_growing_between_interior_untied_winners_and_saturating_is_supported():
    rows = [_row(1e3, 4), _row(1e4, 8), _row(4e4, 8), _row(1e5, 8)]
    assert S.n_star_claim([_study("a", rows, saturation=1e4)]).verdict == S.SUPPORTED


def test_n_star_at_the_grid_edge_or_tied_decides_nothing():
    edge = [_row(1e3, 2), _row(1e5, 32)]  # grows, but only between the grid's edges
    tied = [_row(1e3, 4, tie=True), _row(1e5, 8, tie=True)]
    assert S.n_star_claim([_study("a", edge)]).verdict == S.UNRESOLVED
    assert S.n_star_claim([_study("a", tied)]).verdict == S.UNRESOLVED
    assert S.n_star_claim([]).verdict == S.UNTESTED


def test_n_star_falling_between_untied_interior_winners_contradicts():
    claim = S.n_star_claim([_study("a", [_row(1e3, 16), _row(1e5, 4)])])
    assert claim.verdict == S.CONTRADICTED and claim.needs


def test_studies_that_disagree_leave_the_claim_unresolved():
    up = _study("a", [_row(1e3, 4), _row(1e4, 8)], saturation=1e3)
    down = _study("b", [_row(1e3, 16), _row(1e5, 4)])
    assert S.n_star_claim([up, down]).verdict == S.UNRESOLVED


@pytest.mark.parametrize(("difficulty", "direction", "verdict"), [
    ("easy", "grows", S.SUPPORTED), ("hard", "falls", S.CONTRADICTED), ("easy", "tie", S.UNRESOLVED)])
def test_the_metric_claim_follows_the_trend_interval(difficulty, direction, verdict):
    trend = {"C": 1e5, "slope_per_doubling": 0.01, "low": -0.01, "high": 0.03, "direction": direction, "n": [2, 4]}
    assert S.n_metric_claim([_study("a", [], difficulty=difficulty, trend=trend)]).verdict == verdict


def test_fixed_batch_claim_needs_n_star_to_grow_untied():
    grows = _study("f", [_row(1e3, 2), _row(1e5, 16)], study="fixed-batch")
    holds = _data("f", [_row(1e3, 8), _row(1e5, 8)], study="fixed-batch")
    tied = _study("f", [_row(1e3, 2), _row(1e5, 16, tie=True)], study="fixed-batch")
    assert S.fixed_batch_claim([grows]).verdict == S.SUPPORTED
    assert S.fixed_batch_claim([tied]).verdict == S.UNRESOLVED
    # one winner at both ends contradicts only past its curve's bend (the "large C" of the claim)
    for fit, verdict in (({"not_identified": []}, S.CONTRADICTED), (None, S.UNRESOLVED),
                         ({"not_identified": ["only 60% of its fitted gain reached"]}, S.UNRESOLVED)):
        claim = S.fixed_batch_claim([_with_fits("f", holds, {"n8-Bp16": {"params": {"C_mid": 30_000.0}, **fit}}
                                                if fit else {})])
        assert claim.verdict == verdict
        assert ("n8-Bp16 leads at both ends, but its fit is not identified" in claim.evidence[0]) == (verdict == S.UNRESOLVED)
    falls = _data("f", [_row(1e3, 16), _row(1e5, 4)], study="fixed-batch")
    falls = _with_fits("f", falls, {"n4-Bp16": {"params": {"C_mid": 9_000.0}, "not_identified": []}})
    assert S.fixed_batch_claim([falls]).verdict == S.CONTRADICTED


def test_fixed_batch_evidence_names_the_n_star_sets_and_whether_the_curves_have_bent():
    tied = [_row(1e3, 2, tie=True, n_range=[2, 4]), _row(1e5, 4, tie=True, n_range=[2, 4, 16])]
    data = _data("f", tied, study="fixed-batch")
    fits = {"n2-Bp16": {"params": {"C_mid": 150_000.0}, "not_identified": ["only 40% of its fitted gain reached"]},
            "n4-Bp16": {"params": {"C_mid": 60_000.0}, "not_identified": []}}
    claim = S.fixed_batch_claim([_with_fits("f", data, fits)])
    assert claim.verdict == S.UNRESOLVED
    assert "n* 90% set {2, 4}" in claim.evidence[0] and "n* 90% set {2, 4, 16}" in claim.evidence[0]
    assert "1 of 2 mean@4 fits not identified" in claim.evidence[0]
    assert "not past their bend (n2-Bp16); the other one has bent" in claim.evidence[0]
    assert "C_mid up to 150,000" in claim.needs and "`f`" in claim.needs
    assert "1 of 2 had not (n2-Bp16)" in claim.needs and "they had not" not in claim.needs
    fits["n4-Bp16"]["not_identified"] = ["plateau A on its bound 1"]
    assert "`f`, they had not: fitted C_mid up to 150,000" in S.fixed_batch_claim([_with_fits("f", data, fits)]).needs
    bent = _with_fits("g", _data("g", [_row(1e3, 2), _row(1e5, 16)], study="fixed-batch"),
                      {"n2-Bp16": {"params": {"C_mid": 9_000.0}, "not_identified": []}})
    claim = S.fixed_batch_claim([bent])
    assert claim.verdict == S.SUPPORTED and "n* 90% set {16}" in claim.evidence[0]
    assert "Every mean@4 fit identified: the curves have bent by C = 100,000" in claim.evidence[0]


def test_the_report_rests_on_the_analyses_and_refuses_a_folder_of_the_earlier_method(tmp_path):
    """An end-to-end report from a real analysis of a synthetic sweep gives the trend claim's evidence; a folder
    of the earlier fitting method beside it stops the report with a message naming the folder and the fix."""
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(3))
    analysis = analyse(curves, title="synthetic-easy", study="isocompute", budget=BUDGET, primary="mean@4",
                       bootstrap=40, difficulty="easy")
    write_outputs(analysis, tmp_path / "synthetic-easy")
    text = S.write_report(tmp_path).read_text()
    assert (tmp_path / "REPORT.md").exists()
    trend = analysis.metrics["worst@4"].trend
    assert f"{trend.slope_per_doubling:+.4f} per doubling" in text
    assert "| as n grows at a fixed C" in text and "**supported** |" in text
    # a folder without curves.json is an arithmetic study: one testbed, one column, one sub-heading per claim
    assert "| claim | arithmetic |\n| --- | --- |\n" in text
    assert text.count("\n### arithmetic\n") == 5 and "### planted control" not in text
    assert "\n**arithmetic**\n\n- `synthetic-easy` (easy," in text
    old = tmp_path / "old-study"
    old.mkdir()
    (old / "fits.json").write_text(json.dumps({"title": "old", "study": "isocompute", "budget": 1, "primary": "mean@4",
                                               "configs": {}, "metrics": {"mean@4": {"frontier": []}}}))
    with pytest.raises(SchemaError, match=r"old-study/fits.json: analysed with the earlier fitting method.*"
                                          r"isosweep frontier <sweep-id> --dashboards"):
        S.write_report(tmp_path)


def test_a_trial_one_step_short_of_the_budget_competes_at_the_budget():
    """M = C // (Bp * n) steps end up to one step short of C: such a trial has spent its budget and
    competes at C (before, only configs landing exactly on C did, and one of them won with P(best) 1)."""
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(3))
    exact = analyse(curves, title="t", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=40)
    for curve in curves:
        if curve.config != "n4-Bp16":  # n8 (the true best) and n16 stop one step short, as real trials do
            curve.compute[-1] = BUDGET - (curve.fields["Bp"] * curve.fields["n"] - 1)
    short = analyse(curves, title="t", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=40)
    for analysis in (exact, short):
        last = analysis.metrics["mean@4"].rows[-1]
        assert last.C == BUDGET and last.config == "n8-Bp16" and last.runner_up is not None
        assert analysis.metrics["mean@4"].decision.observed_config == "n8-Bp16"
    # a trial that stopped well short of the budget does not compete there
    for curve in curves:
        if curve.config == "n8-Bp16":
            keep = curve.compute <= BUDGET / 2
            curve.compute, curve.counts = curve.compute[keep], curve.counts[keep]
            curve.values = {k: v[keep] for k, v in curve.values.items()}
    stopped = analyse(curves, title="t", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=20)
    assert stopped.metrics["mean@4"].rows[-1].config != "n8-Bp16"


# --------------------------------------------------------------------------------- testbeds


def write_params(folder: Path, params: dict | None) -> Path:
    """A study folder whose ``curves.json`` holds only ``trial_params`` (``None``: no such key)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "curves.json").write_text(json.dumps({} if params is None else {"trial_params": params}))
    return folder


@pytest.mark.parametrize(("params", "testbed"), [
    ({"task.name": "arithmetic", "model.name": "tiny-1m"}, S.ARITHMETIC),
    ({"task.name": "codes", "model.name": "tiny-1m"}, S.CODES),
    ({"task.name": "codes-nodrift", "model.name": "tiny-4m"}, S.CODES),
    ({"task.name": "codes-transfer", "model.name": "tiny-1m"}, S.CODES),
    ({"task.name": "codes", "model.name": "tabular"}, S.PLANTED),
    ({"task.name": "gsm8k", "model.name": "qwen"}, "gsm8k"),
    ({"Bp": "16"}, S.ARITHMETIC),  # settings without the task and the model
    (None, S.ARITHMETIC),  # a curves.json without trial_params
])
def test_a_studys_testbed_is_read_from_its_curves(tmp_path, params, testbed):
    assert S.read_testbed(write_params(tmp_path / "s", params)) == testbed


def test_a_study_without_curves_ran_on_arithmetic(tmp_path):
    assert S.read_testbed(tmp_path / "nothing-here") == S.ARITHMETIC
    assert S.Study("s", saved({})).testbed == S.ARITHMETIC  # built directly, as tests do


def test_testbeds_are_ordered_arithmetic_codes_other_tasks_then_the_planted_control():
    studies = [_study(f, [], testbed=t) for f, t in (("p", S.PLANTED), ("g", "gsm8k"), ("c", S.CODES))]
    assert S.testbeds(studies) == [S.ARITHMETIC, S.CODES, "gsm8k", S.PLANTED]
    assert S.testbeds([]) == [S.ARITHMETIC]  # the AIS claim is always there


def test_each_claim_is_tested_on_each_testbeds_studies_apart():
    """A falling trend on arithmetic and a growing one on codes: pooled, the two would disagree and decide
    nothing; per testbed each decides its own."""
    def trend(direction):
        return {"C": 1e5, "slope_per_doubling": 0.01, "low": -0.01, "high": 0.03, "direction": direction, "n": [2, 4]}

    down = _study("a", [_row(1e3, 16), _row(1e5, 4)], trend=trend("falls"))
    up = _study("c", [_row(1e3, 4), _row(1e4, 8)], testbed=S.CODES, saturation=1e3, trend=trend("grows"))
    assert S.n_metric_claim([down, up]).verdict == S.UNRESOLVED
    n_star, n_metric, fixed, ais, holdout = S.testbed_claims([up, down], Path("/nonexistent"))
    assert list(n_metric) == [S.ARITHMETIC, S.CODES]
    assert (n_metric[S.ARITHMETIC].verdict, n_metric[S.CODES].verdict) == (S.CONTRADICTED, S.SUPPORTED)
    assert (n_star[S.ARITHMETIC].verdict, n_star[S.CODES].verdict) == (S.CONTRADICTED, S.SUPPORTED)
    assert all("`a`" in e for e in n_star[S.ARITHMETIC].evidence) and all("`c`" in e for e in n_star[S.CODES].evidence)
    assert fixed[S.CODES].verdict == S.UNTESTED and not fixed[S.CODES].evidence
    assert list(ais) == [S.ARITHMETIC] and list(holdout) == [S.ARITHMETIC, S.CODES]
    assert S.summary_cell(ais, S.CODES) == "—"
    assert S.summary_cell(ais, S.ARITHMETIC) == "**not resolvable at this scale**"
    assert S.summary_cell(fixed, S.CODES) == "no study yet"
    assert S.summary_cell(n_metric, S.CODES) == "**supported**"


def test_the_report_has_a_column_and_a_section_per_testbed_and_plans_without_the_planted_control(tmp_path):
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(3))
    kw = dict(study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=10, difficulty="easy")
    for folder, params in (("arith", {"task.name": "arithmetic", "model.name": "tiny-1m"}),
                           ("control", {"task.name": "codes", "model.name": "tabular"})):
        write_outputs(analyse(curves, title=f"{folder}-100k-aaa", **kw), tmp_path / folder)
        P.write_sweep_data(SweepData(f"{folder}-100k-aaa", BUDGET, params, {}, curves), tmp_path / folder)
    assert {s.folder: s.testbed for s in S.load_studies(tmp_path)} == {"arith": S.ARITHMETIC, "control": S.PLANTED}
    text = S.build_report(tmp_path)
    assert "| claim | arithmetic | planted control |\n| --- | --- | --- |\n" in text and "| codes |" not in text
    assert "| FP8 rollouts with AIS match bf16 where naive FP8 loses | **not resolvable at this scale** | — |" in text
    assert text.count("\n### arithmetic\n") == 5 and text.count("\n### planted control\n") == 4
    assert "Testbeds: **arithmetic** is the tiny transformer on 2-digit addition" in text
    # the same trials on two testbeds: the same verdict, each resting on its own study
    metric = text.split("## as n grows at a fixed C")[1].split("\n## ")[0]
    arith, control = metric.split("### arithmetic")[1].split("### planted control")
    assert "`arith`" in arith and "`control`" not in arith and "`control`" in control and "`arith`" not in control
    plan = text.split("## What to run at C = 1e5, 1e6, 1e7")[1].split("\n## Studies")[0]
    assert "The planted control (`model.name: tabular`: `control-100k-aaa`) is left out" in plan
    assert "### arithmetic" in plan and "tabular" not in plan.split("is left out")[1]
    studies = text.split("\n## Studies\n")[1]
    assert studies.index("**arithmetic**") < studies.index("- `arith` (easy") < studies.index("**planted control**") \
        < studies.index("- `control` (easy")


def test_the_synthetic_holdout_line_is_shown_under_the_first_testbed_only(tmp_path):
    (tmp_path / "methods").mkdir()
    (tmp_path / "methods" / "validation.json").write_text(json.dumps({"decision_holdout_hit_rate": 0.8}))
    studies = [_study("a", []), _study("c", [], testbed=S.CODES)]
    holdout = S.testbed_claims(studies, tmp_path)[-1]
    assert holdout[S.ARITHMETIC].evidence[-1].startswith("synthetic sweeps (`methods/`")
    assert not any(e.startswith("synthetic") for e in holdout[S.CODES].evidence)


def test_the_planning_section_names_each_planned_testbeds_holdout_verdict():
    hit = S.Claim("the fitted curves predict 4x beyond their data", "t", S.SUPPORTED,
                  by_set={"easy": S.SetCount(3, 3, 3)})
    open_ = S.Claim("the fitted curves predict 4x beyond their data", "t", S.UNTESTED)
    one = S.planning_section(Path("/nonexistent"), holdouts={S.ARITHMETIC: hit})[3]
    assert one.endswith('above: **supported** (hold-outs that decide: easy 3 (3 hit)).')
    two = S.planning_section(Path("/nonexistent"), holdouts={S.ARITHMETIC: hit, S.CODES: open_})[3]
    assert two.endswith('above, per testbed: arithmetic **supported** (hold-outs that decide: easy 3 (3 hit)); '
                        'codes **not tested**.')


def test_the_report_is_also_a_standalone_html_page(tmp_path):
    text = "# Title\n\nA **bold** claim with `code` & <tags>.\n\n| a | b |\n| --- | --- |\n| 1 | **2** |\n\n- one\n  more\n- two\n"
    page = S.to_html(text)
    assert "<h1>Title</h1>" in page and "<p>A <strong>bold</strong> claim with <code>code</code> &amp; &lt;tags&gt;.</p>" in page
    assert "<thead>\n<tr>\n<th>a</th>\n<th>b</th>\n</tr>\n</thead>\n<tbody>\n<tr>\n<td>1</td>\n<td><strong>2</strong></td>" in page
    assert "<ul>\n<li>one\nmore</li>\n<li>two</li>\n</ul>" in page
    S.write_report(tmp_path)
    assert (tmp_path / "report.html").read_text().startswith("<!doctype html>")
    assert "<h1>What the studies found</h1>" in (tmp_path / "report.html").read_text()


def test_a_holdout_against_a_tie_decides_nothing_whether_it_hits_or_misses(tmp_path):
    def study(predicted, last, *, folder="s", difficulty="easy", C_max=0.0, records=None):
        data = {"primary": "mean@4", "seeds": [0, 1], "title": "t", "budget": 100, "difficulty": difficulty,
                "configs": {"n8-Bp16": {"n": 8, "Bp": 16}, "n4-Bp16": {"n": 4, "Bp": 16}, "n2-Bp16": {"n": 2, "Bp": 16},
                            "n16-Bp32": {"n": 16, "Bp": 32}},
                "metrics": {"mean@4": {"frontier": [last], "records": records or {},
                                       "decision_holdout": {"predicted_config": predicted, "observed_config": "n4-Bp16",
                                                            "hit": predicted == "n4-Bp16", "predicted_value": 0.6,
                                                            "abs_error": 0.02, "C_max": C_max}}}}
        return S.Study(folder, saved(data))

    tie = {"C": 100.0, "config": "n4-Bp16", "runner_up": "n2-Bp16", "tie": True, "n_tie": True, "n": 4, "Bp": 16,
           "n_range": [2, 4, 8]}
    clear = dict(tie, tie=False, n_tie=False, n_range=[4])
    for last, outcome in ((tie, "tie"), (clear, "hit")):  # the observed best tied with its runner-up, or clear
        s = study("n4-Bp16", last)
        assert S.holdout_outcome(s, "mean@4", s.primary.decision_holdout) == outcome
    lucky = [study("n4-Bp16", tie) for _ in range(3)]
    assert S.holdout_claim(lucky, Path("/nonexistent")).verdict == S.UNRESOLVED
    assert "a hit against a tie" in S.holdout_claim(lucky, Path("/nonexistent")).evidence[0]
    assert S.holdout_claim([study("n4-Bp16", clear) for _ in range(3)], Path("/nonexistent")).verdict == S.SUPPORTED
    for predicted, last, outcome in (("n2-Bp16", tie, "tie"), ("n8-Bp16", tie, "tie"), ("n16-Bp32", tie, "miss"),
                                     ("n8-Bp16", clear, "miss")):
        s = study(predicted, last)
        assert S.holdout_outcome(s, "mean@4", s.primary.decision_holdout) == outcome
    ties = [study("n8-Bp16", tie) for _ in range(3)]
    assert S.holdout_claim(ties, Path("/nonexistent")).verdict == S.UNRESOLVED
    misses = [study("n16-Bp32", tie) for _ in range(3)]
    contradicted = S.holdout_claim(misses, Path("/nonexistent"))
    assert contradicted.verdict == S.CONTRADICTED and not contradicted.needs
    assert contradicted.evidence[-1] == ("hold-outs that decide, by set (picks that share runs counted once): "
                                         "easy 3 (0 hit)")
    # the verdict stands, and says that it rests on one set when every hold-out on the other was a tie
    hard_ties = [study("n8-Bp16", tie, difficulty="hard") for _ in range(2)]
    one_set = S.holdout_claim([*misses, *hard_ties], Path("/nonexistent"))
    assert one_set.verdict == S.CONTRADICTED
    assert one_set.evidence[-1].endswith("easy 3 (0 hit); hard none (2 hold-outs, every one a tie)")
    assert one_set.needs.startswith("for the verdict to hold on every set: hold-outs that decide on the hard set too")
    # three misses on one set and a hit on the other: the pooled verdict stands (1 of 4), and says the sets disagree
    hard_hit = study("n4-Bp16", clear, difficulty="hard")
    split = S.holdout_claim([*misses, hard_hit], Path("/nonexistent"))
    assert split.verdict == S.CONTRADICTED
    assert split.needs.startswith("the sets disagree (easy 0 of 3 hit; hard 1 of 1 hit) and the verdict pools them: "
                                  "more hold-outs that decide on the hard set")
    # and the report's planning section, whose picks beyond the data are such fits, says so
    intro = S.planning_section(Path("/nonexistent"), holdouts=one_set)[3]
    assert intro.endswith('the claim "the fitted curves predict 4x beyond their data" above: **contradicted** '
                          "(hold-outs that decide: easy 3 (0 hit); hard none (2 hold-outs, every one a tie)).")
    mixed = S.holdout_claim([study("n4-Bp16", clear), *misses[:2]], Path("/nonexistent"))  # 1 hit in 3
    assert mixed.verdict == S.UNRESOLVED and mixed.needs.startswith("1 of 3 real decision hold-outs that decide hit")
    two = S.holdout_claim(misses[:2], Path("/nonexistent"))  # too few that decide for a verdict
    assert two.verdict == S.UNRESOLVED and two.needs.startswith("2 real decision hold-out(s) that decide (not ties) "
                                                                "so far, 0 of them hit")

    # two studies that ran the same trials of the picked config make the same pick from the same fit: one test
    def miss(i: int, C_max: float, values: list[float]) -> S.Study:
        return study("n16-Bp32", tie, folder=f"s{i}", C_max=C_max,
                     records={"n16-Bp32": {"compute": [1.0, 2.0], "value": values}})

    misses = [miss(0, 100.0, [0.5, 0.6]), miss(1, 100.0, [0.5, 0.6]), miss(2, 100.0, [0.5, 0.7])]
    once = S.holdout_claim(misses, Path("/nonexistent"))
    assert once.verdict == S.UNRESOLVED and once.needs.startswith("2 real decision hold-out(s) that decide")
    assert "the same pick as `s0`'s from the same runs (its n16-Bp32 trials" in once.evidence[1]
    assert "same pick" not in once.evidence[0] + once.evidence[2]
    misses[2] = miss(2, 400.0, [0.5, 0.6])  # another budget: without the runs on record, another test
    assert S.holdout_claim(misses[1:], Path("/nonexistent")).needs.startswith("2 real decision hold-out(s)")

    # with each folder's curves kept, the runs are known: the same trials run on to another budget and picked there
    # again are the same runs (long-easy-bp64 at 8e5 and bend-easy-bp64 at 4e5 both picked n2-Bp64), one test; the
    # same config trained with another recipe is other runs
    def keep_curves(folder: str, lr: str, seeds=(0, 1)) -> None:
        curves = [Curve(key=f"n16-Bp32-s{seed}", config="n16-Bp32", fields={"n": 16, "Bp": 32, "seed": seed},
                        compute=np.array([0.0, 1.0]), values={"mean@4": np.array([0.5, 0.6])}) for seed in seeds]
        P.write_sweep_data(SweepData(f"{folder}-x", BUDGET, {"algorithm.lr_ref": lr}, {}, curves), tmp_path / folder)

    for folder, lr in (("s0", "2.5e-05"), ("s1", "2.5e-05"), ("s2", "2.5e-05")):
        keep_curves(folder, lr)
    misses[0] = miss(0, 800.0, [0.5, 0.6])
    runs = S.holdout_claim(misses, tmp_path)
    assert runs.evidence[-1].endswith("easy 1 (0 hit)") and runs.verdict == S.UNRESOLVED
    assert "the same pick as `s0`'s from the same runs" in runs.evidence[1] + runs.evidence[2]
    keep_curves("s2", "1e-05")
    assert S.holdout_claim(misses, tmp_path).evidence[-1].endswith("easy 2 (0 hit)")
    # a pick that shares some of its runs with another (seeds pooled: 1 and 2 against 0 and 1) rests partly on the
    # same curve: one test; other seeds of the same recipe are other runs, a test of their own
    keep_curves("s2", "2.5e-05", seeds=(1, 2))
    some = S.holdout_claim(misses, tmp_path)
    assert some.evidence[-1].endswith("easy 1 (0 hit)")
    assert "the same pick as `s0`'s from the same runs (its n16-Bp32 trials, deterministic, to this or another " \
           "budget, or some of them), counted once" in some.evidence[2]
    keep_curves("s2", "2.5e-05", seeds=(2, 3))
    assert S.holdout_claim(misses, tmp_path).evidence[-1].endswith("easy 2 (0 hit)")
    # a later pick that shares runs with two tests so far apart joins them into one
    keep_curves("s1", "2.5e-05", seeds=(2, 3))
    keep_curves("s2", "2.5e-05", seeds=(1, 2))
    assert S.holdout_claim(misses[:2], tmp_path).evidence[-1].endswith("easy 2 (0 hit)")
    joined = S.holdout_claim(misses, tmp_path)
    assert "the same pick as `s0`'s" in joined.evidence[2] and "same pick" not in joined.evidence[1]
    assert joined.evidence[-1].endswith("easy 1 (0 hit)")


def test_sweeps_pooled_into_one_analysis_are_counted_once(tmp_path):
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(4))
    one = analyse([c for c in curves if c.fields["seed"] == 0], title="s-100k-aaa", study="isocompute", budget=BUDGET,
                  primary="mean@4", bootstrap=10, difficulty="easy")
    other = analyse([c for c in curves if c.fields["seed"] == 1], title="s1-100k-bbb", study="isocompute", budget=BUDGET,
                    primary="mean@4", bootstrap=10, difficulty="easy")
    pooled = analyse(curves, title="s-100k-aaa", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=10,
                     difficulty="easy")
    pooled.pooled_from = ("s-100k-aaa", "s1-100k-bbb")
    write_outputs(other, tmp_path / "s1")
    write_outputs(pooled, tmp_path / "s")  # the pooled analysis replaced the first part's own in its folder
    assert json.loads((tmp_path / "s" / "fits.json").read_text())["pooled_from"] == ["s-100k-aaa", "s1-100k-bbb"]
    assert "pooled_from" not in one.to_json()
    studies = S.load_studies(tmp_path)
    assert [s.folder for s in studies] == ["s"] and studies[0].analysis.seeds == (0, 1)
    assert "sweeps `s-100k-aaa`, `s1-100k-bbb` pooled" in studies[0].label()
    report = S.build_report(tmp_path)
    assert "sweep `s1-100k-bbb`: its trials are pooled into `s` and counted there" in report
    assert "paired across every trial\n" in report  # no curves kept: nothing said of the eval set

    # with the curves kept beside it, the study names the eval set it was scored on and where it started
    P.write_sweep_data(SweepData("s-100k-aaa", BUDGET, {}, {}, curves), tmp_path / "s")
    start = np.mean([c.values["mean@4"][0] for c in curves if c.compute[0] == 0])
    assert f"paired across every trial; eval set synthetic, base mean@4 {start:.3f} at step 0\n" in S.build_report(tmp_path)


def test_a_study_whose_trials_a_larger_one_holds_is_counted_once(tmp_path):
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(5))
    kw = dict(study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=10, difficulty="easy")
    full = analyse(curves, title="full-100k-aaa", **kw)
    keys = sorted(full.configs)[:-2]
    part = analyse([c for c in curves if c.config in keys], title="part-100k-bbb", **kw)
    write_outputs(full, tmp_path / "full")
    write_outputs(part, tmp_path / "part")
    assert [s.folder for s in S.load_studies(tmp_path)] == ["full"]
    assert "- `part`: every trial of it is also in `full`" in S.build_report(tmp_path)

    # other numbers for a shared config (another eval set, another method): a study of its own
    redrawn, _ = synthetic_sweep(TRUTH, np.random.default_rng(6))
    write_outputs(analyse([c for c in redrawn if c.config in keys], title="part-100k-bbb", **kw), tmp_path / "part")
    assert [s.folder for s in S.load_studies(tmp_path)] == ["full", "part"]
    # the same configs in both (no strict subset): neither holds the other
    write_outputs(analyse(curves, title="again-100k-ccc", **kw), tmp_path / "again")
    assert {"full", "again"} <= {s.folder for s in S.load_studies(tmp_path)}


# ------------------------------------------------------------------------------ the AIS claim on the ladder


def write_ladder(dashboards: Path, rows: list[tuple[str, str, str, float, float]]) -> None:
    folder = dashboards / "ais-ladder"
    folder.mkdir(parents=True)
    lines = ["set,arm,seed,diff,se"] + [",".join(str(x) for x in row) for row in rows]
    (folder / "vs_bf16.csv").write_text("\n".join(lines) + "\n")


def arm(name: str, seeds: tuple[float, float], se: float = 0.01) -> list[tuple]:
    """Two seeds' differences and their pooled mean, each seed with standard error ``se``."""
    return [("easy", name, 0, seeds[0], se), ("easy", name, 1, seeds[1], se),
            ("easy", name, "all", sum(seeds) / 2, math.sqrt(2 * se ** 2) / 2)]


def test_ais_is_judged_at_the_mildest_precision_where_naive_training_loses(tmp_path):
    # int4 loses in the pooled mean but not in both seeds; int3 loses in both: the test is at int3
    write_ladder(tmp_path, arm("int4", (-0.05, 0.004)) + arm("int3", (-0.06, -0.05)) + arm("int2", (-0.3, -0.3))
                 + arm("int3+ais", (-0.005, 0.002)))
    claim = S.ais_claim(tmp_path)
    assert claim.verdict == S.SUPPORTED
    assert "naive training first loses at int3" in claim.evidence[-1] and "AIS matches bf16" in claim.evidence[-1]


def test_ais_that_loses_too_contradicts_and_no_loss_leaves_it_open(tmp_path):
    write_ladder(tmp_path / "a", arm("int3", (-0.06, -0.05)) + arm("int3+ais", (-0.04, -0.05)))
    assert S.ais_claim(tmp_path / "a").verdict == S.CONTRADICTED
    # AIS between a tie and a loss (-1.4 se pooled, negative in one seed only): nothing shown either way
    write_ladder(tmp_path / "d", arm("int4", (-0.03, -0.03)) + arm("int4+ais", (-0.02, 0.0)) + arm("int4+tis", (0.0, 0.0)))
    claim = S.ais_claim(tmp_path / "d")
    assert claim.verdict == S.UNRESOLVED and "more seeds would decide" in claim.evidence[-1]
    assert "int4+tis - bf16 = +0.000" in claim.evidence[-1]
    write_ladder(tmp_path / "b", arm("int4", (-0.01, 0.01)) + arm("int3", (0.0, -0.005)))
    claim = S.ais_claim(tmp_path / "b")
    assert claim.verdict == S.UNRESOLVED and "loses to bf16 at no precision" in claim.evidence[-1]
    write_ladder(tmp_path / "c", arm("int3", (-0.06, -0.05)))  # the loss found, no AIS arm yet
    claim = S.ais_claim(tmp_path / "c")
    assert claim.verdict == S.UNRESOLVED and "no int3+ais arm yet" in claim.evidence[-1] and claim.needs
    claim = S.ais_claim(tmp_path / "none")
    assert claim.verdict == S.UNRESOLVED and "ais-ladder" in claim.needs


def test_a_verdict_decided_on_one_set_says_so_and_what_the_other_set_needs(tmp_path):
    # easy: AIS between a tie and a loss; hard: naive loses at int3, AIS ties there
    hard = [("hard",) + row[1:] for row in arm("int3", (-0.06, -0.05)) + arm("int3+ais", (-0.005, 0.002))]
    write_ladder(tmp_path, arm("int4", (-0.03, -0.03)) + arm("int4+ais", (-0.02, 0.0)) + hard)
    claim = S.ais_claim(tmp_path)
    assert claim.verdict == S.SUPPORTED
    assert claim.evidence[-1] == "the verdict rests on the hard set alone: the easy set decides nothing yet"
    assert "more seeds on the easy set" in claim.needs
    # both sets decided and agreeing: nothing left open, nothing asked for
    write_ladder(tmp_path / "b", arm("int3", (-0.06, -0.05)) + arm("int3+ais", (0.0, 0.0)) + hard)
    claim = S.ais_claim(tmp_path / "b")
    assert claim.verdict == S.SUPPORTED and not claim.needs and "rests on" not in claim.evidence[-1]


@pytest.mark.parametrize("seed", range(3))
def test_paired_differences_to_bf16_match_a_loop_over_problems(seed):
    from isosweep.experiments.ais_study import ArmRun, ArmSummary, paired_vs_bf16

    rng = np.random.default_rng(seed)
    samples, problems = 8, 40
    rows = []
    for s in (0, 1):
        for name in ("bf16", "int3", "int3+ais"):
            counts = rng.integers(0, samples + 1, problems).tolist()
            rows.append(ArmRun("easy", name, s, ArmSummary(*[math.nan] * 7),
                               [{"eval_correct": counts, "eval_samples": samples}]))
    found = {(d.arm, d.seed): d for d in paired_vs_bf16(rows)}
    assert set(found) == {(a, s) for a in ("int3", "int3+ais") for s in (0, 1, "all")}
    for name in ("int3", "int3+ais"):
        per_seed = []
        for s in (0, 1):
            a = next(r for r in rows if r.arm == name and r.seed == s).records[-1]["eval_correct"]
            b = next(r for r in rows if r.arm == "bf16" and r.seed == s).records[-1]["eval_correct"]
            d = np.array(a, float) / samples - np.array(b, float) / samples
            se = d.std(ddof=1) / math.sqrt(problems)
            assert found[(name, s)].diff == pytest.approx(d.mean(), abs=1e-12)
            assert found[(name, s)].se == pytest.approx(se, abs=1e-12)
            per_seed.append((d.mean(), se))
        assert found[(name, "all")].diff == pytest.approx(np.mean([m for m, _ in per_seed]), abs=1e-12)
        assert found[(name, "all")].se == pytest.approx(math.hypot(*[e for _, e in per_seed]) / 2, abs=1e-12)


def test_a_study_extended_by_new_seeds_keeps_and_pools_the_earlier_seeds(tmp_path):
    """Seeds 0 and 1 written by one run, seed 2 by a later one into the same folder (the run directories of
    the first gone): the tables hold all three and the pooled row is the one a single run of all three gives."""
    from isosweep.experiments.ais_study import ArmRun, ArmSummary, paired_vs_bf16, write_outputs

    rng = np.random.default_rng(7)
    samples, problems = 8, 30

    def row(name, s):
        counts = rng.integers(0, samples + 1, problems).tolist()
        records = [{"rollouts": 0, "eval/mean@4": 0.5, "eval_correct": counts, "eval_samples": samples}]
        steps = [{"step": 1, "rollouts": 128, "ais/alpha": 0.4, "mismatch/logp_abs_diff_mean": 0.01}]
        summary = ArmSummary(0.5, float(np.mean(counts)) / samples, 0.5, 0.01, 1.0, 0.4, 0.4)
        return ArmRun("easy", name, s, summary, records, steps)

    rows = [row(name, s) for s in (0, 1, 2) for name in ("bf16", "int4", "int4+ais")]
    write_outputs(tmp_path, rows[:6])
    write_outputs(tmp_path, rows[6:])
    found = {(r["arm"], r["seed"]): (float(r["diff"]), float(r["se"]))
             for r in csv.DictReader((tmp_path / "vs_bf16.csv").open())}
    expected = {(d.arm, str(d.seed)): (d.diff, d.se) for d in paired_vs_bf16(rows)}
    assert set(found) == set(expected) and len(found) == 2 * 4
    for key, (diff, se) in expected.items():
        assert found[key] == pytest.approx((diff, se), abs=1e-12)
    table = list(csv.DictReader((tmp_path / "table.csv").open()))
    assert sorted((r["arm"], r["seed"]) for r in table) == sorted((r.arm, str(r.seed)) for r in rows)
    alpha = list(csv.DictReader((tmp_path / "alpha.csv").open()))
    assert len(alpha) == len(rows)
    write_outputs(tmp_path, rows[6:])  # a rerun of seed 2 replaces its rows, never doubles them
    assert len(list(csv.DictReader((tmp_path / "table.csv").open()))) == len(rows)


def test_a_study_label_names_its_eval_set_and_one_evaluations_noise():
    data = {"budget": BUDGET, "configs": {"n4-Bp16": {}}, "seeds": [0, 1], "difficulty": "easy",
            "eval": {"problems": 470, "samples": 16, "sampling_se_mean": {"median": 0.0047, "max": 0.005, "evaluations": 9}}}
    assert "eval 470 problems x 16 samples, one evaluation's sampling se 0.0047)" in S.Study("s", saved(data)).label()
    assert "eval" not in S.Study("s", saved({k: v for k, v in data.items() if k != "eval"})).label()


def test_the_study_list_warns_of_a_zero_signal_check_that_disagrees_and_only_then(tmp_path):
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(7))
    kw = dict(study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=10, difficulty="easy")
    for folder, check in (("agrees", ZeroSignalCheck(0.42, 0.40, 0.05)), ("broken", ZeroSignalCheck(0.9, 0.5, 0.05)),
                          ("before", None)):
        for c in curves:
            c.zero_signal = check
        write_outputs(analyse(curves, title=f"{folder}-100k-aaa", **kw), tmp_path / folder)
    studies = {s.folder: s for s in S.load_studies(tmp_path)}
    assert set(studies) == {"agrees", "broken", "before"}
    assert studies["agrees"].zero_signal_warning() is None and studies["before"].zero_signal_warning() is None
    report = S.build_report(tmp_path).splitlines()
    warnings = [i for i, line in enumerate(report) if "zero-signal check" in line]
    assert len(warnings) == 1 and report[warnings[0] - 1].startswith("- `broken`")
    z = 0.4 * len(curves) / (0.05 * math.sqrt(len(curves)))
    assert report[warnings[0]] == (f"  - **zero-signal check at step 0 disagrees beyond noise** (z = {z:+.1f} over "
                                   f"{len(curves)} trials): 0.900 of groups without signal observed, the probe "
                                   "predicts 0.500; check the reward, the sampler and the grouping before reading its "
                                   "numbers")
