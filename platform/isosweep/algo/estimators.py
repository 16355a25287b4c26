"""Unbiased eval estimators mean@k, best@k (pass@k) and worst@k from n >= k samples.

For a problem with ``n`` sampled completions of which ``c`` are correct, the probability that
a uniformly random size-``k`` subset of them (without replacement) has

- ``mean@k``: its average correctness, ``c / n`` (independent of ``k``);
- ``best@k``: at least one correct, ``1 - C(n - c, k) / C(n, k)`` (pass@k, Chen et al. 2021);
- ``worst@k``: all correct, ``C(c, k) / C(n, k)``.

Each is the unbiased estimate of the metric for ``k`` fresh samples. The binomial ratios are
computed as products of ``k`` factors in ``[0, 1]``,
``C(m, k) / C(n, k) = prod_{i<k} (m - i) / (n - i)``, which neither overflows nor cancels
(the Codex paper's stable form, written over ``k`` factors so that it vectorises over
problems).

Every estimator takes ``c``, the correct counts (a scalar, for which a float is returned, or
``(problems,)``, for which an array of that shape is returned), ``n``, the samples drawn per
problem, and ``k``, the samples the metric is about (``1 <= k <= n``).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike


def _validated(c: ArrayLike, n: int, k: int) -> np.ndarray:
    """``c`` as a float array, after checking ``1 <= k <= n`` and ``0 <= c <= n``."""
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    counts = np.asarray(c, dtype=np.float64)
    if np.any(counts < 0) or np.any(counts > n):
        raise ValueError(f"correct counts must lie in [0, n={n}]")
    return counts


def _binomial_ratio(m: np.ndarray, n: int, k: int) -> np.ndarray:
    """``C(m, k) / C(n, k)`` elementwise for integer-valued ``0 <= m <= n``; 0 when ``m < k``."""
    i = np.arange(k, dtype=np.float64)
    # A factor (m - i) hits exactly 0 at i = m when m < k; later factors are negative, so the
    # clip only turns a signed zero into +0.
    factors = (m[..., None] - i) / (n - i)
    return np.clip(np.prod(factors, axis=-1), 0.0, 1.0)


def _as_input(result: np.ndarray, c: ArrayLike) -> float | np.ndarray:
    return float(result) if np.ndim(c) == 0 else result


def mean_at_k(c: ArrayLike, n: int, k: int) -> float | np.ndarray:
    """mean@k = ``c / n``: expected fraction correct among ``k`` samples."""
    counts = _validated(c, n, k)
    return _as_input(counts / n, c)


def best_at_k(c: ArrayLike, n: int, k: int) -> float | np.ndarray:
    """best@k = pass@k = ``1 - C(n - c, k) / C(n, k)``: at least one of ``k`` correct."""
    counts = _validated(c, n, k)
    return _as_input(1.0 - _binomial_ratio(n - counts, n, k), c)


def worst_at_k(c: ArrayLike, n: int, k: int) -> float | np.ndarray:
    """worst@k = ``C(c, k) / C(n, k)``: all ``k`` correct."""
    counts = _validated(c, n, k)
    return _as_input(_binomial_ratio(counts, n, k), c)


def sampling_se_of_mean(counts: ArrayLike, n: int) -> float | np.ndarray:
    """Standard error of the mean pass rate (= mean@k for every k) over problems from sampling alone, on these
    problems: per problem ``c/n`` has variance ``p(1-p)/n``, estimated without bias by ``(c/n)(1-c/n)/(n-1)``.
    ``counts`` is ``(problems,)`` or ``(evaluations, problems)`` (one value per evaluation); ``nan`` for ``n = 1``."""
    rates = np.asarray(counts, dtype=np.float64) / n
    if n < 2:
        return np.full(rates.shape[:-1], math.nan) if rates.ndim > 1 else math.nan
    se = np.sqrt(np.sum(rates * (1 - rates), axis=-1) / (n - 1)) / rates.shape[-1]
    return se if rates.ndim > 1 else float(se)


def summarize(correct: ArrayLike, k: int) -> dict[str, float]:
    """Eval metrics over problems from a 0/1 correctness matrix.

    Args:
        correct: ``(problems, n_samples)`` of 0/1 (or bool), ``n_samples >= k``.
        k: ``1 <= k <= n_samples``.

    Returns:
        ``{"mean@k", "best@k", "worst@k", "stderr_mean@k", "sampling_se_mean@k"}`` with ``k`` written
        as its number (e.g. ``"mean@4"``): the three estimators averaged over problems; the standard
        error of that average over problems (sample std with ``ddof=1`` over ``sqrt(problems)``;
        ``nan`` with a single problem), which counts the spread between problems as noise; and the
        standard error from sampling alone, on *these* problems: how much mean@k moves when the same
        policy is evaluated again on the same problems (the noise of a fixed eval set; per problem
        ``c/n`` has variance ``p(1-p)/n``, estimated without bias by ``(c/n)(1-c/n)/(n-1)``; ``nan``
        with one sample per problem).
    """
    table = np.asarray(correct)
    if table.ndim != 2 or table.shape[0] == 0:
        raise ValueError(f"correct must be (problems >= 1, n_samples), got shape {table.shape}")
    if not np.isin(table, (0, 1)).all():
        raise ValueError("correct must hold only 0 and 1")
    problems, n = table.shape
    counts = table.sum(axis=1).astype(np.float64)
    means = mean_at_k(counts, n, k)
    stderr = float(np.std(means, ddof=1) / math.sqrt(problems)) if problems > 1 else math.nan
    sampling_se = float(sampling_se_of_mean(counts, n))
    return {
        f"mean@{k}": float(np.mean(means)),
        f"best@{k}": float(np.mean(best_at_k(counts, n, k))),
        f"worst@{k}": float(np.mean(worst_at_k(counts, n, k))),
        f"stderr_mean@{k}": stderr,
        f"sampling_se_mean@{k}": sampling_se,
    }
