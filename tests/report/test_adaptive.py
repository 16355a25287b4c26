"""Adaptive-sweep stopping rules on synthetic studies whose truth is known, and their replay's accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from isosweep.experiments.stats_validation import BUDGET, synthetic_sweep, true_value
from isosweep.report import adaptive as AD
from isosweep.report.analysis import analyse

# "late" is last at small C and first at C_max; "early" leads below C ~ 3e4; "low" is below both everywhere.
CROSSING = {
    "n4-Bp16": dict(R0=0.45, A=0.62, C_mid=3_000.0, B=2.0),   # early
    "n16-Bp16": dict(R0=0.45, A=0.80, C_mid=60_000.0, B=2.0),  # late
    "n8-Bp16": dict(R0=0.45, A=0.50, C_mid=3_000.0, B=2.0),   # low
}


def saved_of(curves):
    return analyse(curves, title="synthetic-100k-abc", study="isocompute", budget=BUDGET, primary="mean@4",
                   points=6, bootstrap=20, difficulty="easy").saved()


def test_the_truth_crosses_as_the_test_needs():
    offsets = np.zeros(8)
    value = {key: lambda C, p=p: float(true_value(p, C, offsets)[0]) for key, p in CROSSING.items()}
    assert value["n16-Bp16"](BUDGET / 16) < value["n8-Bp16"](BUDGET / 16) < value["n4-Bp16"](BUDGET / 16)
    assert value["n16-Bp16"](BUDGET) > value["n4-Bp16"](BUDGET) > value["n8-Bp16"](BUDGET)


@pytest.mark.parametrize("seed", range(3))
def test_the_frontier_rule_keeps_a_config_that_is_last_early_and_first_at_c_max(seed):
    curves, _ = synthetic_sweep(CROSSING, np.random.default_rng(seed))
    stops = AD.decide(curves, "mean@4", BUDGET, "frontier", AD.Rule(bootstrap=40, seed=seed))
    assert "n16-Bp16" not in {s.config for s in stops}
    assert all(s.C < BUDGET and "band stays below" in s.reason for s in stops)
    # ranking at a rung (successive halving) stops it: what keeping the whole frontier is for
    asha = AD.decide(curves, "mean@4", BUDGET, "asha", AD.Rule(bootstrap=40, seed=seed))
    assert "n16-Bp16" in {s.config for s in asha}


def test_the_decision_says_which_bands_it_compared_and_why_it_stopped_nothing():
    curves, _ = synthetic_sweep(CROSSING, np.random.default_rng(0))
    keys = list(CROSSING)
    for C in (BUDGET / 64, BUDGET / 4):
        d = AD.frontier_decision(curves, "mean@4", keys, C, BUDGET, AD.Rule(bootstrap=40))
        assert {s.config for s in d.stops} <= set(d.compared) <= set(keys) and d.running == tuple(keys)
        assert d.stops == tuple(AD.frontier_stops(curves, "mean@4", keys, C, BUDGET, AD.Rule(bootstrap=40)))
        assert bool(d.why_none()) == (not d.stops)
    # the late configuration is flat at C_max/64: no band of it to compare
    assert "n16-Bp16" not in AD.frontier_decision(curves, "mean@4", keys, BUDGET / 64, BUDGET,
                                                  AD.Rule(bootstrap=40)).compared
    few = AD.FrontierDecision(1562.5, (), ("n4-Bp16",), tuple(keys)).why_none()
    assert "1 of 3 configurations have a fit that is identified" in few and "C = 1,562" in few
    overlap = AD.FrontierDecision(6250.0, (), ("n4-Bp16", "n8-Bp16"), tuple(keys)).why_none()
    assert "bands of the 2 of 3 configurations it could compare overlap" in overlap
    assert AD.FrontierDecision(6250.0, (AD.Stop("n8-Bp16", 6250.0, "x"),), ("n4-Bp16", "n8-Bp16"),
                               tuple(keys)).why_none() == ""


def test_without_its_guard_the_frontier_rule_stops_a_late_starter_on_its_flat_start():
    """What the guard is for: at C_max/16 the late configuration is still flat, its fit a flat line with a narrow
    band, and the unguarded rule takes that band for its plateau."""
    stopped = []
    for seed in range(3):
        curves, _ = synthetic_sweep(CROSSING, np.random.default_rng(seed))
        stops = AD.decide(curves, "mean@4", BUDGET, "frontier", AD.Rule(bootstrap=40, seed=seed, guard=False))
        stopped += [s for s in stops if s.config == "n16-Bp16"]
    assert stopped and all(s.C <= BUDGET / 16 for s in stopped)


def test_a_config_below_the_others_everywhere_is_stopped_once_its_band_says_so():
    stopped = []
    for seed in range(3):
        curves, _ = synthetic_sweep(CROSSING, np.random.default_rng(seed))
        stops = AD.decide(curves, "mean@4", BUDGET, "frontier", AD.Rule(confidence=0.8, bootstrap=40, seed=seed))
        stopped.append({s.config for s in stops})
    assert all("n16-Bp16" not in s for s in stopped)
    assert any("n8-Bp16" in s for s in stopped), stopped


def test_the_replay_counts_each_trials_compute_to_its_stop_and_scores_the_frontier_it_leaves():
    curves, _ = synthetic_sweep(CROSSING, np.random.default_rng(1))
    saved = saved_of(curves)
    full = AD.replay(saved, curves, "full")
    assert full.share == 1.0 and full.holds and not full.stops and not full.winners_stopped
    asha = AD.replay(saved, curves, "asha", AD.Rule(bootstrap=20))
    at = {s.config: s.C for s in asha.stops}
    assert asha.compute == pytest.approx(sum(min(at.get(c.config, BUDGET), BUDGET) for c in curves))
    assert asha.full_compute == pytest.approx(len(curves) * BUDGET) and asha.share < 1.0
    # the late winner cut early: the frontier at C_max is no longer its, and the replay says so
    assert "n16-Bp16" in asha.winners_stopped and not asha.holds
    assert asha.rows[-1].full_n == 16 and 16 not in asha.rows[-1].n_range
    assert len(asha.rows) == len(saved.metrics["mean@4"].frontier)
    assert asha.se == pytest.approx(saved.eval.se_median)


@pytest.mark.parametrize("seed", range(2))
def test_hindsight_stops_each_config_at_the_rung_after_its_last_win_and_never_a_winner_early(seed):
    curves, _ = synthetic_sweep(CROSSING, np.random.default_rng(seed))
    saved = saved_of(curves)
    full = AD.replay(saved, curves, "full")
    rule = AD.Rule(bootstrap=20)
    bound = AD.replay(saved, curves, "hindsight", rule)
    rows = AD._analyse(saved, curves).metrics["mean@4"].rows
    last = {}
    for r in rows:
        last[r.config] = max(last.get(r.config, 0.0), r.C)
    at = {s.config: s.C for s in bound.stops}
    for key in CROSSING:  # a slow loop over the rungs, against the bound's own
        expected = next((f * BUDGET for f in rule.rungs if f * BUDGET >= last.get(key, 0.0)), None)
        assert at.get(key) == (pytest.approx(expected) if expected else None), (key, last)
    assert not bound.winners_stopped and bound.share < full.share == 1.0
    assert "n16-Bp16" not in at  # the late winner runs to C_max
    assert bound.compute <= min(r.compute for r in (full, AD.replay(saved, curves, "frontier", rule))
                                if not r.winners_stopped)
    keep = AD.replay(saved, curves, "hindsight-keep", rule)  # winners run whole, the others stop at the first rung
    assert {s.config: s.C for s in keep.stops} == {k: pytest.approx(rule.rungs[0] * BUDGET) for k in CROSSING
                                                  if k not in last}
    assert bound.compute <= keep.compute < full.compute and not keep.winners_stopped


def test_hyperband_and_successive_halving_keep_the_top_share_of_each_rung():
    curves, _ = synthetic_sweep({f"n{n}-Bp16": dict(R0=0.45, A=0.5 + 0.02 * i, C_mid=5_000.0, B=2.0)
                                 for i, n in enumerate((2, 4, 8, 16, 32, 64, 128, 256))}, np.random.default_rng(0))
    rule = AD.Rule(bootstrap=10)
    assert rule.eta == pytest.approx(4.0)
    first = AD.halving_stops(curves, "mean@4", sorted({c.config for c in curves}), BUDGET / 64, rule.eta)
    assert len(first) == 8 - math.ceil(8 / 4)
    hb = AD.decide(curves, "mean@4", BUDGET, "hyperband", rule)
    brackets = {s.reason.split(":")[0] for s in hb}
    assert brackets <= {f"hyperband bracket {b}" for b in range(len(rule.rungs))} and hb


def test_bad_rules_and_methods_are_refused():
    with pytest.raises(ValueError, match="rungs"):
        AD.Rule(rungs=(0.5, 0.25))
    with pytest.raises(ValueError, match="confidence"):
        AD.Rule(confidence=1.0)
    curves, _ = synthetic_sweep(CROSSING, np.random.default_rng(0), seeds=1)
    with pytest.raises(ValueError, match="method 'median'"):
        AD.decide(curves, "mean@4", BUDGET, "median")
    for bound in AD.BOUNDS:
        with pytest.raises(ValueError, match="the replay only"):
            AD.decide(curves, "mean@4", BUDGET, bound)


def test_the_command_refuses_a_folder_that_is_not_a_study(tmp_path, capsys):
    from isosweep.cli import main

    for argv, words in ((["nope"], "no study folder ['nope']"), (["--methods", "bogus"], "--methods ['bogus']"),
                        (["--rungs", "0.25", "0.0625"], "--rungs: rungs (0.25, 0.0625)")):
        assert main(["adaptive-replay", *argv, "--dashboards", str(tmp_path)]) == 2
        assert words in capsys.readouterr().err
