"""From eval curves to fitted allocations: the one fit-then-bootstrap pipeline of the frontier analysis, the
planner and the study report.

    curves ─► Resampler (observed, and each bootstrap replicate: seeds and paired eval problems resampled)
           ─► each config's running-best points ─► its sigmoid (R0 fixed to the base model's value)
           ─► :func:`fit_allocations`: per metric, the observed fits and every replicate's refits

A config whose points cannot carry a sigmoid (:func:`why_unfittable`) or whose fit fails is *unfitted*, with
the reason; a replicate's refit starts from the observed fit and is left out where it fails. The same curves,
metrics, replicates and seed give the same fits, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from isosweep.algo.estimators import best_at_k, mean_at_k, worst_at_k
from isosweep.report import frontier as F
from isosweep.track.curves import Curve

Pairs = list[tuple[Curve, np.ndarray]]
"""Evaluations of some trials: each curve with its values of one metric (observed, or as a replicate sees them)."""


ESTIMATORS = {"mean": mean_at_k, "best": best_at_k, "worst": worst_at_k}


def _estimator(metric: str):
    name, _, k = metric.partition("@")
    return ESTIMATORS[name], int(k)


def jitter(values: np.ndarray) -> float:
    """The eval noise of one curve estimated from its own jitter: ``1.4826 * MAD(second differences) / sqrt(6)``
    (a second difference of i.i.d. noise has variance 6 sd^2; a smooth trend adds little to it)."""
    if len(values) < 4:
        return 0.0
    d2 = np.diff(values, 2)
    return float(1.4826 * np.median(np.abs(d2 - np.median(d2))) / math.sqrt(6.0))


class Resampler:
    """Evaluations of every curve, as observed or as one bootstrap replicate sees them."""

    def __init__(self, curves: list[Curve], metrics: list[str]) -> None:
        self.curves, self.metrics = curves, metrics
        with_counts = [c for c in curves if c.counts is not None]
        self.counted = len(with_counts) == len(curves)
        sets = {(c.eval_set, c.counts.shape[1]) for c in with_counts}
        self.paired = self.counted and len(sets) == 1
        self.seeds = sorted({int(c.fields.get("seed", 0)) for c in curves})
        self.by_config: dict[str, list[int]] = {}
        for i in sorted(range(len(curves)), key=lambda i: int(curves[i].fields.get("seed", 0))):
            self.by_config.setdefault(curves[i].config, []).append(i)
        self.jitter = {(i, m): jitter(c.values[m]) for i, c in enumerate(curves) for m in metrics}

    def describe(self) -> str:
        most = max(len(members) for members in self.by_config.values())
        seeds = f"up to {most} seeds per config resampled" if most > 1 else "1 seed per config (seed noise not measured)"
        if self.paired:
            problems = self.curves[0].counts.shape[1]
            return f"{seeds}; the {problems} eval problems resampled, paired across every trial"
        if self.counted:
            return f"{seeds}; eval problems resampled per trial (the trials' eval sets differ: not paired)"
        return f"{seeds}; no per-problem counts (older trials): each evaluation jittered by its curve's own noise"

    def draw(self, rng: np.random.Generator | None) -> dict[str, list[tuple[Curve, np.ndarray]]]:
        """metric -> [(curve, its values)] for the observed data (``rng`` None) or one replicate."""
        if rng is None:
            chosen = list(range(len(self.curves)))
        else:
            # Each config's seeds drawn with replacement; configs with as many seeds share the draw
            # (seed order), so a seed that helps every config is resampled for all of them alike.
            shared_draws: dict[int, np.ndarray] = {}
            chosen = []
            for members in self.by_config.values():
                draw = shared_draws.setdefault(len(members), rng.integers(0, len(members), len(members)))
                chosen += [members[d] for d in draw]
        shared = None
        if rng is not None and self.paired:
            problems = self.curves[0].counts.shape[1]
            shared = rng.integers(0, problems, problems)
        out: dict[str, list[tuple[Curve, np.ndarray]]] = {m: [] for m in self.metrics}
        for i in chosen:
            curve = self.curves[i]
            idx = None
            if rng is not None and curve.counts is not None:
                idx = shared if shared is not None else rng.integers(0, curve.counts.shape[1], curve.counts.shape[1])
            noise_rng = rng if rng is not None and curve.counts is None else None
            for metric in self.metrics:
                if curve.counts is not None:
                    estimator, k = _estimator(metric)
                    counts = curve.counts if idx is None else curve.counts[:, idx]
                    values = np.asarray(estimator(counts, curve.samples, k)).mean(axis=1)
                else:
                    values = curve.values[metric]
                    if noise_rng is not None:
                        values = values + noise_rng.normal(0.0, self.jitter[(i, metric)], len(values))
                out[metric].append((curve, values))
        return out


def running_best_points(pairs: list[tuple[Curve, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Each curve's running best (over its evaluations, compute 0 included) at every evaluation with
    C > 0, pooled: ``(compute, value)`` ordered by compute."""
    cs, vs = [], []
    for curve, values in pairs:
        order = np.argsort(curve.compute, kind="stable")
        c, v = curve.compute[order], np.maximum.accumulate(values[order])
        cs.append(c[c > 0])
        vs.append(v[c > 0])
    if not cs:
        return np.empty(0), np.empty(0)
    c, v = np.concatenate(cs), np.concatenate(vs)
    order = np.argsort(c, kind="stable")
    return c[order], v[order]


def base_value(pairs: list[tuple[Curve, np.ndarray]]) -> float | None:
    """The mean of every evaluation at compute 0 (the base model on the eval set); None if there is none."""
    at_zero = [values[curve.compute == 0] for curve, values in pairs if np.any(curve.compute == 0)]
    return float(np.mean(np.concatenate(at_zero))) if at_zero else None


def why_unfittable(c: np.ndarray, v: np.ndarray, base: float | None) -> str | None:
    """Why the points ``(c, v)`` cannot carry a sigmoid with ``R0 = base`` (None: they can)."""
    distinct = len(np.unique(c))
    if distinct < F.MIN_POINTS:
        return f"{distinct} evaluation(s) at C > 0; a sigmoid needs {F.MIN_POINTS}"
    floor = -math.inf if base is None else base
    rises = len(np.unique(v[v > floor]))
    if rises < 2:
        return "its running best rose above the base model fewer than twice: no curve to fit"
    return None


def fit_points(c: np.ndarray, v: np.ndarray, base: float | None, start: F.SigmoidFit | None = None) -> F.SigmoidFit | None:
    """The sigmoid through ``(c, v)`` with ``R0`` fixed to ``base`` (no bootstrap), or None if it fails."""
    try:
        return F.fit_sigmoid(c, v, R0=base, start=None if start is None else start.params)
    except ValueError:
        return None


def reached(curve: Curve, budget: float) -> float:
    """The compute a trial's data cover: its last evaluation, or the whole ``budget`` when that evaluation is
    within one step (``Bp * n`` rollouts) of it. A trial of ``M = C // (Bp * n)`` steps ends up to one step
    short of C, and it has still spent its budget: it competes at C like the configs that land on it."""
    last = float(curve.compute.max())
    step = curve.fields.get("Bp", 0) * curve.fields.get("n", 0)
    return float(budget) if budget - step < last <= budget else last


def by_config(pairs: Pairs, keys: list[str]) -> dict[str, Pairs]:
    """``pairs`` grouped by their curve's config, in the order of ``keys`` (a key without trials: empty)."""
    out: dict[str, Pairs] = {key: [] for key in keys}
    for curve, values in pairs:
        out[curve.config].append((curve, values))
    return out


@dataclass(frozen=True)
class AllocationFits:
    """One metric's fits of every config: the observed ones (each with its replicates' parameters in ``boot``),
    why the others have none, the points fitted, and each bootstrap replicate's refits (a config missing from a
    replicate: no refit there)."""

    metric: str
    noise: str
    """What the bootstrap resampled (:meth:`Resampler.describe`)."""
    base: float | None
    """The base model's measured value (the mean of the evaluations at compute 0; R0 of every fit)."""
    groups: dict[str, Pairs]
    """The observed evaluations by config."""
    fits: dict[str, F.SigmoidFit]
    unfitted: dict[str, str]
    points: dict[str, tuple[np.ndarray, np.ndarray]]
    """config -> (compute, value) fitted: each seed's running best at every evaluation with C > 0."""
    replicates: tuple[dict[str, F.SigmoidFit], ...]


def fit_allocations(curves: list[Curve], metrics: list[str], keys: list[str], *, bootstrap: int,
                    seed: int = 0) -> dict[str, AllocationFits]:
    """Per metric of ``metrics``, every config of ``keys`` fitted on the observed data and on ``bootstrap``
    replicates drawn with ``np.random.default_rng(seed)`` (:class:`Resampler`: the draws depend on the metrics
    resampled, so callers that must agree pass the same list)."""
    sampler = Resampler(curves, metrics)
    observed = sampler.draw(None)
    rng = np.random.default_rng(seed)
    drawn = [sampler.draw(rng) for _ in range(bootstrap)]
    out = {}
    for metric in metrics:
        groups = by_config(observed[metric], keys)
        base = base_value(observed[metric])
        fits, unfitted, points = {}, {}, {}
        for key, pairs in groups.items():
            c, v = points[key] = running_best_points(pairs)
            why = why_unfittable(c, v, base)
            fit = None if why else fit_points(c, v, base)
            if fit is None:
                unfitted[key] = why or "the fit failed"
            else:
                fits[key] = fit
        replicates = tuple(_refit(replicate[metric], keys, fits) for replicate in drawn)
        fits = {key: F.SigmoidFit(fit.params, fit.n, fit.success, _boot(key, replicates), fit.bounds)
                for key, fit in fits.items()}
        out[metric] = AllocationFits(metric, sampler.describe(), base, groups, fits, unfitted, points, replicates)
    return out


def _refit(pairs: Pairs, keys: list[str], fits: dict[str, F.SigmoidFit]) -> dict[str, F.SigmoidFit]:
    """One replicate's refit of every config with an observed fit, started from it."""
    base = base_value(pairs)
    out = {}
    for key, group in by_config(pairs, keys).items():
        if key not in fits or not group:
            continue
        c, v = running_best_points(group)
        if why_unfittable(c, v, base) is None and (fit := fit_points(c, v, base, start=fits[key])):
            out[key] = fit
    return out


def _boot(key: str, replicates: tuple[dict[str, F.SigmoidFit], ...]) -> np.ndarray:
    """``(refits, 4)``: the parameters of ``key``'s refits, in replicate order."""
    return np.asarray([[rep[key].params[name] for name in F.PARAM_NAMES] for rep in replicates if key in rep]
                      ).reshape(-1, 4)
