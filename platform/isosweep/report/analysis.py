"""A sweep's frontier analysis: eval curves -> running bests -> sigmoid fits -> frontier table with
paired bootstrap statistics, plots, report.

Input is one :class:`Curve` per trial (what MLflow or the trial's ``metrics.jsonl`` holds:
compute in rollouts, the eval metrics at each evaluation and, for trials of this version, the
per-problem correct counts). For each metric (``mean@k``, ``best@k``, ``worst@k``) and each config
(an (n, Bp) allocation):

1. **Points**: each seed's *running best* at every evaluation with C > 0 (the best a user of that
   config would have by then), the seeds of a config pooled.
2. **Fit**: the sigmoid of :mod:`isosweep.report.frontier` with ``R0`` *fixed* to the base
   model's measured value (the mean of the evaluations at compute 0 over every trial: one base
   model, one eval set). A fit whose plateau ``A`` sits on its bound or whose curve reaches less than
   75% of its fitted gain within the data is flagged *not identified*
   (:func:`isosweep.report.frontier.identification`).
3. **Frontier**: at each C of the table, the config with the highest fitted value among those
   whose data reach C (a fit never decides the frontier beyond its own data).
4. **Uncertainty**: a bootstrap that redoes steps 1-3 on resampled data. Each replicate draws
   the seeds with replacement (the same seed labels for every config) and the eval problems with
   replacement (the *same problems* for every trial when they share an eval set: paired), and
   recomputes every evaluation from the per-problem counts. Trials without counts (older
   versions) instead get Gaussian noise of their own measured jitter added to each evaluation
   (``sd = 1.4826 * MAD(second differences) / sqrt(6)``), which over- rather than under-states
   the noise. From the replicates: each config's 90% band, **P(best)** at each C, the winner's
   lead over the runner-up with its 90% interval (a lead whose interval reaches 0 is a **tie**,
   never a winner), and the set of n that win in at least 5% of replicates (n*'s interval).
5. **Allocation verdict**: n* at the smallest or largest n of the grid is reported as a grid edge
   with the direction to extend; saturation is claimed only for an interior n* that wins without
   a tie over at least a factor :data:`SATURATION_SPAN` in C up to the budget. A tie is of n, not
   of configs: n* is untied when its 90% set is that one n and the winner does not tie with a
   config of another n (n4-Bp16 tied with n4-Bp32 still says n* = 4).
6. **Hold-outs**: each config's fit on ``C <= C_max / 4`` predicting its value at ``C_max``, and
   the *decision* hold-out: every config fitted on ``C <= C_max / 4``, the predicted winner at
   ``C_max`` compared with the observed one (mean over seeds of the running best).
7. **n trend**: at the largest table C that two n of one Bp reach, the change of the fitted value
   per doubling of n at fixed Bp (:func:`n_trend`), with its interval over the same replicates:
   which metric a larger n buys at a fixed compute.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from isosweep.algo import MIN_GROUP
from isosweep.algo.estimators import best_at_k, mean_at_k, sampling_se_of_mean, worst_at_k
from isosweep.report import frontier as F
from isosweep.report.plots import png, pyplot
from isosweep.report.tables import fmt, text_table
from isosweep.track.curves import Curve

SATURATION_GRID = 64
"""Compute points (log-spaced) on which ``n*(C)`` is scanned for its saturation point."""

SATURATION_SPAN = 4.0
"""Saturation is claimed only for an n* that stays put (interior, no tie) over at least this factor in C."""

P_BEST_FLOOR = 0.05
"""A config winning in at least this fraction of bootstrap replicates is in n*'s interval."""

ESTIMATORS = {"mean": mean_at_k, "best": best_at_k, "worst": worst_at_k}


@dataclass
class MetricAnalysis:
    metric: str
    fits: dict[str, F.SigmoidFit]
    unfitted: dict[str, str]
    """config -> why it has no fit."""
    records: dict[str, tuple[np.ndarray, np.ndarray]]
    """config -> (compute, value) of the fitted points: each seed's running best at every eval with C > 0."""
    rows: list[dict]
    """The frontier table: C, config, value, low, high, n, Bp, M, p_best, runner_up, lead (low, high), tie,
    n_range, n_tie, identified, plus the observed best."""
    saturation: float | None
    """Smallest C from which an interior n* wins untied to the budget over >= SATURATION_SPAN x in C
    (None: not shown; nan: no fits)."""
    holdout: dict[str, dict]
    identified: dict[str, list[str]] = field(default_factory=dict)
    """config -> why its fit is not identified (empty list: identified)."""
    verdict: str = ""
    """The allocation verdict in words (grid edge, saturation, still changing, ties)."""
    decision: dict = field(default_factory=dict)
    """The decision hold-out (see :func:`decision_holdout`)."""
    base: float | None = None
    """The base model's measured value (R0 of every fit), None if no trial evaluated at compute 0."""
    replicates: int = 0
    """Bootstrap replicates behind P(best) and the intervals."""
    trend: dict = field(default_factory=dict)
    """How the fitted value moves with n at a fixed C (see :func:`n_trend`)."""


@dataclass
class Analysis:
    title: str
    study: str
    budget: int
    primary: str
    metrics: dict[str, MetricAnalysis]
    configs: dict[str, dict]
    curves: list[Curve] = field(repr=False)
    noise: str = ""
    """What the bootstrap resampled (seeds, paired eval problems, or jitter for trials without counts)."""
    difficulty: str = ""
    """The task's difficulty band (easy | hard) where the caller knows it."""
    pooled_from: tuple[str, ...] = ()
    """The sweeps whose trials were pooled into this analysis (empty: one sweep, ``title``)."""

    def seeds(self) -> list[int]:
        return sorted({int(c.fields["seed"]) for c in self.curves if "seed" in c.fields})

    def to_json(self) -> dict:
        out = {"title": self.title, "study": self.study, "budget": self.budget, "primary": self.primary,
               "difficulty": self.difficulty, "seeds": self.seeds(), "trials": len(self.curves),
               "configs": self.configs, "gains": gains(self), "noise": self.noise, "eval": eval_noise(self.curves),
               "metrics": {}}
        if self.pooled_from:
            out["pooled_from"] = list(self.pooled_from)
        for name, m in self.metrics.items():
            out["metrics"][name] = {
                "fits": {key: {"params": fit.params, "ci90": fit.ci, "points": fit.n, "converged": fit.success,
                               "bootstrap_refits": len(fit.boot), "not_identified": m.identified.get(key, [])}
                         for key, fit in m.fits.items()},
                "unfitted": m.unfitted,
                "base": m.base,
                "records": {key: {"compute": c.tolist(), "value": v.tolist()} for key, (c, v) in m.records.items()},
                "frontier": m.rows,
                "saturation_C": m.saturation,
                "verdict": m.verdict,
                "holdout": m.holdout,
                "decision_holdout": m.decision,
                "bootstrap_replicates": m.replicates,
                "n_trend": m.trend,
            }
        return json.loads(json.dumps(out, default=_json_default).replace("NaN", "null"))


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(type(value))


# --------------------------------------------------------------------------------- data


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
        return F.fit_sigmoid(c, v, bootstrap=0, R0=base, start=None if start is None else start.params)
    except ValueError:
        return None


def reached(curve: Curve, budget: float) -> float:
    """The compute a trial's data cover: its last evaluation, or the whole ``budget`` when that evaluation is
    within one step (``Bp * n`` rollouts) of it. A trial of ``M = C // (Bp * n)`` steps ends up to one step
    short of C, and it has still spent its budget: it competes at C like the configs that land on it."""
    last = float(curve.compute.max())
    step = curve.fields.get("Bp", 0) * curve.fields.get("n", 0)
    return float(budget) if budget - step < last <= budget else last


def observed_best(pairs_by_config: dict[str, list[tuple[Curve, np.ndarray]]], C: float) -> tuple[str | None, float]:
    """The config whose running best at compute <= C, averaged over its seeds, is highest, and that value."""
    best_key, best = None, -math.inf
    for key, pairs in pairs_by_config.items():
        seen = [float(values[curve.compute <= C].max()) for curve, values in pairs if np.any(curve.compute <= C)]
        if seen and np.mean(seen) > best:
            best_key, best = key, float(np.mean(seen))
    return best_key, best


def frontier_grid(curves: list[Curve], budget: int, points: int) -> np.ndarray:
    """``points`` compute values log-spaced from the smallest positive eval compute to the budget."""
    positive = np.concatenate([c.compute[c.compute > 0] for c in curves])
    low = float(positive.min()) if len(positive) else budget / 64
    high = max(float(budget), low * 1.0001)
    return np.unique(np.round(np.geomspace(low, high, points)))


# --------------------------------------------------------------------------------- statistics


def _predictions(fits: dict[str, F.SigmoidFit | None], reach: dict[str, float], keys: list[str],
                 grid: np.ndarray) -> np.ndarray:
    """``(configs, grid)`` fitted values, nan where a config has no fit or its data do not reach C."""
    out = np.full((len(keys), len(grid)), np.nan)
    for i, key in enumerate(keys):
        fit = fits.get(key)
        if fit is not None:
            inside = grid <= reach[key] * 1.0001
            out[i, inside] = fit.predict(grid[inside])
    return out


def frontier_rows(keys: list[str], configs: dict[str, dict], grid: np.ndarray, full: np.ndarray,
                  reps: np.ndarray) -> list[dict]:
    """The frontier table from the observed fits' values ``full`` ``(configs, grid)`` and the replicates'
    ``reps`` ``(replicates, configs, grid)`` (see the module docstring, step 4)."""
    rows = []
    for j, C in enumerate(grid):
        column = full[:, j]
        row = {"C": float(C), "config": None, "value": math.nan, "low": math.nan, "high": math.nan,
               "p_best": math.nan, "runner_up": None, "lead": math.nan, "lead_low": math.nan, "lead_high": math.nan,
               "tie": False, "n_range": [], "n_tie": False}
        if np.all(np.isnan(column)):
            rows.append(row)
            continue
        order = [int(i) for i in np.argsort(-np.nan_to_num(column, nan=-np.inf), kind="stable") if not np.isnan(column[i])]
        w = order[0]
        row.update(config=keys[w], value=float(column[w]), **configs[keys[w]])
        p_best = np.full(len(keys), np.nan)
        if len(reps):
            rep = reps[:, :, j]
            valid = ~np.all(np.isnan(rep), axis=1)
            if valid.any():
                winners = np.nanargmax(rep[valid], axis=1)
                p_best = np.bincount(winners, minlength=len(keys)) / valid.sum()
                own = rep[:, w][~np.isnan(rep[:, w])]
                if len(own):
                    row["low"], row["high"] = (float(q) for q in np.quantile(own, [0.05, 0.95]))
            row["p_best"] = float(p_best[w])
            row["n_range"] = sorted({configs[keys[i]]["n"] for i in range(len(keys)) if p_best[i] >= P_BEST_FLOOR}
                                    | {configs[keys[w]]["n"]})
        else:
            row["n_range"] = [configs[keys[w]]["n"]]
        if len(order) > 1:
            # The runner-up is the closest challenger: the next fitted value, or with replicates the
            # config whose lead interval comes nearest to (or across) zero.
            challengers = []
            for r in order[1:]:
                low = high = math.nan
                if len(reps):
                    diff = reps[:, w, j] - reps[:, r, j]
                    diff = diff[~np.isnan(diff)]
                    if len(diff):
                        low, high = (float(q) for q in np.quantile(diff, [0.05, 0.95]))
                challengers.append((r, low, high))
            r, low, high = min(challengers, key=lambda t: (np.nan_to_num(t[1], nan=np.inf), column[w] - column[t[0]]))
            row.update(runner_up=keys[r], lead=float(column[w] - column[r]), lead_low=low, lead_high=high,
                       tie=bool(not math.isnan(low) and low <= 0.0))
            # n* is tied when the n that win 5% of the replicates are several, or the winner ties with a config of
            # another n; two configs of one n (n4-Bp16 ~ n4-Bp32) tied still name n*.
            row["n_tie"] = len(row["n_range"]) > 1 or (row["tie"] and configs[keys[r]]["n"] != row["n"])
        rows.append(row)
    return rows


def n_slope(values: np.ndarray, configs: list[dict]) -> float:
    """The change of ``values`` (one per config) per doubling of n at a fixed Bp: the least-squares slope
    on log2 n within each Bp that has at least two n with a value, averaged over those Bps (nan if none)."""
    slopes = []
    for bp in sorted({cfg["Bp"] for cfg in configs}):
        pts = [(math.log2(cfg["n"]), v) for cfg, v in zip(configs, values) if cfg["Bp"] == bp and not np.isnan(v)]
        if len({x for x, _ in pts}) >= 2:
            x, y = np.array(pts).T
            slopes.append(float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2)))
    return float(np.mean(slopes)) if slopes else math.nan


def n_trend(keys: list[str], configs: dict[str, dict], grid: np.ndarray, full: np.ndarray, reps: np.ndarray) -> dict:
    """How the fitted value moves as n grows at a fixed C: :func:`n_slope` at the largest C of ``grid``
    where at least two n of one Bp have a fit reaching it, with its 90% interval over the replicates.
    ``grows``/``falls`` only when the interval excludes 0; otherwise ``tie``. Empty if no such C."""
    cfgs = [configs[key] for key in keys]
    for j in range(len(grid) - 1, -1, -1):
        slope = n_slope(full[:, j], cfgs)
        if math.isnan(slope):
            continue
        reps_slopes = np.array([n_slope(rep[:, j], cfgs) for rep in reps]) if len(reps) else np.empty(0)
        reps_slopes = reps_slopes[~np.isnan(reps_slopes)]
        low, high = (float(q) for q in np.quantile(reps_slopes, [0.05, 0.95])) if len(reps_slopes) else (math.nan,
                                                                                                           math.nan)
        direction = "tie" if math.isnan(low) or low <= 0.0 <= high else ("grows" if low > 0 else "falls")
        return {"C": float(grid[j]), "slope_per_doubling": slope, "low": low, "high": high, "direction": direction,
                "n": sorted({cfg["n"] for cfg, v in zip(cfgs, full[:, j]) if not np.isnan(v)})}
    return {}


def n_tied(row: dict) -> bool:
    """Whether a frontier row's n* is within noise of another n (``n_tie``; rows saved before it existed: the
    winner's tie with its runner-up, the stricter reading)."""
    return bool(row.get("n_tie", row.get("tie", False)))


def allocation_verdict(rows: list[dict], grid_n: list[int]) -> tuple[float | None, str]:
    """The saturation point (or None) and the verdict in words (module docstring, step 5)."""
    fitted = [r for r in rows if r["config"] is not None]
    if not fitted:
        return math.nan, "n*(C): no config could be fitted"
    smallest, largest = min(grid_n), max(grid_n)
    if smallest == largest:
        return None, f"one n studied (n = {smallest}): this study ranks no n, so it says nothing of n*(C)"
    last = fitted[-1]
    if last["n"] == smallest == MIN_GROUP and smallest != largest:
        floor = [r for r in fitted if r["n"] == last["n"]]
        return None, (f"n* at n = {MIN_GROUP}, the smallest group GRPO can use (not a grid edge to extend), at C = "
                      f"{floor[0]['C']:,.0f} to {last['C']:,.0f}: n*(C) cannot fall further, and neither growth nor "
                      "saturation is shown")
    if last["n"] in (smallest, largest) and smallest != largest:
        side, direction = ("smallest", "smaller") if last["n"] == smallest else ("largest", "larger")
        edge = [r for r in fitted if r["n"] == last["n"]]
        return None, (f"n* at the grid edge (n = {last['n']}, the {side} n of the grid) at C = {edge[0]['C']:,.0f} to "
                      f"{last['C']:,.0f}: extend the grid to {direction} n before reading n*(C) as saturated")
    run = []
    for row in reversed(fitted):
        if row["n"] != last["n"] or n_tied(row):
            break
        run.append(row)
    if run and run[-1]["C"] * SATURATION_SPAN <= last["C"] * 1.0001:
        return run[-1]["C"], (f"n*(C) saturates: n* = {last['n']} (interior, untied) from C = {run[-1]['C']:,.0f} "
                              f"to {last['C']:,.0f} rollouts ({last['C'] / run[-1]['C']:.1f}x in C)")
    if n_tied(last) and len(last.get("n_range") or []) > 1:
        return None, (f"no saturation shown: at C = {last['C']:,.0f} n* is within noise of several n: n in "
                      f"{{{', '.join(map(str, last['n_range']))}}} each win at least {P_BEST_FLOOR:.0%} of the "
                      f"bootstrap replicates (winner {last['config']}, closest challenger {last['runner_up']}, lead "
                      f"{fmt(last['lead'])}, 90% CI [{fmt(last['lead_low'])}, {fmt(last['lead_high'])}]); more seeds "
                      "or eval problems would separate them")
    if n_tied(last):
        return None, (f"no saturation shown: at C = {last['C']:,.0f} the winner {last['config']} ties with "
                      f"{last['runner_up']} (lead {fmt(last['lead'])}, 90% CI [{fmt(last['lead_low'])}, "
                      f"{fmt(last['lead_high'])}]); more seeds or eval problems would separate them")
    span = last["C"] / run[-1]["C"] if run else 1.0
    return None, (f"no saturation shown: n* = {last['n']} holds over only {span:.1f}x in C at the end "
                  f"(saturation needs an untied interior n* over {SATURATION_SPAN:g}x): run to a larger budget")


def config_holdout(pairs: list[tuple[Curve, np.ndarray]], base: float | None, c_max: float,
                   fraction: float = 0.25) -> dict:
    """One config's hold-out: the fit the frontier uses (each seed's running best, ``R0 = base``) on
    ``C <= fraction * c_max`` only, its value at ``c_max`` (``predicted``) against the mean over seeds of the running
    best there (``observed``, None when no seed reached ``c_max``); ``abs_error``, ``n_fit_points`` and ``reason``
    (why there is no prediction, else None)."""
    ends = [float(values.max()) for curve, values in pairs if reached(curve, c_max) >= c_max]
    c, v = running_best_points(pairs)
    window = c <= fraction * c_max
    out = {"predicted": None, "observed": float(np.mean(ends)) if ends else None, "abs_error": None,
           "n_fit_points": int(window.sum()), "reason": why_unfittable(c[window], v[window], base)}
    fit = None if out["reason"] else fit_points(c[window], v[window], base)
    if fit is None:
        out["reason"] = out["reason"] or "the fit failed"
        return out
    out["predicted"] = float(fit.predict(c_max))
    if out["observed"] is not None:
        out["abs_error"] = abs(out["predicted"] - out["observed"])
    return out


def data_c_max(pairs_by_config: dict[str, list[tuple[Curve, np.ndarray]]]) -> float:
    """The largest compute any trial's evaluations reach."""
    return max(float(curve.compute.max()) for pairs in pairs_by_config.values() for curve, _ in pairs)


def decision_holdout(pairs_by_config: dict[str, list[tuple[Curve, np.ndarray]]], base: float | None,
                     fraction: float = 0.25) -> dict:
    """Fit every config on ``C <= fraction * C_max`` only (:func:`config_holdout`), predict the winner and its value
    at ``C_max``, and compare with what was observed there (mean over seeds of the running best)."""
    c_max = data_c_max(pairs_by_config)
    predicted, observed = {}, {}
    for key, pairs in pairs_by_config.items():
        h = config_holdout(pairs, base, c_max, fraction)
        if h["observed"] is not None:
            observed[key] = h["observed"]
        if h["predicted"] is not None:
            predicted[key] = h["predicted"]
    out = {"C_max": c_max, "fit_window": fraction * c_max, "predicted_config": None, "observed_config": None,
           "hit": None, "predicted_value": None, "observed_value": None, "abs_error": None, "reason": None}
    if not predicted or not observed:
        out["reason"] = f"too few evaluations at C <= {fraction:g} * C_max for a fit, or no trial reached C_max"
        return out
    p_key, o_key = max(predicted, key=predicted.get), max(observed, key=observed.get)
    if len(pairs_by_config) < 2:  # nothing to choose between: only the value tests the fit
        out["reason"] = (f"one config, no decision to predict; its fit on C <= {fraction:g} * C_max gave "
                         f"{fmt(predicted[p_key])} at C_max, observed {fmt(observed.get(p_key))}")
        return out
    out.update(predicted_config=p_key, observed_config=o_key, hit=p_key == o_key, predicted_value=predicted[p_key],
               observed_value=observed.get(p_key), abs_error=abs(predicted[p_key] - observed[p_key])
               if p_key in observed else None)
    return out


def holdout_outcome(rows: list[dict], configs: dict[str, dict], d: dict) -> str:
    """``hit``, ``miss``, or ``tie`` for a decision hold-out ``d`` against the frontier ``rows`` it was made for:
    ``tie`` when the frontier at C_max cannot tell the predicted config from the observed best (a tie whose
    winner or runner-up it is, or whose n* set holds its n at its Bp). A prediction of the observed best is a tie
    too when that best ties with its runner-up: picking one of two configs the data cannot separate decides no more
    than missing it by one."""
    rows = [r for r in rows if r.get("config")]
    if d["hit"]:
        return "tie" if rows and rows[-1].get("tie") else "hit"
    if not rows:
        return "miss"
    last, predicted = rows[-1], d["predicted_config"]
    cfg = configs.get(predicted, {})
    if predicted in (last["config"], last.get("runner_up")) and last.get("tie"):
        return "tie"
    if last.get("tie") and cfg.get("Bp") == last.get("Bp") and cfg.get("n") in last.get("n_range", []):
        return "tie"
    return "miss"


HOLDOUT_WORDS = {"hit": "hit", "miss": "miss",
                 "hit-tie": "a hit against a tie: the observed best at C_max is within noise of its runner-up, so it "
                            "decides nothing",
                 "miss-tie": "a miss against a tie: the predicted config is within noise of the observed best at "
                             "C_max, so it decides nothing"}
"""How a decision hold-out's outcome reads, in the frontier text and the study report."""


def holdout_words(outcome: str, hit: bool) -> str:
    """The words for a hold-out's ``outcome`` (:func:`holdout_outcome`); ``hit``: its pick was the observed best."""
    return HOLDOUT_WORDS[outcome if outcome != "tie" else ("hit-tie" if hit else "miss-tie")]


def analyse(curves: list[Curve], *, title: str, study: str, budget: int, primary: str, points: int = 8,
            bootstrap: int = 200, seed: int = 0, difficulty: str = "") -> Analysis:
    """Fit every config on every metric the curves carry, build each frontier with its bootstrap statistics."""
    if not curves:
        raise ValueError("no trial has any evaluation yet: nothing to analyse")
    configs: dict[str, dict] = {}
    for curve in curves:
        configs.setdefault(curve.config, {k: v for k, v in curve.fields.items() if k in ("n", "Bp", "M")})
    keys = list(configs)
    metric_names = sorted(set.intersection(*(set(c.values) for c in curves)))
    if primary not in metric_names:
        raise ValueError(f"metric {primary!r} is not in the curves (have {metric_names})")
    grid = frontier_grid(curves, budget, points)
    fine = np.geomspace(grid[0], grid[-1], SATURATION_GRID)
    both = np.concatenate([grid, fine])
    reach = {key: max(reached(c, budget) for c in curves if c.config == key) for key in keys}
    sampler = Resampler(curves, metric_names)

    def by_config(pairs: list[tuple[Curve, np.ndarray]]) -> dict[str, list[tuple[Curve, np.ndarray]]]:
        out: dict[str, list] = {key: [] for key in keys}
        for curve, values in pairs:
            out[curve.config].append((curve, values))
        return out

    observed = sampler.draw(None)
    rng = np.random.default_rng(seed)
    replicates = [sampler.draw(rng) for _ in range(bootstrap)]
    results = {}
    for metric in metric_names:
        groups = by_config(observed[metric])
        base, c_max = base_value(observed[metric]), data_c_max(groups)
        fits, unfitted, records, holdout, identified = {}, {}, {}, {}, {}
        for key, pairs in groups.items():
            c, v = running_best_points(pairs)
            records[key] = (c, v)
            why = why_unfittable(c, v, base)
            fit = None if why else fit_points(c, v, base)
            if fit is None:
                unfitted[key] = why or "the fit failed"
                continue
            fits[key] = fit
            identified[key] = F.identification(fit, reach[key])
            holdout[key] = config_holdout(pairs, base, c_max)
        full = _predictions(fits, reach, keys, both)
        reps, boots = [], {key: [] for key in fits}
        for replicate in replicates:
            pairs = replicate[metric]
            rep_base = base_value(pairs)
            rep_fits = {}
            for key, group in by_config(pairs).items():
                if key not in fits or not group:
                    continue
                c, v = running_best_points(group)
                if why_unfittable(c, v, rep_base) is None and (fit := fit_points(c, v, rep_base, start=fits[key])):
                    rep_fits[key] = fit
                    boots[key].append([fit.params[name] for name in F.PARAM_NAMES])
            reps.append(_predictions(rep_fits, reach, keys, both))
        reps_arr = np.stack(reps) if reps else np.empty((0, len(keys), len(both)))
        fits = {key: F.SigmoidFit(fit.params, fit.n, fit.success, np.asarray(boots[key]).reshape(-1, 4), fit.bounds)
                for key, fit in fits.items()}
        rows = frontier_rows(keys, configs, grid, full[:, :len(grid)], reps_arr[:, :, :len(grid)])
        for row in rows:
            row["observed_config"], row["observed_value"] = observed_best(groups, row["C"])
            row["identified"] = row["config"] is not None and not identified.get(row["config"])
        fine_rows = frontier_rows(keys, configs, fine, full[:, len(grid):], reps_arr[:, :, len(grid):])
        saturation, verdict = allocation_verdict(fine_rows, sorted({cfg["n"] for cfg in configs.values()}))
        trend = n_trend(keys, configs, grid, full[:, :len(grid)], reps_arr[:, :, :len(grid)])
        results[metric] = MetricAnalysis(metric, fits, unfitted, records, rows, saturation, holdout, identified,
                                         verdict, decision_holdout(groups, base), base, len(replicates), trend)
    return Analysis(title=title, study=study, budget=budget, primary=primary, metrics=results,
                    configs=configs, curves=curves, noise=sampler.describe(), difficulty=difficulty)


def eval_noise(curves: list[Curve]) -> dict:
    """The eval set behind the curves and the noise of one evaluation on it: problems x samples, and the
    standard error of mean@k from sampling alone (how much one evaluation of a policy moves when it is repeated
    on the same fixed problems; :func:`isosweep.algo.estimators.summarize`), median and largest over every
    evaluation with counts. Empty when no trial saved counts."""
    se, shapes = [], set()
    for curve in curves:
        if curve.counts is None or not curve.samples or curve.samples < 2:
            continue
        shapes.add((curve.counts.shape[1], curve.samples))
        se.extend(sampling_se_of_mean(curve.counts, curve.samples))
    if not se:
        return {}
    problems, samples = next(iter(shapes)) if len(shapes) == 1 else (None, None)
    return {"problems": problems, "samples": samples, "sampling_se_mean": {
        "median": float(np.median(se)), "max": float(np.max(se)), "evaluations": len(se)}}


def gains(analysis: Analysis) -> dict[str, dict[str, float]]:
    """Per metric: the base model's value (the mean of the evaluations at compute 0), the best
    value observed by C_max over all trials, and the difference -- which metric a sweep moved most.
    A metric without evaluations at compute 0 is left out."""
    out = {}
    for name in analysis.metrics:
        base = [float(c.values[name][c.compute == 0].mean()) for c in analysis.curves if np.any(c.compute == 0)]
        if not base:
            continue
        best = max(float(c.values[name].max()) for c in analysis.curves)
        out[name] = {"base": float(np.mean(base)), "best": best, "gain": best - float(np.mean(base))}
    return out


# --------------------------------------------------------------------------------- text


def _winner_cell(row: dict) -> str:
    if row["config"] is None:
        return "(no fit)"
    if row["tie"]:
        return f"tie: {row['config']} ~ {row['runner_up']}"
    return row["config"] + ("" if row.get("identified", True) else " (?)")


def table_text(analysis: Analysis, metric: str | None = None) -> str:
    """The frontier table of ``metric`` (default: the primary one) and the fitted curves, as text."""
    metric = metric or analysis.primary
    m = analysis.metrics[metric]
    lines = [f"frontier of {metric} -- {analysis.title} (C in rollouts per trial; M(C) = steps the best config takes "
             f"to reach C; fitted value with 90% CI; P(best) and the lead over the runner-up from {m.replicates} "
             f"bootstrap replicates: {analysis.noise})"]
    rows = []
    for row in m.rows:
        ci = f"[{fmt(row['low'])}, {fmt(row['high'])}]" if not math.isnan(row["low"]) else "-"
        steps_to_c = int(row["C"] // (row["n"] * row["Bp"])) if row["config"] else None
        observed = f"{row['observed_config']} {fmt(row['observed_value'])}" if row["observed_config"] else "-"
        n_cell = "-"
        if row["config"]:
            spread = row["n_range"]
            n_cell = str(row["n"]) + (f" [{min(spread)}-{max(spread)}]" if len(spread) > 1 else "")
        lead = "-"
        if row["runner_up"] is not None:
            lead = fmt(row["lead"], "+.3f") + (f" [{fmt(row['lead_low'], '+.3f')}, {fmt(row['lead_high'], '+.3f')}]"
                                               if not math.isnan(row["lead_low"]) else "")
        p_best = "-" if math.isnan(row["p_best"]) else f"{row['p_best']:.2f}"
        rows.append([f"{row['C']:,.0f}", _winner_cell(row), p_best, n_cell, str(row.get("Bp", "-")),
                     "-" if steps_to_c is None else str(steps_to_c), fmt(row["value"]), ci, lead, observed])
    lines += text_table(["C", "best config", "P(best)", "n* [90%]", "Bp*", "M(C)", "fitted", "90% CI",
                         "lead over runner-up [90%]", "observed best (seed mean)"], rows, "><>>>>><<<")
    lines.append(m.verdict)
    if any(not row.get("identified", True) for row in m.rows if row["config"]):
        lines.append("(?) the winner's fit is not identified (plateau on its bound or C_mid beyond its data): its "
                     "value is a lower bound of a curve still rising, not a measured plateau")
    d = m.decision
    if d.get("predicted_config"):
        outcome = holdout_words(holdout_outcome(m.rows, analysis.configs, d), d["hit"])
        lines.append(f"decision hold-out: fitted on C <= {d['fit_window']:,.0f}, the predicted best at C_max = "
                     f"{d['C_max']:,.0f} is {d['predicted_config']} ({fmt(d['predicted_value'])}); observed best "
                     f"{d['observed_config']} -> {outcome}"
                     + (f", value error {fmt(d['abs_error'])}" if d["abs_error"] is not None else ""))
    elif d:
        lines.append(f"decision hold-out: not possible ({d['reason']})")
    t = m.trend
    if t:
        lines.append(f"n trend at C = {t['C']:,.0f} (fixed Bp, n in {t['n']}): {t['slope_per_doubling']:+.4f} per doubling "
                     f"of n, 90% CI [{fmt(t['low'], '+.4f')}, {fmt(t['high'], '+.4f')}] -> "
                     + {"grows": "grows with n", "falls": "falls with n", "tie": "no trend beyond the noise"}[
                         t["direction"]])
    noise = eval_noise(analysis.curves)
    if noise:
        shape = (f"{noise['problems']} fixed problems x {noise['samples']} samples" if noise["problems"]
                 else "trials on eval sets of different sizes")
        se = noise["sampling_se_mean"]
        lines.append(f"eval: {shape}; one evaluation's standard error of mean@k from sampling alone (the same "
                     f"policy evaluated again on these problems): median {se['median']:.4f}, largest {se['max']:.4f} "
                     f"over {se['evaluations']} evaluations")
    moved = gains(analysis)
    if moved:
        lines.append("gain over the base model (compute 0) to the best observed by C_max: " + ", ".join(
            f"{name} {g['base']:.3f} -> {g['best']:.3f} ({g['gain']:+.3f})" for name, g in moved.items()))
    lines.append("")
    base = "R0 fixed to the base model's measured value" if m.base is not None else "R0 fitted (no evaluation at C = 0)"
    lines.append(f"fitted curves R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) on each seed's running best ({base}); "
                 "hold-out: the same fit on C <= C_max/4 only, its value at C_max against the seeds' mean observed there")
    rows = []
    for key in analysis.configs:
        if key not in m.fits:
            continue
        p = m.fits[key].params
        h = m.holdout.get(key, {})
        hold = (f"{fmt(h['predicted'])}/{fmt(h['observed'])}/{fmt(h['abs_error'])}"
                if h.get("predicted") is not None else f"- ({h.get('n_fit_points', 0)} points at C <= C_max/4)")
        issues = m.identified.get(key) or []
        rows.append([key, fmt(p["R0"]), fmt(p["A"]), f"{p['C_mid']:,.0f}", fmt(p["B"], ".2f"), str(m.fits[key].n), hold,
                     "yes" if not issues else "no: " + "; ".join(issues)])
    lines += text_table(["config", "R0", "A", "C_mid", "B", "points", "hold-out pred/obs/err", "identified"], rows,
                        "<>>>>><<")
    lines += [f"{key:<12} no fit: {why}" for key, why in m.unfitted.items()]
    return "\n".join(lines)


def write_csv(analysis: Analysis, path: Path) -> None:
    """Every metric's frontier table as one CSV (a ``metric`` column tells them apart)."""
    columns = ["metric", "C", "config", "n", "Bp", "M", "value", "low", "high", "p_best", "runner_up", "lead", "lead_low",
               "lead_high", "tie", "identified", "observed_config", "observed_value"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for name, m in analysis.metrics.items():
            for row in m.rows:
                writer.writerow({"metric": name, **row})


# --------------------------------------------------------------------------------- plots


def plot_frontier(analysis: Analysis) -> bytes:
    """One panel per metric: each config's eval curves (thin), each seed's running best (dots: the fitted
    points), fit (line), frontier (black)."""
    plt = pyplot()

    names = list(analysis.metrics)
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, name in zip(axes[0], names):
        m = analysis.metrics[name]
        grid = np.geomspace(m.rows[0]["C"], m.rows[-1]["C"], 200)
        for i, key in enumerate(analysis.configs):
            colour = colours[i % len(colours)]
            for curve in (c for c in analysis.curves if c.config == key):
                keep = curve.compute > 0
                ax.plot(curve.compute[keep], curve.values[name][keep], color=colour, alpha=0.25, lw=1)
            c, v = m.records[key]
            ax.scatter(c[c > 0], v[c > 0], color=colour, s=14, zorder=3)
            if key in m.fits:
                ax.plot(grid, m.fits[key].predict(grid), color=colour, lw=1.6, label=key)
            else:
                ax.plot([], [], color=colour, lw=1.6, ls=":", label=f"{key} (no fit)")
        if m.fits:
            envelope = np.max([fit.predict(grid) for fit in m.fits.values()], axis=0)
            ax.plot(grid, envelope, color="black", lw=2.4, alpha=0.8, label="frontier")
        ax.set_xscale("log")
        ax.set_xlabel("compute C (rollouts)")
        ax.set_ylabel(name)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(analysis.title)
    data = png(fig)
    plt.close(fig)
    return data


def plot_allocation(analysis: Analysis) -> bytes:
    """n*(C) and Bp*(C) of the primary metric, on the table's compute grid."""
    plt = pyplot()

    m = analysis.metrics[analysis.primary]
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [r for r in m.rows if r["config"]]
    if rows:
        C = [r["C"] for r in rows]
        ax.step(C, [r["n"] for r in rows], where="post", marker="o", label="n*(C)")
        ax.step(C, [r["Bp"] for r in rows], where="post", marker="s", label="Bp*(C)")
        if m.saturation not in (None,) and not (isinstance(m.saturation, float) and math.isnan(m.saturation)):
            ax.axvline(m.saturation, color="grey", ls="--", label=f"n* saturates ({m.saturation:,.0f})")
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("compute C (rollouts)")
    ax.set_ylabel("optimal value")
    ax.set_title(f"compute-optimal allocation ({analysis.primary})")
    ax.grid(alpha=0.3)
    if rows:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no config could be fitted", transform=ax.transAxes, ha="center")
    data = png(fig)
    plt.close(fig)
    return data


def fixed_batch_rows(analysis: Analysis, budgets: int = 4) -> list[tuple[float, list[int], list[float], list[bool]]]:
    """The fixed-batch trade-off at up to ``budgets`` compute values of the frontier grid (always
    the last): for each, the configs' n (ascending), their primary-metric value -- fitted where the
    config has a fit, else the best observed by that compute -- and whether it is fitted."""
    m = analysis.metrics[analysis.primary]
    keys = sorted(analysis.configs, key=lambda k: analysis.configs[k]["n"])
    picks = sorted({int(round(i)) for i in np.linspace(0, len(m.rows) - 1, min(budgets, len(m.rows)))})
    out = []
    for i in picks:
        C = m.rows[i]["C"]
        values, fitted = [], []
        for key in keys:
            if key in m.fits:
                values.append(float(m.fits[key].predict(C)))
            else:
                seen = [c.values[analysis.primary][c.compute <= C] for c in analysis.curves if c.config == key]
                values.append(max((float(v.max()) for v in seen if len(v)), default=math.nan))
            fitted.append(key in m.fits)
        out.append((C, [analysis.configs[k]["n"] for k in keys], values, fitted))
    return out


def plot_fixed_batch(analysis: Analysis) -> bytes:
    """Fixed-batch trade-off: the primary metric against n (Bp = B / n) at several budgets;
    filled markers are fitted values, hollow ones the best observed (configs without a fit)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for C, ns, values, fitted in fixed_batch_rows(analysis):
        line, = ax.plot(ns, values, label=f"C = {C:,.0f}")
        for n, v, f in zip(ns, values, fitted):
            ax.plot([n], [v], marker="o", color=line.get_color(), markerfacecolor=line.get_color() if f else "none")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (rollouts per problem); Bp = B / n")
    ax.set_ylabel(f"{analysis.primary} (filled: fitted, hollow: observed)")
    ax.set_title("fixed batch: n vs Bp")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    data = png(fig)
    plt.close(fig)
    return data


# --------------------------------------------------------------------------------- files


def write_outputs(analysis: Analysis, folder: str | Path) -> dict[str, Path]:
    """Write the frontier table (CSV + text), fitted parameters (JSON), plots (PNG) and an HTML
    report (plots embedded, so the file stands alone) into ``folder``; returns name -> path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in ("frontier.csv", "frontier.txt", "fits.json", "frontier.png",
                                               "allocation.png", "report.html")}
    write_csv(analysis, paths["frontier.csv"])
    paths["frontier.txt"].write_text("\n\n".join(table_text(analysis, m) for m in analysis.metrics) + "\n")
    paths["fits.json"].write_text(json.dumps(analysis.to_json(), indent=1))
    images = {"frontier.png": plot_frontier(analysis), "allocation.png": plot_allocation(analysis)}
    if analysis.study == "fixed-batch":
        images["fixed_batch.png"] = plot_fixed_batch(analysis)
        paths["fixed_batch.png"] = folder / "fixed_batch.png"
    for name, data in images.items():
        paths[name].write_bytes(data)
    paths["report.html"].write_text(report_html(analysis, images))
    return paths


def report_html(analysis: Analysis, images: dict[str, bytes]) -> str:
    figures = "".join(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
                      f'{base64.b64encode(data).decode()}"><figcaption>{html.escape(name)}</figcaption></figure>'
                      for name, data in images.items())
    tables = "".join(f"<h2>{html.escape(name)}</h2><pre>{html.escape(table_text(analysis, name))}</pre>"
                     for name in [analysis.primary] + [m for m in analysis.metrics if m != analysis.primary])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(analysis.title)} -- frontier</title>
<style>body{{font-family:sans-serif;max-width:1500px;margin:2em auto;padding:0 1em}}
img{{max-width:100%}}pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}</style></head>
<body id="isosweep-frontier"><h1>{html.escape(analysis.title)}</h1>
<p>Study <b>{html.escape(analysis.study)}</b>, budget C = {analysis.budget:,} rollouts per trial,
{len(analysis.curves)} trials, {len(analysis.configs)} configs. Each config's record-breaking
evaluations are fitted with R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); the frontier is the best
fitted config at each compute, n*(C) and Bp*(C) its allocation.</p>
{figures}{tables}</body></html>
"""
