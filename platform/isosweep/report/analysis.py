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

Beside the frontier, the trials' step-0 **zero-signal check** (the fraction of GRPO groups without
signal against what the base model's probe predicts) is pooled over the study and flagged when the
two disagree beyond noise (:func:`zero_signal_summary`): a wrong reward, sampler or grouping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from isosweep.algo import MIN_GROUP
from isosweep.algo.estimators import sampling_se_of_mean
from isosweep.report import frontier as F
from isosweep.report.fitting import (
    AllocationFits,
    Pairs,
    fit_allocations,
    fit_points,
    reached,
    running_best_points,
    why_unfittable,
)
from isosweep.report.schema import (
    ConfigHoldout,
    DecisionHoldout,
    EvalNoise,
    FrontierRow,
    Gain,
    NTrend,
    Points,
    SavedAnalysis,
    SavedFit,
    SavedMetric,
    ZeroSignalSummary,
)
from isosweep.report.tables import fmt
from isosweep.track.curves import Curve

SATURATION_GRID = 64
"""Compute points (log-spaced) on which ``n*(C)`` is scanned for its saturation point."""

SATURATION_SPAN = 4.0
"""Saturation is claimed only for an n* that stays put (interior, no tie) over at least this factor in C."""

P_BEST_FLOOR = 0.05
"""A config winning in at least this fraction of bootstrap replicates is in n*'s interval."""

ZERO_SIGNAL_Z = 3.0
"""A study's zero-signal check disagrees beyond noise when the z-score of its pooled difference (observed -
expected) exceeds this in size. If the prediction is right the z-score is close to a standard normal (a sum over
every trial's step-0 groups), so a right study is flagged about once in 370 (two-sided 0.27%): rare enough that
every flag is worth reading, while a broken reward, sampler or grouping (a reward that never pays makes every
group signal-free) moves the pooled difference by many sd. The margin also absorbs what the sd leaves out: trials
of one seed draw overlapping step-0 batches (the same problems, hence correlated outcomes), which makes the pooled
sd somewhat too small."""


@dataclass(frozen=True)
class MetricAnalysis:
    """One metric's analysis, with its live fits (:meth:`Analysis.saved` keeps what a file holds of it)."""

    metric: str
    fits: dict[str, F.SigmoidFit]
    """config -> its sigmoid, the bootstrap refits' parameters in ``boot``."""
    unfitted: dict[str, str]
    """config -> why it has no fit."""
    records: dict[str, tuple[np.ndarray, np.ndarray]]
    """config -> (compute, value) of the fitted points: each seed's running best at every eval with C > 0."""
    rows: list[FrontierRow]
    """The frontier table, one row per compute of its grid."""
    saturation: float | None
    """Smallest C from which an interior n* wins untied to the budget over >= SATURATION_SPAN x in C
    (None: not shown; nan: no fits)."""
    holdout: dict[str, ConfigHoldout]
    """config -> its own hold-out (fitted configs only)."""
    identified: dict[str, list[str]]
    """config -> why its fit is not identified (empty list: identified)."""
    verdict: str
    """The allocation verdict in words (grid edge, saturation, still changing, ties)."""
    decision: DecisionHoldout
    """The decision hold-out (see :func:`decision_holdout`)."""
    base: float | None
    """The base model's measured value (R0 of every fit), None if no trial evaluated at compute 0."""
    replicates: int
    """Bootstrap replicates behind P(best) and the intervals."""
    trend: NTrend | None
    """How the fitted value moves with n at a fixed C (see :func:`n_trend`)."""

    def saved(self) -> SavedMetric:
        fits = {key: SavedFit({k: float(v) for k, v in fit.params.items()}, fit.ci, fit.n, bool(fit.success),
                              len(fit.boot), tuple(self.identified.get(key, [])))
                for key, fit in self.fits.items()}
        records = {key: Points(tuple(c.tolist()), tuple(v.tolist())) for key, (c, v) in self.records.items()}
        return SavedMetric(fits, dict(self.unfitted), self.base, records, tuple(self.rows), self.saturation,
                           self.verdict, dict(self.holdout), self.decision, self.replicates, self.trend)


@dataclass
class Analysis:
    """A sweep's (or a pooled study's) frontier analysis: every metric's fits and frontier, and the curves."""

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

    def saved(self) -> SavedAnalysis:
        """What ``fits.json`` keeps of it (:mod:`isosweep.report.schema`)."""
        return SavedAnalysis(self.title, self.study, self.budget, self.primary, self.difficulty, tuple(self.seeds()),
                             len(self.curves), {k: {f: int(v) for f, v in cfg.items()} for k, cfg in self.configs.items()},
                             gains(self), self.noise, eval_noise(self.curves),
                             {name: m.saved() for name, m in self.metrics.items()}, tuple(self.pooled_from),
                             zero_signal_summary(self.curves))

    def to_json(self) -> dict:
        return self.saved().to_json()


# --------------------------------------------------------------------------------- data


def observed_best(pairs_by_config: dict[str, Pairs], C: float) -> tuple[str | None, float]:
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
                  reps: np.ndarray) -> list[FrontierRow]:
    """The frontier table from the observed fits' values ``full`` ``(configs, grid)`` and the replicates'
    ``reps`` ``(replicates, configs, grid)`` (see the module docstring, step 4); the observed best and whether
    the winner is identified are left for the caller."""
    return [_frontier_row(keys, configs, float(C), full[:, j], reps[:, :, j]) for j, C in enumerate(grid)]


def _frontier_row(keys: list[str], configs: dict[str, dict], C: float, column: np.ndarray,
                  rep: np.ndarray) -> FrontierRow:
    """One row of :func:`frontier_rows`: ``column`` the configs' fitted values at ``C``, ``rep`` the replicates'."""
    if np.all(np.isnan(column)):
        return FrontierRow(C)
    order = [int(i) for i in np.argsort(-np.nan_to_num(column, nan=-np.inf), kind="stable") if not np.isnan(column[i])]
    w = order[0]
    cfg = configs[keys[w]]
    row = {"C": C, "config": keys[w], "value": float(column[w]), "n": cfg.get("n"), "Bp": cfg.get("Bp"),
           "M": cfg.get("M")}
    if len(rep):
        p_best = np.full(len(keys), np.nan)
        valid = ~np.all(np.isnan(rep), axis=1)
        if valid.any():
            p_best = np.bincount(np.nanargmax(rep[valid], axis=1), minlength=len(keys)) / valid.sum()
            own = rep[:, w][~np.isnan(rep[:, w])]
            if len(own):
                row["low"], row["high"] = (float(q) for q in np.quantile(own, [0.05, 0.95]))
        row["p_best"] = float(p_best[w])
        row["n_range"] = tuple(sorted({configs[keys[i]]["n"] for i in range(len(keys)) if p_best[i] >= P_BEST_FLOOR}
                                      | {cfg["n"]}))
    else:
        row["n_range"] = (cfg["n"],)
    if len(order) > 1:
        # The runner-up is the closest challenger: the next fitted value, or with replicates the
        # config whose lead interval comes nearest to (or across) zero.
        challengers = []
        for r in order[1:]:
            low = high = math.nan
            if len(rep):
                diff = rep[:, w] - rep[:, r]
                diff = diff[~np.isnan(diff)]
                if len(diff):
                    low, high = (float(q) for q in np.quantile(diff, [0.05, 0.95]))
            challengers.append((r, low, high))
        r, low, high = min(challengers, key=lambda t: (np.nan_to_num(t[1], nan=np.inf), column[w] - column[t[0]]))
        tie = bool(not math.isnan(low) and low <= 0.0)
        row.update(runner_up=keys[r], lead=float(column[w] - column[r]), lead_low=low, lead_high=high, tie=tie,
                   # n* is tied when the n that win 5% of the replicates are several, or the winner ties with a
                   # config of another n; two configs of one n (n4-Bp16 ~ n4-Bp32) tied still name n*.
                   n_tie=len(row["n_range"]) > 1 or (tie and configs[keys[r]]["n"] != cfg["n"]))
    return FrontierRow(**row)


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


def n_trend(keys: list[str], configs: dict[str, dict], grid: np.ndarray, full: np.ndarray,
            reps: np.ndarray) -> NTrend | None:
    """How the fitted value moves as n grows at a fixed C: :func:`n_slope` at the largest C of ``grid``
    where at least two n of one Bp have a fit reaching it, with its 90% interval over the replicates.
    ``grows``/``falls`` only when the interval excludes 0; otherwise ``tie``. None if no such C."""
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
        return NTrend(float(grid[j]), slope, low, high, direction,
                      tuple(sorted({cfg["n"] for cfg, v in zip(cfgs, full[:, j]) if not np.isnan(v)})))
    return None


def allocation_verdict(rows: list[FrontierRow], grid_n: list[int]) -> tuple[float | None, str]:
    """The saturation point (or None) and the verdict in words (module docstring, step 5)."""
    fitted = [r for r in rows if r.config is not None]
    if not fitted:
        return math.nan, "n*(C): no config could be fitted"
    smallest, largest = min(grid_n), max(grid_n)
    if smallest == largest:
        return None, f"one n studied (n = {smallest}): this study ranks no n, so it says nothing of n*(C)"
    last = fitted[-1]
    if last.n == smallest == MIN_GROUP and smallest != largest:
        floor = [r for r in fitted if r.n == last.n]
        return None, (f"n* at n = {MIN_GROUP}, the smallest group GRPO can use (not a grid edge to extend), at C = "
                      f"{floor[0].C:,.0f} to {last.C:,.0f}: n*(C) cannot fall further, and neither growth nor "
                      "saturation is shown")
    if last.n in (smallest, largest) and smallest != largest:
        side, direction = ("smallest", "smaller") if last.n == smallest else ("largest", "larger")
        edge = [r for r in fitted if r.n == last.n]
        return None, (f"n* at the grid edge (n = {last.n}, the {side} n of the grid) at C = {edge[0].C:,.0f} to "
                      f"{last.C:,.0f}: extend the grid to {direction} n before reading n*(C) as saturated")
    run = []
    for row in reversed(fitted):
        if row.n != last.n or row.n_tie:
            break
        run.append(row)
    if run and run[-1].C * SATURATION_SPAN <= last.C * 1.0001:
        return run[-1].C, (f"n*(C) saturates: n* = {last.n} (interior, untied) from C = {run[-1].C:,.0f} "
                              f"to {last.C:,.0f} rollouts ({last.C / run[-1].C:.1f}x in C)")
    if last.n_tie and len(last.n_range) > 1:
        return None, (f"no saturation shown: at C = {last.C:,.0f} n* is within noise of several n: n in "
                      f"{{{', '.join(map(str, last.n_range))}}} each win at least {P_BEST_FLOOR:.0%} of the "
                      f"bootstrap replicates (winner {last.config}, closest challenger {last.runner_up}, lead "
                      f"{fmt(last.lead)}, 90% CI [{fmt(last.lead_low)}, {fmt(last.lead_high)}]); more seeds "
                      "or eval problems would separate them")
    if last.n_tie:
        return None, (f"no saturation shown: at C = {last.C:,.0f} the winner {last.config} ties with "
                      f"{last.runner_up} (lead {fmt(last.lead)}, 90% CI [{fmt(last.lead_low)}, "
                      f"{fmt(last.lead_high)}]); more seeds or eval problems would separate them")
    span = last.C / run[-1].C if run else 1.0
    return None, (f"no saturation shown: n* = {last.n} holds over only {span:.1f}x in C at the end "
                  f"(saturation needs an untied interior n* over {SATURATION_SPAN:g}x): run to a larger budget")


def config_holdout(pairs: Pairs, base: float | None, c_max: float, fraction: float = 0.25) -> ConfigHoldout:
    """One config's hold-out: the fit the frontier uses (each seed's running best, ``R0 = base``) on
    ``C <= fraction * c_max`` only, its value at ``c_max`` against the mean over seeds of the running best there."""
    ends = [float(values.max()) for curve, values in pairs if reached(curve, c_max) >= c_max]
    observed = float(np.mean(ends)) if ends else None
    c, v = running_best_points(pairs)
    window = c <= fraction * c_max
    why = why_unfittable(c[window], v[window], base)
    fit = None if why else fit_points(c[window], v[window], base)
    if fit is None:
        return ConfigHoldout(None, observed, None, int(window.sum()), why or "the fit failed")
    predicted = float(fit.predict(c_max))
    return ConfigHoldout(predicted, observed, None if observed is None else abs(predicted - observed),
                         int(window.sum()), None)


def data_c_max(pairs_by_config: dict[str, Pairs]) -> float:
    """The largest compute any trial's evaluations reach."""
    return max(float(curve.compute.max()) for pairs in pairs_by_config.values() for curve, _ in pairs)


def decision_holdout(pairs_by_config: dict[str, Pairs], base: float | None, fraction: float = 0.25) -> DecisionHoldout:
    """Fit every config on ``C <= fraction * C_max`` only (:func:`config_holdout`), predict the winner and its value
    at ``C_max``, and compare with what was observed there (mean over seeds of the running best)."""
    c_max = data_c_max(pairs_by_config)
    predicted, observed = {}, {}
    for key, pairs in pairs_by_config.items():
        h = config_holdout(pairs, base, c_max, fraction)
        if h.observed is not None:
            observed[key] = h.observed
        if h.predicted is not None:
            predicted[key] = h.predicted
    if not predicted or not observed:
        return DecisionHoldout(c_max, fraction * c_max, reason=f"too few evaluations at C <= {fraction:g} * C_max for "
                                                               "a fit, or no trial reached C_max")
    p_key, o_key = max(predicted, key=predicted.get), max(observed, key=observed.get)
    if len(pairs_by_config) < 2:  # nothing to choose between: only the value tests the fit
        return DecisionHoldout(c_max, fraction * c_max, reason=(
            f"one config, no decision to predict; its fit on C <= {fraction:g} * C_max gave {fmt(predicted[p_key])} "
            f"at C_max, observed {fmt(observed.get(p_key))}"))
    return DecisionHoldout(c_max, fraction * c_max, p_key, o_key, p_key == o_key, predicted[p_key],
                           observed.get(p_key), abs(predicted[p_key] - observed[p_key]) if p_key in observed else None)


def holdout_outcome(rows: Sequence[FrontierRow], configs: dict[str, dict], d: DecisionHoldout) -> str:
    """``hit``, ``miss``, or ``tie`` for a decision hold-out ``d`` against the frontier ``rows`` it was made for:
    ``tie`` when the frontier at C_max cannot tell the predicted config from the observed best (a tie whose
    winner or runner-up it is, or whose n* set holds its n at its Bp). A prediction of the observed best is a tie
    too when that best ties with its runner-up: picking one of two configs the data cannot separate decides no more
    than missing it by one."""
    rows = [r for r in rows if r.config]
    if d.hit:
        return "tie" if rows and rows[-1].tie else "hit"
    if not rows:
        return "miss"
    last, predicted = rows[-1], d.predicted_config
    cfg = configs.get(predicted, {})
    if predicted in (last.config, last.runner_up) and last.tie:
        return "tie"
    if last.tie and cfg.get("Bp") == last.Bp and cfg.get("n") in last.n_range:
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
    fitted = fit_allocations(curves, metric_names, keys, bootstrap=bootstrap, seed=seed)
    results = {metric: _metric_analysis(f, keys, configs, reach, grid, fine, both) for metric, f in fitted.items()}
    return Analysis(title=title, study=study, budget=budget, primary=primary, metrics=results,
                    configs=configs, curves=curves, noise=fitted[primary].noise, difficulty=difficulty)


def _metric_analysis(f: AllocationFits, keys: list[str], configs: dict[str, dict], reach: dict[str, float],
                     grid: np.ndarray, fine: np.ndarray, both: np.ndarray) -> MetricAnalysis:
    """One metric's frontier, verdict, hold-outs and n trend from its fits (steps 3-7 of the module docstring)."""
    c_max = data_c_max(f.groups)
    identified = {key: F.identification(fit, reach[key]) for key, fit in f.fits.items()}
    holdout = {key: config_holdout(f.groups[key], f.base, c_max) for key in f.fits}
    full = _predictions(f.fits, reach, keys, both)
    reps = [_predictions(rep, reach, keys, both) for rep in f.replicates]
    reps_arr = np.stack(reps) if reps else np.empty((0, len(keys), len(both)))
    rows = [replace(row, observed_config=observed[0], observed_value=observed[1],
                    identified=row.config is not None and not identified.get(row.config))
            for row in frontier_rows(keys, configs, grid, full[:, :len(grid)], reps_arr[:, :, :len(grid)])
            for observed in [observed_best(f.groups, row.C)]]
    fine_rows = frontier_rows(keys, configs, fine, full[:, len(grid):], reps_arr[:, :, len(grid):])
    saturation, verdict = allocation_verdict(fine_rows, sorted({cfg["n"] for cfg in configs.values()}))
    trend = n_trend(keys, configs, grid, full[:, :len(grid)], reps_arr[:, :, :len(grid)])
    return MetricAnalysis(f.metric, f.fits, f.unfitted, f.points, rows, saturation, holdout, identified, verdict,
                          decision_holdout(f.groups, f.base), f.base, len(f.replicates), trend)


def eval_noise(curves: list[Curve]) -> EvalNoise | None:
    """The eval set behind the curves and the noise of one evaluation on it: problems x samples, and the
    standard error of mean@k from sampling alone (how much one evaluation of a policy moves when it is repeated
    on the same fixed problems; :func:`isosweep.algo.estimators.summarize`), median and largest over every
    evaluation with counts. None when no trial saved counts."""
    se, shapes = [], set()
    for curve in curves:
        if curve.counts is None or not curve.samples or curve.samples < 2:
            continue
        shapes.add((curve.counts.shape[1], curve.samples))
        se.extend(sampling_se_of_mean(curve.counts, curve.samples))
    if not se:
        return None
    problems, samples = next(iter(shapes)) if len(shapes) == 1 else (None, None)
    return EvalNoise(problems, samples, float(np.median(se)), float(np.max(se)), len(se))


def zero_signal_summary(curves: list[Curve]) -> ZeroSignalSummary | None:
    """The step-0 zero-signal check pooled over the trials that logged it: their number, the mean observed and
    mean expected fraction of groups without signal, and ``z = sum(observed - expected) / sqrt(sum sd^2)``, the
    pooled difference in units of its standard deviation if the probe's prediction is right (trials taken as
    independent); ``flagged`` when ``|z| > ZERO_SIGNAL_Z``. With every sd 0 (no noise to measure against) z is NaN
    and any difference is flagged. None when no trial has the check (trials of an earlier isosweep)."""
    checks = [c.zero_signal for c in curves if c.zero_signal is not None]
    if not checks:
        return None
    difference = math.fsum(c.observed - c.expected for c in checks)
    sd = math.sqrt(math.fsum(c.sd ** 2 for c in checks))
    z = difference / sd if sd > 0 else math.nan
    flagged = abs(z) > ZERO_SIGNAL_Z if sd > 0 else difference != 0
    return ZeroSignalSummary(len(checks), math.fsum(c.observed for c in checks) / len(checks),
                             math.fsum(c.expected for c in checks) / len(checks), z, bool(flagged))


def gains(analysis: Analysis) -> dict[str, Gain]:
    """Per metric: the base model's value (the mean of the evaluations at compute 0), the best
    value observed by C_max over all trials, and the difference -- which metric a sweep moved most.
    A metric without evaluations at compute 0 is left out."""
    out = {}
    for name in analysis.metrics:
        base = [float(c.values[name][c.compute == 0].mean()) for c in analysis.curves if np.any(c.compute == 0)]
        if not base:
            continue
        best = max(float(c.values[name].max()) for c in analysis.curves)
        out[name] = Gain(float(np.mean(base)), best, best - float(np.mean(base)))
    return out
