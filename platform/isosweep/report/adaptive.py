"""Adaptive iso-compute sweeps: which configurations a sweep can stop at a budget rung without losing its frontier,
and the replay of those decisions on a finished study's curves.

A sweep's configurations advance in rungs (fractions of C_max, :data:`RUNGS`). At a rung ``c`` the frontier
rule (:func:`frontier_stops`) fits every running configuration on its data at compute <= c (the pipeline of
:mod:`isosweep.report.fitting`, with bootstrap replicates over seeds and paired eval problems) and stops one
only when its own fit is identified and has risen above the base model by :attr:`Rule.min_rise` standard errors
of one evaluation (its curve has risen and bent within the data: a curve still rising, or still flat, says
nothing of its plateau) and, at every C from c to C_max, the upper end of its band (quantile ``(1 + confidence) / 2`` of
its refits) is below the lower end of another identified configuration's band there: with that confidence it
cannot be on the frontier anywhere it has not yet been measured. A configuration without an identified fit
is never stopped, and what a stopped configuration computed stays in the frontier at the budgets it reached.

Baselines on the same rungs (:data:`METHODS`): ``asha`` (successive halving: at each rung keep the best
``ceil(k / eta)`` of the ``k`` running by their seed-mean running best, ``eta`` = the rungs' ratio),
``hyperband`` (the configurations dealt round-robin into one bracket per rung, bracket ``b`` halving from rung
``b`` on), ``p-best`` (stop a configuration whose predicted P(best) at C_max is below
:data:`~isosweep.report.analysis.P_BEST_FLOOR`: the ranking at the last budget only), and ``full`` (no stop).
``hindsight`` is no rule but a bound, for the replay only: each configuration stops at the first rung at or past
the largest budget at which the *full* grid's frontier names it the winner (a configuration that never wins, at
the first rung), so it needs the finished study. It is the least compute any stopping rule on these rungs can
spend without stopping a winner before its budget: what a rule could save at best on that study. ``hindsight-keep``,
the other bound: every configuration the full grid ever names the winner runs to C_max and every other one stops
at the first rung (it keeps the winners' curves whole, so their refits do not move).

:func:`replay` runs a method on a study's recorded curves, each decision seeing only the data up to its rung,
and scores it (:class:`Replay`): the compute its trials would have spent against the full grid's, and the
frontier the analysis reports from the trials as cut against the full one at every C of the table -- whether
the adaptive n*'s 90% set holds the full grid's n*, and how far the frontier value moved, in units of one
evaluation's standard error.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from isosweep.report import frontier as F
from isosweep.report import planner as P
from isosweep.report.analysis import P_BEST_FLOOR, Analysis, analyse, eval_noise
from isosweep.report.fitting import fit_allocations, reached
from isosweep.report.schema import SavedAnalysis, read_analysis
from isosweep.track.curves import Curve

RUNGS = (1 / 64, 1 / 16, 1 / 4)
"""The budget rungs, as fractions of C_max, at which a running configuration may be stopped (the last rung is
C_max itself, where every trial ends)."""

METHODS = ("frontier", "asha", "hyperband", "p-best", "full", "hindsight", "hindsight-keep")
BOUNDS = ("hindsight", "hindsight-keep")
"""The methods that read the finished study (bounds for the replay, not rules a sweep can run)."""

SCAN = 16
"""Compute points (log-spaced from the rung to C_max) on which the frontier rule compares the bands."""


@dataclass(frozen=True)
class Rule:
    """The adaptive sweep's settings: its rungs, the confidence of the frontier rule, the bootstrap replicates
    of each decision's fits and their seed."""

    rungs: tuple[float, ...] = RUNGS
    confidence: float = 0.9
    bootstrap: int = 100
    seed: int = 0
    min_rise: float = 4.0
    """A configuration is stoppable only once its fitted curve has risen above the base model by this many
    standard errors of one evaluation: a curve still flat may be one that starts late."""
    guard: bool = True
    """Stop only configurations whose fit is identified and has risen (:attr:`min_rise`), and compare with
    identified fits only; False: every fit counts (the unguarded rule, replayed to show what the guard costs
    and what it prevents)."""

    def __post_init__(self) -> None:
        if not self.rungs or any(not 0 < r < 1 for r in self.rungs) or list(self.rungs) != sorted(set(self.rungs)):
            raise ValueError(f"rungs {self.rungs}: increasing fractions of C_max in (0, 1)")
        if not 0.5 <= self.confidence < 1:
            raise ValueError(f"confidence {self.confidence}: in [0.5, 1)")

    @property
    def eta(self) -> float:
        """The ratio of consecutive rungs (ASHA's reduction factor on them)."""
        steps = [b / a for a, b in zip(self.rungs, [*self.rungs[1:], 1.0])]
        return float(np.exp(np.mean(np.log(steps))))


@dataclass(frozen=True)
class Stop:
    """A configuration stopped at compute ``C`` (a rung), and why."""

    config: str
    C: float
    reason: str

    def to_json(self) -> dict:
        return {"config": self.config, "C": self.C, "reason": self.reason}


def _bands(curves: list[Curve], metric: str, keys: list[str], grid: np.ndarray, rule: Rule,
           ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each configuration's fitted value on ``grid`` and its band (low, high quantiles of the refits), for the
    configurations whose fit on the data up to ``grid[0]`` is identified and has risen (:attr:`Rule.min_rise`): a
    curve that has not shown its bend there, or is still flat, says nothing of its plateau
    (:func:`isosweep.report.frontier.identification`). Empty when the curves carry no per-problem counts."""
    fitted = fit_allocations(curves, [metric], keys, bootstrap=rule.bootstrap, seed=rule.seed)[metric]
    noise = eval_noise(curves)
    if rule.guard and (noise is None or fitted.base is None):
        return {}  # without the evaluations' noise or the base value, no rise can be told from a flat start
    q = (1 - rule.confidence) / 2
    out = {}
    for key, fit in fitted.fits.items():
        if rule.guard and (F.identification(fit, float(grid[0]))
                           or float(fit.predict(grid[0])) - fitted.base < rule.min_rise * noise.se_median):
            continue
        reps = np.array([rep[key].predict(grid) for rep in fitted.replicates if key in rep]).reshape(-1, len(grid))
        value = np.asarray(fit.predict(grid), dtype=float)
        low, high = (np.quantile(reps, [q, 1 - q], axis=0) if len(reps) else (value, value))
        out[key] = (value, low, high)
    return out


@dataclass(frozen=True)
class FrontierDecision:
    """The frontier rule's decision at one rung: its stops, and the running configurations whose bands it could
    compare (identified fits that have risen; every running one when unguarded)."""

    C: float
    stops: tuple[Stop, ...]
    compared: tuple[str, ...]
    running: tuple[str, ...]

    def why_none(self) -> str:
        """Why nothing was stopped, for the sweep's log (empty when something was)."""
        if self.stops:
            return ""
        if len(self.compared) < 2:
            return (f"{len(self.compared)} of {len(self.running)} configurations have a fit that is identified and "
                    f"has risen above the base model at C = {self.C:,.0f}, and the rule needs two to compare; a curve "
                    f"that has not bent yet says nothing of its plateau")
        return (f"the bands of the {len(self.compared)} of {len(self.running)} configurations it could compare "
                f"overlap somewhere from C = {self.C:,.0f} to C_max")


def frontier_decision(curves: list[Curve], metric: str, running: list[str], C: float, budget: float,
                      rule: Rule, seen: float | None = None) -> FrontierDecision:
    """The frontier rule at rung ``C`` (module docstring), from ``curves`` cut at ``seen`` (default ``C``; a live
    sweep passes ``inf``: its trials ran to their first evaluation at or past the rung, and every record they hold
    is one the decision may see)."""
    grid = np.geomspace(C, budget, SCAN)
    horizon = C if seen is None else seen
    bands = _bands([P.cut(c, horizon) for c in curves if c.config in running], metric, running, grid, rule)
    stops = []
    for key, (_, _, high) in bands.items():
        others = [low for other, (_, low, _) in bands.items() if other != key]
        if not others:
            continue
        floor = np.max(others, axis=0)
        if np.all(high < floor):
            best = max((other for other in bands if other != key), key=lambda o: bands[o][1][-1])
            stops.append(Stop(key, C, f"its {rule.confidence:.0%} band stays below {best}'s from C = {C:,.0f} to "
                                      f"{budget:,.0f} (at C_max: {high[-1]:.3f} < {bands[best][1][-1]:.3f})"))
    return FrontierDecision(C, tuple(stops), tuple(bands), tuple(running))


def frontier_stops(curves: list[Curve], metric: str, running: list[str], C: float, budget: float,
                   rule: Rule, seen: float | None = None) -> list[Stop]:
    """The running configurations the frontier rule stops at rung ``C`` (:func:`frontier_decision`'s stops)."""
    return list(frontier_decision(curves, metric, running, C, budget, rule, seen).stops)


def _seed_mean_best(curves: list[Curve], metric: str, key: str, C: float) -> float:
    seen = [float(np.max(c.values[metric][c.compute <= C])) for c in curves
            if c.config == key and np.any(c.compute <= C)]
    return float(np.mean(seen)) if seen else -math.inf


def halving_stops(curves: list[Curve], metric: str, running: list[str], C: float, eta: float,
                  why: str = "asha", seen: float | None = None) -> list[Stop]:
    """Successive halving at rung ``C``: the best ``ceil(k / eta)`` of the ``k`` running configurations by their
    seed-mean running best at compute <= ``seen`` (default ``C``; a live sweep passes ``inf``, as for
    :func:`frontier_stops`) go on, the others stop."""
    horizon = C if seen is None else seen
    ranked = sorted(running, key=lambda k: -_seed_mean_best(curves, metric, k, horizon))
    keep = max(1, math.ceil(len(ranked) / eta))
    return [Stop(key, C, f"{why}: ranked {i + 1} of {len(ranked)} at C = {C:,.0f} (keeps {keep})")
            for i, key in enumerate(ranked) if i >= keep]


def p_best_stops(curves: list[Curve], metric: str, running: list[str], C: float, budget: float,
                 rule: Rule) -> list[Stop]:
    """The running configurations whose predicted P(best) at C_max (from fits on the data at compute <= C) is
    below :data:`P_BEST_FLOOR`."""
    fitted = fit_allocations([P.cut(c, C) for c in curves if c.config in running], [metric], running,
                             bootstrap=rule.bootstrap, seed=rule.seed)[metric]
    keys = list(fitted.fits)
    if len(keys) < 2 or not fitted.replicates:
        return []
    values = np.array([[rep[k].predict(budget) if k in rep else -np.inf for k in keys] for rep in fitted.replicates])
    p_best = np.bincount(np.argmax(values, axis=1), minlength=len(keys)) / len(values)
    return [Stop(k, C, f"P(best) at C_max {p:.2f} < {P_BEST_FLOOR:g} at C = {C:,.0f}")
            for k, p in zip(keys, p_best) if p < P_BEST_FLOOR]


def hindsight_stops(full: Analysis, metric: str, keys: list[str], budget: float, rule: Rule,
                    keep: bool = False) -> list[Stop]:
    """The ``hindsight`` bound's stops (module docstring): every configuration in ``keys`` at the first rung at or
    past the largest C at which ``full`` (the finished study's analysis) names it the winner; one that wins at a C
    past the last rung is not stopped. ``keep`` (``hindsight-keep``): a configuration that wins anywhere is not
    stopped, every other one stops at the first rung."""
    last: dict[str, float] = {}
    for row in full.metrics[metric].rows:
        if row.config:
            last[row.config] = budget if keep else max(last.get(row.config, 0.0), row.C)
    stops = []
    for key in keys:
        rung = next((f * budget for f in rule.rungs if f * budget >= last.get(key, 0.0)), None)
        if rung is not None:
            won = (f"the full frontier's winner up to C = {last[key]:,.0f}" if key in last
                   else "never the full frontier's winner")
            stops.append(Stop(key, rung, f"hindsight: {won}"))
    return stops


def decide(curves: list[Curve], metric: str, budget: float, method: str, rule: Rule = Rule()) -> list[Stop]:
    """Every stop ``method`` makes on ``curves`` (a finished study's), rung by rung, each decision seeing only the
    data up to its rung (not the :data:`BOUNDS`, which need the study's full analysis: :func:`replay` makes them)."""
    if method not in METHODS or method in BOUNDS:
        raise ValueError(f"method {method!r}: allowed {[m for m in METHODS if m not in BOUNDS]}"
                         + (f" ({method}: a bound, the replay only)" if method in BOUNDS else ""))
    keys = list(dict.fromkeys(c.config for c in curves))
    running, stops = list(keys), []
    brackets = {key: i % (len(rule.rungs) + 1) for i, key in enumerate(sorted(keys))}
    for index, fraction in enumerate(rule.rungs):
        C = fraction * budget
        if method == "full" or len(running) < 2:
            break
        if method == "frontier":
            new = frontier_stops(curves, metric, running, C, budget, rule)
        elif method == "asha":
            new = halving_stops(curves, metric, running, C, rule.eta)
        elif method == "hyperband":
            new = [s for b in range(index + 1)
                   for s in halving_stops(curves, metric, [k for k in running if brackets[k] == b], C, rule.eta,
                                          f"hyperband bracket {b}")]
        else:
            new = p_best_stops(curves, metric, running, C, budget, rule)
        stops += new
        running = [k for k in running if k not in {s.config for s in new}]
    return stops


@dataclass(frozen=True)
class RowCheck:
    """One C of the frontier table: the full grid's n* and value, the adaptive analysis's n* 90% set and value,
    whether the set holds the full n*, and the value's move in evaluation standard errors."""

    C: float
    full_n: int | None
    n_range: tuple[int, ...]
    holds: bool
    value_shift_se: float

    def to_json(self) -> dict:
        return {"C": self.C, "full_n": self.full_n, "n_range": list(self.n_range), "holds": self.holds,
                "value_shift_se": None if math.isnan(self.value_shift_se) else self.value_shift_se}


@dataclass(frozen=True)
class Replay:
    """A method replayed on one study: its stops, the compute its trials spent against the full grid's, the
    frontier rows compared, and whether it stopped a configuration before a budget at which the full frontier
    names it the winner."""

    study: str
    method: str
    stops: tuple[Stop, ...]
    compute: float
    full_compute: float
    rows: tuple[RowCheck, ...]
    winners_stopped: tuple[str, ...]
    se: float
    """One evaluation's standard error of the metric (the median over the study's evaluations)."""

    @property
    def share(self) -> float:
        return self.compute / self.full_compute

    @property
    def holds(self) -> bool:
        """The adaptive n* set holds the full n* and the value is within one standard error, at every C."""
        return all(r.holds and not (r.value_shift_se > 1.0) for r in self.rows)

    def to_json(self) -> dict:
        return {"study": self.study, "method": self.method, "compute_share": self.share, "compute": self.compute,
                "full_compute": self.full_compute, "holds": self.holds, "se": self.se,
                "winners_stopped": list(self.winners_stopped), "stops": [s.to_json() for s in self.stops],
                "rows": [r.to_json() for r in self.rows]}


def study_curves(dashboards: str | Path, folder: str) -> tuple[SavedAnalysis, list[Curve]]:
    """A committed study's analysis and the curves it was made from (its parts' ``curves.json``, pooled)."""
    root = Path(dashboards)
    saved = read_analysis(root / folder / "fits.json")
    by_id = {d.sweep_id: d for d in P.load_folders(root)}
    missing = [s for s in saved.sweeps if s not in by_id]
    if missing:
        raise ValueError(f"{root / folder}: no curves.json under {root} holds the sweeps {missing}")
    group = [by_id[s] for s in saved.sweeps]
    return saved, (P.pooled_curves(group) if len(group) > 1 else group[0].curves)


def _analyse(saved: SavedAnalysis, curves: list[Curve]) -> Analysis:
    m = saved.metrics[saved.primary]
    return analyse(curves, title=saved.title, study=saved.study, budget=saved.budget, primary=saved.primary,
                   points=len(m.frontier), bootstrap=m.bootstrap_replicates, difficulty=saved.difficulty)


def replay(saved: SavedAnalysis, curves: list[Curve], method: str, rule: Rule = Rule(),
           full: Analysis | None = None) -> Replay:
    """``method`` replayed on a finished study (module docstring); ``full``: its analysis from the same curves
    (made here when not given)."""
    metric, budget = saved.primary, float(saved.budget)
    full = full or _analyse(saved, curves)
    stops = (hindsight_stops(full, metric, list(dict.fromkeys(c.config for c in curves)), budget, rule,
                             keep=method == "hindsight-keep")
             if method in BOUNDS else decide(curves, metric, budget, method, rule))
    at = {s.config: s.C for s in stops}
    kept = [P.cut(c, at[c.config]) if c.config in at else c for c in curves]
    mine = _analyse(saved, kept)
    se = saved.eval.se_median if saved.eval else math.nan
    rows = []
    for a, b in zip(full.metrics[metric].rows, mine.metrics[metric].rows):
        shift = abs(a.value - b.value) / se if se and not math.isnan(a.value) and not math.isnan(b.value) else math.nan
        rows.append(RowCheck(a.C, a.n, b.n_range, a.n is None or a.n in b.n_range, shift))
    winners = sorted({r.config for r in full.metrics[metric].rows if r.config and r.config in at and at[r.config] < r.C})
    spent = sum(min(at.get(c.config, budget), reached(c, budget)) for c in curves)
    label = (f"frontier {rule.confidence:.0%}" + ("" if rule.guard else " unguarded")) if method == "frontier" else method
    return Replay(saved.title, label, tuple(stops), spent, sum(reached(c, budget) for c in curves), tuple(rows),
                  tuple(winners), se)


def replay_studies(dashboards: str | Path, folders: list[str], confidences: tuple[float, ...] = (0.9,),
                   methods: tuple[str, ...] = METHODS, rule: Rule = Rule(), log=print,
                   unguarded: bool = False) -> ReplayTable:
    """Every method of ``methods`` (the frontier rule once per confidence, and unguarded too if ``unguarded``)
    replayed on each study folder."""
    variants = [replace(rule, confidence=c, guard=g) for g in (True, False)[:1 + unguarded] for c in confidences]
    replays = []
    for folder in folders:
        saved, curves = study_curves(dashboards, folder)
        full = _analyse(saved, curves)
        for method in methods:
            for variant in (variants if method == "frontier" else [rule]):
                r = replay(saved, curves, method, variant, full)
                replays.append(replace(r, study=folder))
                log(f"[adaptive-replay] {folder}: {r.method} spent {r.share:.0%} of the full grid; frontier "
                    f"{'held' if r.holds else 'moved'}" + (f"; stopped full-frontier winners {list(r.winners_stopped)}"
                                                          if r.winners_stopped else ""))
    return ReplayTable(rule, tuple(replays))


@dataclass(frozen=True)
class ReplayTable:
    """Every method replayed on every study given: what ``isosweep adaptive-replay`` writes."""

    rule: Rule
    replays: tuple[Replay, ...] = field(default=())

    def median_share(self, method: str) -> float:
        shares = [r.share for r in self.replays if r.method == method]
        return float(np.median(shares)) if shares else math.nan

    def to_json(self) -> dict:
        return {"rule": {"rungs": list(self.rule.rungs), "bootstrap": self.rule.bootstrap, "seed": self.rule.seed,
                         "min_rise": self.rule.min_rise},
                "replays": [r.to_json() for r in self.replays]}

    def text(self) -> str:
        """The table as Markdown: per study and method, the compute share, whether the frontier held, the largest
        value shift and any full-frontier winner stopped early; then each method's median share."""
        rungs = ", ".join(f"C_max/{1 / r:g}" for r in self.rule.rungs)
        lines = [f"Rungs: {rungs}, then C_max.", "",
                 "| study | method | compute | n* set holds the full n* | largest value shift (se) | winners stopped |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for r in self.replays:
            shifts = [x.value_shift_se for x in r.rows if not math.isnan(x.value_shift_se)]
            held = sum(x.holds for x in r.rows)
            lines.append(f"| {r.study} | {r.method} | {r.share:.0%} | {held} of {len(r.rows)} C |"
                         f" {max(shifts, default=math.nan):.2f} | {', '.join(r.winners_stopped) or '-'} |")
        lines += ["", "| method | median compute | studies whose frontier held (n* and value within 1 se, every C) |",
                  "| --- | --- | --- |"]
        for method in dict.fromkeys(r.method for r in self.replays):
            mine = [r for r in self.replays if r.method == method]
            lines.append(f"| {method} | {self.median_share(method):.0%} | {sum(r.holds for r in mine)} of {len(mine)} |")
        return "\n".join(lines) + "\n"

    def write(self, out: str | Path) -> Path:
        """``replay.json`` and ``replay.md`` in ``out``; returns the Markdown's path."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "replay.json").write_text(json.dumps(self.to_json(), indent=1))
        (out / "replay.md").write_text(self.text())
        return out / "replay.md"
