"""Dynamics-based early stopping on synthetic metric streams.

Streams are built from simple generators (geometric KL growth, a learned-then-lost reward, an
all-zero reward) so each boundary is placed where the rule's definition says it should be.
"""

from __future__ import annotations

import pytest

from isosweep.hpo.stopping import (
    DynamicsStopper,
    kl_growth,
    reward_drop,
    zero_reward,
)

STEP = 64  # rollouts per report


def stream(kl=None, reward=None):
    """Reports with rollouts = (i + 1) * STEP and the given KL / reward series."""
    n = len(kl if kl is not None else reward)
    out = []
    for i in range(n):
        report = {"rollouts": (i + 1) * STEP}
        if kl is not None:
            report["train/kl"] = kl[i]
        if reward is not None:
            report["train/reward"] = reward[i]
        out.append(report)
    return out


def healthy(n=40):
    """KL rising and saturating (growth ratios shrink to 0), reward rising and plateauing with noise."""
    kl = [0.0] + [0.02 * (1 - 0.9 ** i) for i in range(1, n)]
    reward = [min(0.8, 0.1 + 0.03 * i) + (0.01 if i % 2 else -0.01) for i in range(n)]
    return stream(kl, reward)


def test_kl_growth_fires_after_exactly_k_consecutive():
    tau1, k = 0.5, 3
    # flat KL for 5 reports, then growth by factor 1.6 (ratio 0.6 > tau1) every report
    kl = [0.01] * 5 + [0.01 * 1.6 ** j for j in range(1, 6)]
    s = stream(kl)
    # the first growing report is index 5; k growing reports end at index 5 + k - 1
    for end in range(len(s)):
        hit = kl_growth(s[:end + 1], tau1, k)
        assert (hit is not None) == (end >= 5 + k - 1), end
    hit = kl_growth(s[:5 + k], tau1, k)
    assert hit["ratios"] == pytest.approx([0.6] * k)


def test_kl_growth_k_minus_one_then_break_does_not_fire():
    tau1, k = 0.5, 3
    kl = [0.01, 0.016, 0.0256, 0.0256, 0.04096, 0.065536]  # 2 growths, a flat step, 2 growths
    s = stream(kl)
    assert all(kl_growth(s[:i + 1], tau1, k) is None for i in range(len(s)))


def test_kl_growth_ratio_exactly_tau1_does_not_fire():
    kl = [0.01 * 1.5 ** j for j in range(6)]  # ratio 0.5 == tau1 every time (within float error)
    ratios = [(b - a) / a for a, b in zip(kl, kl[1:])]
    tau1 = max(ratios)  # so no ratio is strictly above it
    assert kl_growth(stream(kl), tau1, 2) is None


def test_kl_growth_ignores_ratios_from_near_zero_kl():
    # 0 -> 1e-6 -> 1e-5 -> 1e-4: huge ratios, but all from a KL below the floor
    kl = [0.0, 1e-6, 1e-5, 5e-5, 9e-5]
    assert all(kl_growth(stream(kl)[:i + 1], 0.5, 2) is None for i in range(len(kl)))


def test_reward_drop_boundary():
    tau2 = 0.5
    # peak 0.8; (1 - tau2) * 0.8 = 0.4: exactly 0.4 is a drop of exactly tau2 and does not fire
    s = stream(reward=[0.2, 0.5, 0.8, 0.6, 0.4])
    assert all(reward_drop(s[:i + 1], tau2) is None for i in range(len(s)))
    hit = reward_drop(stream(reward=[0.2, 0.5, 0.8, 0.6, 0.4, 0.39]), tau2)
    assert hit is not None and hit["peak"] == 0.8 and hit["drop"] == pytest.approx(1 - 0.39 / 0.8)


def test_reward_drop_smoothing_window():
    # one noisy dip: fires raw, not with a 3-report trailing mean (0.8, 0.8, 0.3 -> 0.633 > 0.4)
    s = stream(reward=[0.8, 0.8, 0.8, 0.3])
    assert reward_drop(s, 0.5) is not None
    assert reward_drop(s, 0.5, window=3) is None


def test_zero_reward_grace_boundary():
    grace = 5 * STEP
    s = stream(reward=[0.0] * 8)
    fired = [zero_reward(s[:i + 1], grace) is not None for i in range(len(s))]
    # report i has rollouts (i + 1) * STEP: index 4 is the first at the grace period
    assert fired == [i >= 4 for i in range(8)]


def test_zero_reward_does_not_fire_after_any_reward():
    s = stream(reward=[0.0, 0.0, 0.05] + [0.0] * 10)
    assert zero_reward(s, 2 * STEP) is None


def test_zero_reward_eps():
    s = stream(reward=[1e-4] * 6)
    assert zero_reward(s, STEP) is None
    assert zero_reward(s, STEP, eps=1e-3) is not None


def test_healthy_stream_never_stops():
    stopper = DynamicsStopper(tau1=0.5, k=3, tau2=0.5, grace=5 * STEP)
    s = healthy()
    assert not any(stopper("t", r) for r in s)
    assert stopper.reason("t") is None and not stopper.stop_all()


@pytest.mark.parametrize("rule, s, index", [
    ("kl_growth", stream(kl=[0.01] * 4 + [0.01 * 2.0 ** j for j in range(1, 6)], reward=[0.3] * 9), 4 + 3 - 1),
    ("reward_drop", stream(kl=[0.01] * 8, reward=[0.2, 0.4, 0.6, 0.6, 0.5, 0.31, 0.29, 0.1]), 6),
    ("zero_reward", stream(kl=[0.01] * 8, reward=[0.0] * 8), 4),
])
def test_stopper_records_rule_and_calls_hook(rule, s, index):
    calls = []
    stopper = DynamicsStopper(tau1=0.5, k=3, tau2=0.5, grace=5 * STEP, on_stop=lambda t, r: calls.append((t, r)))
    decisions = [stopper("trial_a", r) for r in s]
    assert decisions == [i >= index for i in range(len(s))]
    reason = stopper.reason("trial_a")
    assert reason.rule == rule and reason.report == index
    assert reason.details["rollouts"] == (index + 1) * STEP
    assert rule in str(reason)
    assert calls == [("trial_a", reason)]  # once, even though later reports still answer True


def test_stopper_keeps_trials_apart_and_rules_can_be_disabled():
    stopper = DynamicsStopper(tau1=None, tau2=None, grace=2 * STEP)
    zero, good = stream(reward=[0.0] * 4), stream(reward=[0.0, 0.1, 0.2, 0.3])
    for a, b in zip(zero, good):
        stopper("zero", a)
        stopper("good", b)
    assert stopper.reason("zero").rule == "zero_reward" and stopper.reason("good") is None
    assert set(stopper.reasons) == {"zero"}
    # with every rule off nothing ever stops
    off = DynamicsStopper(tau1=None, tau2=None, grace=None)
    assert not any(off("x", r) for r in stream(kl=[0.01 * 3 ** j for j in range(8)], reward=[0.0] * 8))


def test_reports_without_keys_are_skipped():
    # an eval-only report (no train keys) in between does not break or trigger anything
    s = stream(reward=[0.8, 0.8])
    s.insert(1, {"rollouts": STEP, "eval/pass@1": 0.5})
    assert reward_drop(s, 0.5) is None
    assert reward_drop(s + [{"rollouts": 4 * STEP, "train/reward": 0.1}], 0.5) is not None


def test_invalid_arguments():
    with pytest.raises(ValueError):
        DynamicsStopper(k=0)
    with pytest.raises(ValueError):
        DynamicsStopper(tau2=1.5)
    with pytest.raises(ValueError):
        kl_growth(stream(kl=[0.1, 0.2]), 0.5, 0)
