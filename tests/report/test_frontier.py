"""Tests for isosweep.frontier: loop references, properties over seeds, parameter recovery.

Everything runs in float64 (the module converts its inputs to float64).
"""

from __future__ import annotations

import dataclasses
import math

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings
from scipy.optimize import brentq

from isosweep.report.frontier import (
    PARAM_NAMES,
    SigmoidFit,
    fit_sigmoid,
    frontier,
    holdout_check,
    optimal_allocation,
    record_points,
    saturation_point,
    sigmoid,
)

TRUE = {"R0": 0.2, "A": 0.75, "C_mid": 3e3, "B": 1.5}
COMPUTE = np.logspace(2, 5, 40)  # rollouts


def slow_records(compute: list[float], value: list[float]) -> tuple[list[float], list[float]]:
    """Records by the definition: walk the points in (compute, given order) and keep new bests."""
    order = sorted(range(len(compute)), key=lambda i: (compute[i], i))
    best, kept_c, kept_v = -math.inf, [], []
    for i in order:
        if value[i] > best:
            best = value[i]
            kept_c.append(compute[i])
            kept_v.append(value[i])
    return kept_c, kept_v


def noisy_curve(seed: int, outliers: int = 2) -> np.ndarray:
    """``TRUE`` at ``COMPUTE`` plus N(0, 0.01) noise, with ``outliers`` points dropped by 0.3
    in the upper half (an eval that broke), where they pull a least-squares asymptote down."""
    rng = np.random.default_rng(seed)
    value = sigmoid(COMPUTE, **TRUE) + rng.normal(0.0, 0.01, COMPUTE.size)
    value[rng.choice(np.arange(20, 40), outliers, replace=False)] -= 0.3
    return value


def known_fit(**params: float) -> SigmoidFit:
    """A fit with given parameters and no bootstrap refits."""
    return SigmoidFit(params=dict(params), n=0, success=True)


# --- record_points ----------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(60))
def test_records_match_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(0, 30))
    # Integer compute and values so that ties in both occur often.
    compute = rng.integers(1, 10, size).astype(float)
    value = rng.integers(0, 6, size).astype(float) if seed % 2 else rng.normal(size=size)
    c, v = record_points(compute, value)
    ref_c, ref_v = slow_records(list(compute), list(value))
    np.testing.assert_array_equal(c, ref_c)
    np.testing.assert_array_equal(v, ref_v)
    assert c.dtype == v.dtype == np.float64


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.floats(-5, 5, allow_nan=False)), max_size=40))
def test_record_properties(points: list[tuple[int, float]]) -> None:
    compute = [p[0] for p in points]
    value = [p[1] for p in points]
    c, v = record_points(compute, value)
    ref_c, ref_v = slow_records(compute, value)
    assert list(c) == ref_c and list(v) == ref_v
    assert np.all(np.diff(v) > 0)
    assert np.all(np.diff(c) >= 0)
    if points:
        assert v[-1] == max(value)
        first = min(range(len(points)), key=lambda i: (compute[i], i))
        assert (c[0], v[0]) == (compute[first], value[first])
    c2, v2 = record_points(c, v)
    np.testing.assert_array_equal(c2, c)
    np.testing.assert_array_equal(v2, v)


@pytest.mark.parametrize("seed", range(20))
def test_records_invariant_to_order_shift_and_scale(seed: int) -> None:
    rng = np.random.default_rng(seed)
    compute = rng.permutation(np.arange(1.0, 26.0))  # distinct, so order of input is irrelevant
    value = rng.normal(size=25)
    c, v = record_points(compute, value)
    perm = rng.permutation(25)
    c_perm, v_perm = record_points(compute[perm], value[perm])
    np.testing.assert_array_equal(c_perm, c)
    np.testing.assert_array_equal(v_perm, v)
    c_aff, v_aff = record_points(3.0 * compute, 2.0 * value + 7.0)
    np.testing.assert_array_equal(c_aff, 3.0 * c)
    np.testing.assert_allclose(v_aff, 2.0 * v + 7.0, rtol=1e-15)


def test_records_tie_in_compute_keeps_given_order() -> None:
    c, v = record_points([2.0, 1.0, 1.0, 1.0], [0.9, 0.3, 0.5, 0.4])
    np.testing.assert_array_equal(c, [1.0, 1.0, 2.0])
    np.testing.assert_array_equal(v, [0.3, 0.5, 0.9])
    c, v = record_points([], [])
    assert c.shape == v.shape == (0,)


# --- sigmoid ------------------------------------------------------------------------------


def test_sigmoid_shape_limits_and_midpoint() -> None:
    assert sigmoid(TRUE["C_mid"], **TRUE) == pytest.approx((TRUE["R0"] + TRUE["A"]) / 2, abs=1e-15)
    assert isinstance(sigmoid(10.0, **TRUE), float)
    grid = np.logspace(-300, 300, 603).reshape(3, 201)
    with np.errstate(all="raise"):
        out = sigmoid(grid, **TRUE)
    assert out.shape == grid.shape
    assert np.all(np.diff(out.ravel()) >= 0)
    assert out.ravel()[0] == pytest.approx(TRUE["R0"], abs=1e-15)
    assert out.ravel()[-1] == pytest.approx(TRUE["A"], abs=1e-15)


@pytest.mark.parametrize("seed", range(20))
def test_sigmoid_matches_formula(seed: int) -> None:
    rng = np.random.default_rng(seed)
    R0, A = np.sort(rng.uniform(0, 1, 2))
    C_mid, B = 10 ** rng.uniform(1, 5), rng.uniform(0.2, 5)
    C = 10 ** rng.uniform(0, 6, 50)
    expected = [R0 + (A - R0) / (1 + (C_mid / c) ** B) for c in C]
    np.testing.assert_allclose(sigmoid(C, R0, A, C_mid, B), expected, rtol=1e-12, atol=1e-15)
    assert np.all(np.diff(sigmoid(np.sort(C), R0, A, C_mid, B)) >= 0)


# --- fit_sigmoid ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_robust_fit_recovers_parameters(seed: int) -> None:
    # Deterministic (seeded noise). Over noise seeds 0-299 the errors reached |dA| 0.013, |dR0| 0.017,
    # |dlog C_mid| 0.108 (over 0.1 in 2 seeds) and |dB| / B 0.11; seeds 0-5 stay under 0.010, 0.005,
    # 0.035 and 0.055.
    fit = fit_sigmoid(COMPUTE, noisy_curve(seed), bootstrap=0)
    assert fit.success and fit.n == COMPUTE.size
    assert fit.params["A"] == pytest.approx(TRUE["A"], abs=0.02)
    assert fit.params["R0"] == pytest.approx(TRUE["R0"], abs=0.02)
    assert abs(math.log(fit.params["C_mid"] / TRUE["C_mid"])) < 0.1
    assert fit.params["B"] == pytest.approx(TRUE["B"], rel=0.15)


@pytest.mark.parametrize("seed", range(6))
def test_soft_l1_beats_least_squares_with_outliers(seed: int) -> None:
    value = noisy_curve(seed)
    grid = np.logspace(2, 5, 200)
    truth = sigmoid(grid, **TRUE)
    robust = fit_sigmoid(COMPUTE, value, loss="soft_l1", bootstrap=0)
    plain = fit_sigmoid(COMPUTE, value, loss="linear", bootstrap=0)
    robust_err = np.max(np.abs(robust.predict(grid) - truth))
    plain_err = np.max(np.abs(plain.predict(grid) - truth))
    # Deterministic. Over noise seeds 0-299: robust_err 0.017 at most, plain_err 0.024 at least (0.043 in
    # seeds 0-5); the robust asymptote was the closer one in 292 of 300 seeds (all of seeds 0-5).
    assert robust_err < 0.02 < plain_err
    assert abs(robust.params["A"] - TRUE["A"]) < abs(plain.params["A"] - TRUE["A"])


def test_exact_curve_is_recovered_exactly() -> None:
    fit = fit_sigmoid(COMPUTE, sigmoid(COMPUTE, **TRUE), bootstrap=0)
    for name in PARAM_NAMES:
        assert fit.params[name] == pytest.approx(TRUE[name], rel=1e-5)


def test_bootstrap_ci_covers_truth_in_most_seeds() -> None:
    # Deterministic (seeded noise and resampling). The 90% intervals covered the truth in 83-90% of noise
    # seeds 0-59 (R0 90%, A 87%, C_mid 83%, B 85%: the percentile bootstrap of the robust fit covers a
    # little less than nominal); seeds 0-9 give 9, 9, 10, 10 of 10. Some parameter falls under 7 in
    # about 1 in 10 random sets of 10 seeds, so a change to the fit's numerics can fail this honestly.
    covered = {name: 0 for name in PARAM_NAMES}
    for seed in range(10):
        fit = fit_sigmoid(COMPUTE, noisy_curve(seed), bootstrap=200, seed=seed)
        assert len(fit.boot) >= 190  # nearly every refit converges
        for name, (low, high) in fit.ci.items():
            assert low <= fit.params[name] <= high
            covered[name] += low <= TRUE[name] <= high
    assert all(count >= 7 for count in covered.values()), covered


def test_bootstrap_is_seeded_and_predict_ci_brackets_the_fit() -> None:
    value = noisy_curve(0)
    a = fit_sigmoid(COMPUTE, value, bootstrap=30, seed=3)
    b = fit_sigmoid(COMPUTE, value, bootstrap=30, seed=3)
    c = fit_sigmoid(COMPUTE, value, bootstrap=30, seed=4)
    np.testing.assert_array_equal(a.boot, b.boot)
    assert a.boot.shape[1] == 4 and not np.array_equal(a.boot, c.boot)
    grid = np.logspace(2, 5, 7).reshape(7, 1)
    low, high = a.predict_ci(grid)
    assert low.shape == high.shape == grid.shape
    assert np.all(low <= a.predict(grid) + 1e-3) and np.all(a.predict(grid) - 1e-3 <= high)
    narrow_low, narrow_high = a.predict_ci(grid, level=0.5)
    assert np.all(narrow_high - narrow_low <= high - low + 1e-12)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.n = 3  # type: ignore[misc]


def test_no_bootstrap_gives_nan_intervals() -> None:
    fit = fit_sigmoid(COMPUTE, noisy_curve(1), bootstrap=0)
    assert fit.boot.shape == (0, 4)
    assert all(math.isnan(low) and math.isnan(high) for low, high in fit.ci.values())
    low, high = fit.predict_ci(COMPUTE)
    assert np.all(np.isnan(low)) and np.all(np.isnan(high))


def test_fit_is_equivariant_in_value_and_compute_units() -> None:
    """Measuring the metric in other units, or compute in steps of 64 rollouts, only rescales
    the fitted parameters (the default f_scale and bounds follow the data)."""
    value = noisy_curve(2)
    base = fit_sigmoid(COMPUTE, value, bootstrap=0, value_bounds=(0.0, 1.0))
    scaled = fit_sigmoid(COMPUTE, 100.0 * value - 5.0, bootstrap=0, value_bounds=(-5.0, 95.0))
    assert scaled.params["R0"] == pytest.approx(100.0 * base.params["R0"] - 5.0, rel=1e-4)
    assert scaled.params["A"] == pytest.approx(100.0 * base.params["A"] - 5.0, rel=1e-4)
    assert scaled.params["C_mid"] == pytest.approx(base.params["C_mid"], rel=1e-4)
    steps = fit_sigmoid(COMPUTE / 64.0, value, bootstrap=0)
    assert steps.params["C_mid"] == pytest.approx(base.params["C_mid"] / 64.0, rel=1e-4)
    assert steps.params["B"] == pytest.approx(base.params["B"], rel=1e-4)


def test_non_rate_values_get_wider_bounds() -> None:
    """A metric outside [0, 1] (a reward in points) is not clipped to [0, 1]."""
    params = {"R0": -2.0, "A": 6.0, "C_mid": 1e3, "B": 2.0}
    fit = fit_sigmoid(COMPUTE, sigmoid(COMPUTE, **params), bootstrap=0)
    for name in PARAM_NAMES:
        assert fit.params[name] == pytest.approx(params[name], rel=1e-4)


def test_fit_respects_constraints_on_a_decreasing_curve() -> None:
    """A falling curve cannot be fitted by a rising sigmoid; the bounds still hold."""
    fit = fit_sigmoid(COMPUTE, 0.8 - 0.5 * sigmoid(COMPUTE, 0.0, 1.0, 3e3, 1.0), bootstrap=20)
    assert 0.0 <= fit.params["R0"] <= fit.params["A"] <= 1.0
    assert fit.params["B"] > 0
    assert np.all(fit.boot[:, 0] <= fit.boot[:, 1]) and np.all(fit.boot[:, 3] > 0)


# --- frontier, n*(C), saturation -------------------------------------------------------------

CROSSING = {  # small n learns fast but tops out low; large n starts slow and ends higher
    "n4": ({"R0": 0.1, "A": 0.5, "C_mid": 1e3, "B": 2.0}, {"n": 4, "Bp": 64}),
    "n8": ({"R0": 0.1, "A": 0.65, "C_mid": 4e3, "B": 2.0}, {"n": 8, "Bp": 32}),
    "n16": ({"R0": 0.1, "A": 0.8, "C_mid": 2e4, "B": 2.0}, {"n": 16, "Bp": 16}),
}


def crossing(a: str, b: str) -> float:
    """Compute (rollouts) at which the curves of configs ``a`` and ``b`` cross."""
    def gap(log_c: float) -> float:
        return sigmoid(math.exp(log_c), **CROSSING[a][0]) - sigmoid(math.exp(log_c), **CROSSING[b][0])

    return math.exp(brentq(gap, math.log(1e2), math.log(1e6)))


def test_frontier_follows_crossing_curves() -> None:
    fits = {key: known_fit(**params) for key, (params, _) in CROSSING.items()}
    configs = {key: config for key, (_, config) in CROSSING.items()}
    grid = np.logspace(2, 6, 81)
    rows = frontier(fits, configs, grid)
    assert len(rows) == grid.size
    for row, c in zip(rows, grid):
        best = max(CROSSING, key=lambda key: sigmoid(c, **CROSSING[key][0]))  # loop reference
        assert row["config"] == best and row["n"] == CROSSING[best][1]["n"]
        assert row["C"] == c and row["value"] == sigmoid(c, **CROSSING[best][0])
        assert math.isnan(row["low"]) and math.isnan(row["high"])
    n_star = optimal_allocation(rows, key="n")
    bp_star = optimal_allocation(rows, key="Bp")
    assert list(np.unique(n_star)) == [4, 8, 16]
    assert np.all(np.diff(n_star) >= 0) and np.all(np.diff(bp_star) <= 0)
    # n* reaches 16 at the first grid point past the n8/n16 crossing and keeps it.
    cross = crossing("n8", "n16")
    assert crossing("n4", "n8") < cross < grid[-1]
    assert saturation_point(grid, n_star) == grid[grid > cross][0]
    assert saturation_point(grid, bp_star) == grid[grid > cross][0]
    # A grid ending between the crossings saturates at n8, unless it ends as n8 takes over.
    first_n8 = grid[grid > crossing("n4", "n8")][0]
    short = grid[grid < cross]
    assert saturation_point(short, optimal_allocation(frontier(fits, configs, short))) == first_n8
    shorter = grid[grid <= first_n8]
    assert saturation_point(shorter, optimal_allocation(frontier(fits, configs, shorter))) is None


def test_frontier_from_fitted_noisy_curves() -> None:
    rng = np.random.default_rng(0)
    fits, configs = {}, {}
    for key, (params, config) in CROSSING.items():
        compute = np.logspace(2, 6, 30)
        value = sigmoid(compute, **params) + rng.normal(0.0, 0.005, compute.size)
        fits[key], configs[key] = fit_sigmoid(compute, value, bootstrap=40, seed=1), config
    grid = np.array([2e2, 1e5, 1e6])  # far from the crossings
    rows = frontier(fits, configs, grid)
    # Deterministic. Over noise seeds 0-59 the winners and bands held in every seed and the value was
    # at most 0.007 from the truth (0.0008 for seed 0).
    assert [row["config"] for row in rows] == ["n4", "n16", "n16"]
    for row in rows:
        assert row["low"] <= row["value"] <= row["high"]
        assert row["value"] == pytest.approx(sigmoid(row["C"], **CROSSING[row["config"]][0]), abs=0.02)


def test_frontier_tie_goes_to_first_key() -> None:
    same = {"R0": 0.1, "A": 0.5, "C_mid": 1e3, "B": 1.0}
    rows = frontier({"b": known_fit(**same), "a": known_fit(**same)}, {"a": {"n": 1}, "b": {"n": 2}}, [1e3])
    assert rows[0]["config"] == "b" and rows[0]["n"] == 2


@pytest.mark.parametrize(
    ("n_star", "expected"),
    [
        ([4, 4, 4, 4], 1.0),
        ([4, 8, 8, 8], 2.0),
        ([4, 8, 16, 16], 3.0),
        ([4, 8, 8, 16], None),
        ([8, 4, 8, 8], 3.0),  # back to an earlier value still counts as a change
        ([7], 1.0),
    ],
)
def test_saturation_rule(n_star: list[int], expected: float | None) -> None:
    grid = np.arange(1.0, len(n_star) + 1.0)
    assert saturation_point(grid, n_star) == expected


def test_saturation_tolerance() -> None:
    grid = [1.0, 2.0, 3.0, 4.0]
    assert saturation_point(grid, [1.0, 2.0, 2.01, 1.99]) is None
    assert saturation_point(grid, [1.0, 2.0, 2.01, 1.99], tol=0.05) == 2.0


# --- holdout_check ---------------------------------------------------------------------------


def test_holdout_on_exact_sigmoid_is_accurate() -> None:
    params = {"R0": 0.1, "A": 0.7, "C_mid": 1e3, "B": 1.5}
    value = sigmoid(COMPUTE, **params)
    out = holdout_check(COMPUTE, value)
    assert out["reason"] is None
    assert out["n_fit_points"] == int(np.sum(COMPUTE <= COMPUTE.max() / 4))
    assert out["observed"] == value.max()
    assert out["abs_error"] < 1e-4
    assert out["abs_error"] == pytest.approx(abs(out["predicted"] - out["observed"]))


def test_holdout_observed_is_the_running_max() -> None:
    value = sigmoid(COMPUTE, **TRUE) + np.random.default_rng(0).normal(0, 0.01, COMPUTE.size)
    value[-1] = 0.0  # the last eval broke
    out = holdout_check(COMPUTE, value)
    assert out["observed"] == value.max()
    assert out["abs_error"] < 0.05  # deterministic: 0.022 here, at most 0.025 over noise seeds 0-59


def test_holdout_with_too_few_points_says_why() -> None:
    out = holdout_check([1e3, 2e3, 1e4, 5e4, 1e5], [0.1, 0.2, 0.4, 0.6, 0.7])
    assert out["abs_error"] is None and out["predicted"] is None
    assert out["n_fit_points"] == 3 and "3 distinct" in out["reason"]
    assert out["observed"] == 0.7


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("compute", "value", "match"),
    [
        ([1.0, 2.0, 3.0], [0.1, 0.2, 0.3], "at least 4 points"),
        ([1.0, 2.0, 2.0, 3.0], [0.1, 0.2, 0.2, 0.3], "4 distinct"),
        ([0.0, 1.0, 2.0, 3.0], [0.1, 0.2, 0.3, 0.4], "compute must be > 0"),
        ([-1.0, 1.0, 2.0, 3.0], [0.1, 0.2, 0.3, 0.4], "compute must be > 0"),
        ([1.0, 2.0, 3.0, 4.0], [0.1, 0.2, 0.3], "one length"),
        ([1.0, 2.0, 3.0, np.nan], [0.1, 0.2, 0.3, 0.4], "finite"),
        ([[1.0, 2.0, 3.0, 4.0]], [[0.1, 0.2, 0.3, 0.4]], "1-D"),
    ],
)
def test_fit_rejects_bad_curves(compute: list, value: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_sigmoid(compute, value)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"loss": "l2"}, "loss must be one of"),
        ({"bootstrap": -1}, "bootstrap"),
        ({"f_scale": 0.0}, "f_scale"),
        ({"value_bounds": (1.0, 0.0)}, "lo < hi"),
    ],
)
def test_fit_rejects_bad_options(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_sigmoid(COMPUTE, sigmoid(COMPUTE, **TRUE), **kwargs)


def test_other_functions_reject_bad_input() -> None:
    fit = known_fit(**TRUE)
    with pytest.raises(ValueError, match="one length"):
        record_points([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="> 0"):
        sigmoid(np.array([1.0, 0.0]), **TRUE)
    with pytest.raises(ValueError, match="level"):
        fit.predict_ci(COMPUTE, level=1.0)
    with pytest.raises(ValueError, match="no entry"):
        frontier({"a": fit}, {}, COMPUTE)
    with pytest.raises(ValueError, match="clash"):
        frontier({"a": fit}, {"a": {"value": 1}}, COMPUTE)
    with pytest.raises(ValueError, match="at least one fit"):
        frontier({}, {}, COMPUTE)
    with pytest.raises(ValueError, match="no field"):
        optimal_allocation(frontier({"a": fit}, {"a": {"n": 4}}, COMPUTE), key="Bp")
    with pytest.raises(ValueError, match="strictly increasing"):
        saturation_point([1.0, 1.0, 2.0], [1, 1, 1])
    with pytest.raises(ValueError, match="one length"):
        saturation_point([1.0, 2.0], [1])
    with pytest.raises(ValueError, match="fraction"):
        holdout_check(COMPUTE, sigmoid(COMPUTE, **TRUE), fraction=0.0)
    with pytest.raises(ValueError, match="> 0"):
        holdout_check([0.0, 1.0], [0.1, 0.2])
