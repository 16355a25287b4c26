"""Tests for isosweep.algo.estimators against brute-force enumeration of k-subsets."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from isosweep.algo.estimators import best_at_k, mean_at_k, summarize, worst_at_k


def brute_force(c: int, n: int, k: int) -> tuple[float, float, float]:
    """(mean@k, best@k, worst@k) averaged over every k-subset of c ones and n - c zeros."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(samples, k))
    mean = sum(sum(s) / k for s in subsets) / len(subsets)
    best = sum(any(s) for s in subsets) / len(subsets)
    worst = sum(all(s) for s in subsets) / len(subsets)
    return mean, best, worst


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_enumeration_of_all_subsets(n: int) -> None:
    for k in range(1, n + 1):
        for c in range(n + 1):
            mean, best, worst = brute_force(c, n, k)
            assert mean_at_k(c, n, k) == pytest.approx(mean, rel=1e-12, abs=1e-15)
            assert best_at_k(c, n, k) == pytest.approx(best, rel=1e-12, abs=1e-15)
            assert worst_at_k(c, n, k) == pytest.approx(worst, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("n", [1, 4, 9, 16])
def test_vectorised_matches_scalar(n: int) -> None:
    counts = np.arange(n + 1)
    for k in range(1, n + 1):
        for fn in (mean_at_k, best_at_k, worst_at_k):
            out = fn(counts, n, k)
            assert isinstance(out, np.ndarray) and out.shape == counts.shape
            expected = np.array([fn(int(c), n, k) for c in counts])
            np.testing.assert_array_equal(out, expected)
            assert isinstance(fn(int(counts[-1]), n, k), float)


def test_extremes_are_exact() -> None:
    for n in (1, 5, 64):
        for k in (1, n):
            assert best_at_k(0, n, k) == 0.0 and worst_at_k(0, n, k) == 0.0
            assert best_at_k(n, n, k) == 1.0 and worst_at_k(n, n, k) == 1.0
        if n > 1:
            # Fewer wrong samples than k: some correct one is always drawn.
            assert best_at_k(1, n, n) == 1.0
            # Fewer correct samples than k: never all correct.
            assert worst_at_k(n - 1, n, n) == 0.0


def test_stable_for_large_n_against_exact_rationals() -> None:
    for n, c, k in [(1000, 500, 100), (200, 3, 50), (500, 497, 250), (64, 10, 32)]:
        exact_best = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        exact_worst = Fraction(math.comb(c, k), math.comb(n, k))
        assert best_at_k(c, n, k) == pytest.approx(float(exact_best), rel=1e-12, abs=1e-300)
        assert worst_at_k(c, n, k) == pytest.approx(float(exact_worst), rel=1e-10, abs=1e-300)


def test_k_equal_one_is_the_mean() -> None:
    n = 10
    counts = np.arange(n + 1)
    np.testing.assert_allclose(best_at_k(counts, n, 1), counts / n, rtol=0, atol=1e-15)
    np.testing.assert_allclose(worst_at_k(counts, n, 1), counts / n, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(mean_at_k(counts, n, 1), counts / n)


@pytest.mark.parametrize("n", [2, 5, 12, 40])
def test_monotonic_in_k(n: int) -> None:
    counts = np.arange(n + 1)
    best = np.stack([best_at_k(counts, n, k) for k in range(1, n + 1)])
    worst = np.stack([worst_at_k(counts, n, k) for k in range(1, n + 1)])
    mean = np.stack([mean_at_k(counts, n, k) for k in range(1, n + 1)])
    assert (np.diff(best, axis=0) >= -1e-15).all()
    assert (np.diff(worst, axis=0) <= 1e-15).all()
    assert (mean == mean[0]).all()
    assert (worst <= mean + 1e-15).all() and (mean <= best + 1e-15).all()


@pytest.mark.parametrize("fn", [mean_at_k, best_at_k, worst_at_k])
def test_invalid_arguments_raise(fn) -> None:
    with pytest.raises(ValueError, match="k <= n"):
        fn(1, 4, 5)
    with pytest.raises(ValueError, match="k <= n"):
        fn(1, 4, 0)
    with pytest.raises(ValueError, match="correct counts"):
        fn(5, 4, 2)
    with pytest.raises(ValueError, match="correct counts"):
        fn(np.array([1, -1]), 4, 2)


def test_summarize_against_per_problem_estimators() -> None:
    rng = np.random.default_rng(0)
    for k in (1, 2, 4, 8):
        correct = (rng.random((30, 8)) < rng.random((30, 1))).astype(np.int64)
        out = summarize(correct, k)
        assert set(out) == {f"mean@{k}", f"best@{k}", f"worst@{k}", f"stderr_mean@{k}", f"sampling_se_mean@{k}"}
        assert all(isinstance(v, float) for v in out.values())
        per_problem = [brute_force(int(c), 8, k) for c in correct.sum(axis=1)]
        for i, key in enumerate(("mean", "best", "worst")):
            expected = sum(p[i] for p in per_problem) / len(per_problem)
            assert out[f"{key}@{k}"] == pytest.approx(expected, rel=1e-12)
        means = correct.mean(axis=1)
        stderr = math.sqrt(sum((m - means.mean()) ** 2 for m in means) / (len(means) - 1) / len(means))
        assert out[f"stderr_mean@{k}"] == pytest.approx(stderr, rel=1e-12)


def test_summarize_hand_case_and_edges() -> None:
    correct = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=bool)
    out = summarize(correct, 2)
    assert out["mean@2"] == pytest.approx(0.75)
    assert out["best@2"] == pytest.approx((5 / 6 + 1) / 2)
    assert out["worst@2"] == pytest.approx((1 / 6 + 1) / 2)
    assert out["stderr_mean@2"] == pytest.approx(0.25)
    assert math.isnan(summarize(correct[:1], 2)["stderr_mean@2"])
    # sampling alone: (1/2 * 1/2 / 3 + 0) / 2^2 under the root
    assert out["sampling_se_mean@2"] == pytest.approx(math.sqrt(0.25 / 3) / 2)
    assert math.isnan(summarize(correct[:, :1], 1)["sampling_se_mean@1"])
    with pytest.raises(ValueError, match="problems"):
        summarize(np.zeros(4), 2)
    with pytest.raises(ValueError, match="problems"):
        summarize(np.zeros((0, 4)), 2)
    with pytest.raises(ValueError, match="0 and 1"):
        summarize(np.array([[0, 2]]), 1)
    with pytest.raises(ValueError, match="k <= n"):
        summarize(correct, 5)


def test_sampling_se_is_the_spread_of_re_evaluations_on_fixed_problems() -> None:
    """Against simulation: evaluate one "policy" (fixed per-problem pass rates) again and again on the same
    problems; the spread of its mean@k is what ``sampling_se_mean@k`` reports from a single evaluation, and it
    is smaller than ``stderr_mean@k``, which also counts the spread between problems."""
    rng = np.random.default_rng(1)
    rates = rng.beta(1.2, 1.0, size=200)
    for samples in (4, 16):
        evaluations = [(rng.random((200, samples)) < rates[:, None]).astype(int) for _ in range(400)]
        observed = np.std([summarize(e, 4)["mean@4"] for e in evaluations], ddof=1)
        reported = np.mean([summarize(e, 4)["sampling_se_mean@4"] for e in evaluations])
        assert reported == pytest.approx(observed, rel=0.15)  # 400 re-evaluations: the std is known to ~4%
        assert reported < np.mean([summarize(e, 4)["stderr_mean@4"] for e in evaluations])
