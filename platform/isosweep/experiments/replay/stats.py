"""The statistics of a replay: compute to epsilon, medians with bootstrap intervals, paired Wilcoxon tests.

A study's **regret** is the best true value minus the true value of what it recommends at the end; its
**compute to eps** is the spend at which its recommendation first came within ``eps`` of the best (None:
never; ``inf`` inside the statistics). Over searcher seeds (:func:`summarize`): medians with 95% bootstrap
intervals, and each JF-HPO method paired against every other method with a Wilcoxon signed-rank test (the
same seed index for every method: the training-seed draws are not shared, but the table is).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from scipy.stats import wilcoxon

from isosweep.experiments.hpo_table import Signal
from isosweep.experiments.replay.records import MethodSummary, PairedTest, Pairing, ReplayRecord


def compute_to_eps(trajectory: Iterable[tuple[float, float | None]], eps: float) -> float | None:
    """The first spend of ``(spent, regret)`` steps whose regret is at most ``eps``; None: never."""
    return next((spent for spent, regret in trajectory if regret is not None and regret <= eps), None)


def bootstrap_median(values: Sequence[float], rng: np.random.Generator, draws: int = 2000
                     ) -> tuple[float, float, float]:
    """The median and its 95% percentile-bootstrap interval (``inf`` stands for never)."""
    data = np.asarray(values, dtype=float)
    medians = np.median(data[rng.integers(0, len(data), (draws, len(data)))], axis=1)
    return float(np.median(data)), float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def paired_test(a: Sequence[float], b: Sequence[float]) -> PairedTest:
    """Wilcoxon signed-rank test of ``a - b`` (paired by searcher seed); equal pairs are split. ``inf``
    (never reached) ranks above every finite value and ties with itself."""
    never = 1e9
    diffs = (np.nan_to_num(np.asarray(a, dtype=float), posinf=never)
             - np.nan_to_num(np.asarray(b, dtype=float), posinf=never))
    if diffs.size == 0 or not np.any(diffs != 0):
        return PairedTest(median_diff=0.0 if diffs.size else None, p=1.0, wins=0, losses=0, ties=int(diffs.size))
    p = float(wilcoxon(diffs, zero_method="zsplit").pvalue)
    median = float(np.median(diffs))
    # a median that involves a never-reached seed is not a number of target trials (an even count of pairs
    # averages a finite middle value with 1e9: about 5e8)
    return PairedTest(median_diff=None if abs(median) >= never / 4 else median, p=p, wins=int((diffs < 0).sum()),
                      losses=int((diffs > 0).sum()), ties=int((diffs == 0).sum()))


def reach(records: Sequence[ReplayRecord]) -> list[float]:
    """Each record's compute to eps, ``inf`` for never."""
    return [math.inf if r.compute_to_eps is None else r.compute_to_eps for r in records]


def summarize(results: dict[str, Sequence[ReplayRecord]], seed: int = 0) -> dict[str, MethodSummary]:
    """Per method (``results``: its records, one per searcher seed, in seed order): median regret and compute to
    epsilon with intervals; each JF-HPO method (``jfhpo*``) paired against every other method."""
    rng = np.random.default_rng(seed)
    rows: dict[str, dict[str, Any]] = {}
    for method, runs in results.items():
        regrets = [r.regret for r in runs]
        reached = reach(runs)
        med, lo, hi = bootstrap_median(regrets, rng)
        cmed, clo, chi = bootstrap_median(reached, rng)
        verdicts = [r.proxy_verdict for r in runs if r.proxy_verdict is not None]
        rows[method] = dict(
            regret_median=med, regret_ci95=(lo, hi), regret_mean=statistics.fmean(regrets),
            zero_regret=f"{sum(r == 0 for r in regrets)}/{len(runs)}",
            compute_to_eps_median=None if math.isinf(cmed) else cmed,
            compute_to_eps_ci95=tuple(None if math.isinf(v) else v for v in (clo, chi)),
            reached_eps=f"{sum(math.isfinite(v) for v in reached)}/{len(runs)}",
            trials_mean=statistics.fmean(r.trials for r in runs),
            promotions_mean=statistics.fmean(r.promotions for r in runs),
            stops_mean=statistics.fmean(r.stops for r in runs),
            by_size_mean={size: statistics.fmean(r.by_size[size] for r in runs) for size in runs[0].by_size},
            proxies_trusted=f"{sum(v.trusted for v in verdicts)}/{len(runs)}" if verdicts else None,
            versus={})
    for mine in [m for m in results if m.startswith("jfhpo")]:
        for method in results:
            if method.startswith("jfhpo"):
                continue
            a, b = results[mine], results[method]
            rows[mine]["versus"][method] = Pairing(
                regret=paired_test([r.regret for r in a], [r.regret for r in b]),
                compute_to_eps=paired_test(reach(a), reach(b)))
    return {method: MethodSummary(**row) for method, row in rows.items()}


def unmet(check: Signal) -> list[str]:
    """The preconditions a table's signal check (:func:`isosweep.experiments.hpo_table.check_signal`) does not
    meet, or does not meet yet: a searcher comparison on such a table cannot say which method is better."""
    if not check.complete:
        return [check.why or "the table is not complete"]
    return [name for name, met in check.checks.items() if not met]
