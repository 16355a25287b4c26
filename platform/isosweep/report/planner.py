"""What to run at a budget C: the allocation (Bp, n, M = C // (Bp * n)) that finished sweeps say is
best there, its predicted metric with a 90% interval, how sure that is, and what would settle it.

Input is every finished sweep of one task, model and difficulty (:class:`SweepData`: from MLflow,
or the ``curves.json`` a study folder keeps). The planner:

1. **Pools** the sweeps' trials by allocation ``(n, Bp)``. The learning rate is constant over a
   trial (no schedule over M), so a trial's running best at compute c measures what that allocation
   has by c whatever budget its sweep had: a sweep at 1e5 covers every C up to 1e5, and sweeps at
   several budgets add seeds where they overlap and reach where they do not. A trial is
   deterministic given its allocation, seed and method, so the same (n, Bp, seed) in two sweeps is
   one run, kept once (from the sweep that reaches furthest), never counted as two seeds.
2. **Fits** each allocation's pooled running bests (the sigmoid with ``R0`` fixed to the base
   model's measured value), then refits on bootstrap replicates that draw each allocation's trials
   (seeds, and sweeps) with replacement and the eval problems with replacement, paired across trials:
   the frontier analysis's own pipeline (:func:`isosweep.report.fitting.fit_allocations`).
3. **At C**: the allocations whose data reach C compete on their fitted values (a fit decides
   nothing beyond its own data); if none reaches C, every fitted allocation competes on its fit
   *extrapolated*, and the output says so. The winner's value has the 90% interval of its refits,
   **P(best)** is the share of replicates it wins, and the runner-ups *within noise* are those
   whose deficit's 90% interval reaches 0 or that win at least 5% of replicates.
4. **n*(C) and Bp*(C) across budgets**: on a log grid of C over the data, the winner's ``log2 n``
   and ``log2 Bp`` are fitted as straight lines in ``log10 C`` (with their replicates' spread), so a
   C beyond the data gets the trend's n* with an interval, capped to the studied n when read as an
   allocation.
5. **Warnings**, each with what to run: C beyond the data or beyond 4x it, n* or Bp* at the edge of
   what was studied, a winner whose fit is not identified, sweeps that disagree on one allocation
   beyond chance (a two-sample t test on the seeds' spread, Bonferroni-corrected over the comparisons made:
   :func:`beyond_chance`), sweeps pooled with different method settings (lr_ref ...).
6. **What to run next** (:func:`suggestion`): the one sweep that would most shrink the
   recommendation's uncertainty -- a grid extension at an edge, else the next budget toward C for
   the contenders, else more seeds of a tie -- as a sweep spec ready for ``make sweep``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml
from scipy.stats import t as student

from isosweep.algo import MIN_GROUP
from isosweep.report import frontier as F
from isosweep.report.analysis import P_BEST_FLOOR
from isosweep.report.fitting import Pairs, fit_allocations, reached
from isosweep.report.plots import png, pyplot
from isosweep.spec.grid import ADDED_LATER
from isosweep.spec.values import short_count
from isosweep.spec.yamlio import ConfigError, flatten
from isosweep.track.curves import CURVES_FILE, Curve, SweepData

METRICS = ("mean", "best", "worst")

IDENTITY = ("task.name", "task.levels", "task.difficulty", "model.name", "task.dataset_config", "task.train_split",
            "task.eval_split", "task.columns.prompt", "task.columns.answer")
"""Trial settings that must be equal for sweeps to be pooled: what is trained, on what."""

NOT_METHOD = {"budget", "Bp", "n", "seed", "profile", "rollout.actors", "trainer.num_workers", "trainer.launcher",
              "eval.every", "eval.points", "eval.first", *IDENTITY}
"""Trial settings that do not change what a trial learns (allocation, resources, eval schedule);
every other setting (``derived.*`` aside) is *method*, and sweeps pooled with different method
settings are flagged."""

EXTRAPOLATION_SPAN = 4.0
"""Beyond this factor past the largest compute any data reach, the answer is flagged as an extrapolation to check."""

TREND_GRID = 16
"""Compute points (log-spaced over the data) on which n*(C) and Bp*(C) are read for their trend."""


def curves_path(folder: str | Path) -> Path:
    return Path(folder) / CURVES_FILE


def write_sweep_data(data: SweepData, folder: str | Path) -> Path:
    """``folder/curves.json``: the sweep's trials' curves and settings (what :func:`load_folders` reads back)."""
    path = curves_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data.to_json()))
    return path


def load_folders(root: str | Path) -> list[SweepData]:
    """Every study folder under ``root`` that keeps a ``curves.json`` (written by ``isosweep report --refresh``,
    ``isosweep frontier --dashboards`` and a sweep's end), as :class:`SweepData`."""
    out = []
    for path in sorted(Path(root).glob(f"*/{CURVES_FILE}")):
        out.append(SweepData.from_json(json.loads(path.read_text()), str(path)))
    return out


ADDED_DEFAULTS = flatten(ADDED_LATER)
"""Trial settings a sweep run by an earlier isosweep lacks, with the value that sweep in effect had."""


def trial_params(data: SweepData) -> dict[str, str]:
    """The sweep's trial settings, those added to isosweep since it ran filled in with their defaults, so that
    a sweep run then and one run now with the same settings compare equal."""
    return {**ADDED_DEFAULTS, **data.trial_params}


def identity(data: SweepData) -> dict[str, str]:
    params = trial_params(data)
    return {key: params.get(key, "?") for key in IDENTITY}


def eval_sets(data: SweepData) -> tuple[str, ...]:
    """The eval sets the sweep's trials were scored on (each a hash of its problems). The easy and hard sets
    come from the base model's measured pass rates, so a tiny base model built by another isosweep version
    (or, before version 2 of the warm-up, on another CPU) has other problems and another id."""
    return tuple(sorted({c.eval_set for c in data.curves if c.eval_set}))


def method(data: SweepData) -> dict[str, str]:
    return {key: value for key, value in trial_params(data).items()
            if key not in NOT_METHOD and not key.startswith("derived.")}


def pool_groups(sweeps: list[SweepData]) -> list[list[SweepData]]:
    """The sweeps that are one study run in parts (several seeds, sweep by sweep): the same study kind,
    budget, grid, task, model and method settings. Each group is ordered by its lowest seed (the part a
    pooled analysis is named after first); only groups of two or more sweeps are returned."""
    def design(d: SweepData) -> str:
        return json.dumps([d.sweep_params.get("spec.study"), d.budget, sorted({c.config for c in d.curves}),
                           identity(d), method(d), eval_sets(d)], sort_keys=True)

    groups: dict[str, list[SweepData]] = {}
    for d in sweeps:
        groups.setdefault(design(d), []).append(d)
    lowest = lambda d: min((int(c.fields.get("seed", 0)) for c in d.curves), default=0)  # noqa: E731
    return [sorted(g, key=lowest) for g in groups.values() if len(g) > 1]


@dataclass(frozen=True)
class RunId:
    """One deterministic training run: a trial is determined by its allocation (``config``), its ``seed`` and its
    ``recipe`` (the task, model and method settings, as JSON), so the same run in two sweeps -- to the same or
    another budget -- is one observation, not two seeds."""

    config: str
    seed: int
    recipe: str


def run_identity(data: SweepData, curve: Curve) -> RunId:
    """The run ``curve`` (a trial of the sweep ``data``) is: the one identity the planner, the pooling of a
    study's parts and the study report count runs by."""
    return RunId(curve.config, int(curve.fields.get("seed", 0)),
                 json.dumps({**method(data), **identity(data)}, sort_keys=True))


def pooled_curves(group: list[SweepData]) -> list[Curve]:
    """Every trial's curve of the ``group``, each run (:func:`run_identity`) kept once."""
    seen, out = set(), []
    for d in group:
        for c in d.curves:
            key = run_identity(d, c)
            if key not in seen:
                seen.add(key)
                out.append(c)
    return out


def describe(data: SweepData) -> str:
    i = identity(data)
    return (f"{data.sweep_id} (task {i['task.name']} levels {i['task.levels']}, {i['task.difficulty']}, "
            f"model {i['model.name']}, C = {data.budget:,})")


def select(sweeps: list[SweepData], *, task: str | None = None, difficulty: str | None = None,
           model: str | None = None, explicit: bool = False) -> list[SweepData]:
    """The sweeps matching ``task``/``difficulty``/``model`` (None: any); they must then share one task,
    levels, difficulty and model. ``explicit``: the user named the sweeps, so one that does not match is an
    error rather than skipped. Raises :class:`ConfigError` naming what is missing and listing what is there."""
    if not sweeps:
        raise ConfigError("no finished grid sweep to plan from: run one first (make sweep BUDGET=...), or point "
                          "--from at a folder of study folders with curves.json (e.g. dashboards)")
    wanted = {"task.name": task, "task.difficulty": difficulty, "model.name": model}

    def matches(data: SweepData) -> bool:
        return all(v is None or identity(data)[k] == v for k, v in wanted.items())

    chosen = [d for d in sweeps if matches(d)]
    there = "\n  ".join(describe(d) for d in sweeps)
    if explicit and len(chosen) < len(sweeps):
        bad = [d.sweep_id for d in sweeps if not matches(d)]
        raise ConfigError(f"sweeps {bad} are not of {_wanted(wanted)}; the sweeps given:\n  {there}")
    if not chosen:
        raise ConfigError(f"no finished sweep of {_wanted(wanted)}; finished sweeps:\n  {there}")
    kinds = {tuple(identity(d).values()) for d in chosen}
    if len(kinds) > 1:
        listed = "\n  ".join(describe(d) for d in chosen)
        raise ConfigError("the matching sweeps are of different tasks, difficulties or models; narrow them with "
                          f"--task/--difficulty/--model or --sweeps:\n  {listed}")
    scored = {eval_sets(d) for d in chosen if eval_sets(d)}  # sweeps too old to name theirs: unknown, let be
    if len(scored) > 1:
        listed = "\n  ".join(f"{describe(d)}: eval set {', '.join(eval_sets(d)) or '?'}" for d in chosen)
        raise ConfigError("the matching sweeps were scored on different eval problems: their base models differ (a "
                          "tiny base model built by another isosweep version, or on another CPU before version 2 of "
                          "the warm-up, has other easy and hard sets) or their task.eval_problems do; plan from the "
                          f"sweeps of one eval set with --sweeps:\n  {listed}")
    return chosen


def _wanted(wanted: dict[str, str | None]) -> str:
    named = [f"{k.split('.')[0] if k != 'task.difficulty' else 'difficulty'} {v}" for k, v in wanted.items() if v]
    return ", ".join(named) or "any task"


# --------------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Contender:
    """An allocation that competed at C: its fitted value with the 90% band of its refits, P(best), how far it
    trails the winner (with that lead's 90% interval; NaN for the winner), whether it is within noise of the
    winner, whether C is beyond its data (``reach``), and why its fit is not identified (empty: identified)."""

    config: str
    n: int
    Bp: int
    M: int
    value: float
    low: float
    high: float
    p_best: float
    lead: float
    lead_low: float
    lead_high: float
    within_noise: bool
    extrapolated: bool
    reach: float
    not_identified: tuple[str, ...]

    def to_json(self) -> dict:
        return {"config": self.config, "n": self.n, "Bp": self.Bp, "M": self.M, "value": self.value, "low": self.low,
                "high": self.high, "p_best": self.p_best, "lead": self.lead, "lead_low": self.lead_low,
                "lead_high": self.lead_high, "within_noise": self.within_noise, "extrapolated": self.extrapolated,
                "reach": self.reach, "not_identified": list(self.not_identified)}


@dataclass(frozen=True)
class AllocationLine:
    """``log2`` of n* (or Bp*) as a straight line in ``log10 C`` over the data: its slope (doublings per decade of
    C) with the replicates' 90% interval, what it gives at the C asked with its interval, and the values studied."""

    slope_per_decade: float
    slope_low: float
    slope_high: float
    at_C: float
    at_C_low: float
    at_C_high: float
    studied: tuple[int, ...]

    def to_json(self) -> dict:
        return {"slope_per_decade": self.slope_per_decade, "slope_low": self.slope_low, "slope_high": self.slope_high,
                "at_C": self.at_C, "at_C_low": self.at_C_low, "at_C_high": self.at_C_high,
                "studied": list(self.studied)}


@dataclass(frozen=True)
class PlanTrend:
    """n*(C) and Bp*(C) read on a log grid of C from ``C_from`` to ``C_to`` (None: fewer than two winners)."""

    C_from: float
    C_to: float
    n: AllocationLine | None = None
    Bp: AllocationLine | None = None

    def to_json(self) -> dict:
        out = {"C_from": self.C_from, "C_to": self.C_to}
        out.update({name: line.to_json() for name, line in (("n", self.n), ("Bp", self.Bp)) if line})
        return out


@dataclass(frozen=True)
class Source:
    """A sweep a recommendation rests on: its id and budget, the trials kept and those left out as repeats of
    another sweep's run, their seeds and configs, and the compute they reach."""

    sweep_id: str
    budget: int
    trials: int
    repeats_left_out: int
    seeds: tuple[int, ...]
    configs: tuple[str, ...]
    reach: float

    def to_json(self) -> dict:
        return {"sweep_id": self.sweep_id, "budget": self.budget, "trials": self.trials,
                "repeats_left_out": self.repeats_left_out, "seeds": list(self.seeds), "configs": list(self.configs),
                "reach": self.reach}


@dataclass
class Recommendation:
    """The planner's answer at one budget (see the module docstring)."""

    C: float
    metric: str
    config: str | None
    n: int | None = None
    Bp: int | None = None
    M: int | None = None
    value: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p_best: float = math.nan
    extrapolated: bool = False
    contenders: list[Contender] = field(default_factory=list)
    """Every allocation that competed at C, best first."""
    trend: PlanTrend | None = None
    """n*(C) and Bp*(C) across the data and at C."""
    warnings: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    """A short label per warning (``beyond the data``, ``n* at grid edge`` ...), in the same order."""
    sources: list[Source] = field(default_factory=list)
    """The sweeps it rests on."""
    data_C: float = math.nan
    """The largest compute any pooled trial's data reach."""
    replicates: int = 0
    noise: str = ""

    def within_noise(self) -> list[Contender]:
        return [c for c in self.contenders if c.within_noise and c.config != self.config]

    def to_json(self) -> dict:
        data = {k: getattr(self, k) for k in ("C", "metric", "config", "n", "Bp", "M", "value", "low", "high",
                                              "p_best", "extrapolated")}
        data.update(contenders=[c.to_json() for c in self.contenders],
                    trend=self.trend.to_json() if self.trend else {}, warnings=self.warnings, flags=self.flags,
                    sources=[s.to_json() for s in self.sources], data_C=self.data_C, replicates=self.replicates,
                    noise=self.noise)
        return json.loads(json.dumps(data, default=float).replace("NaN", "null"))


@dataclass(frozen=True)
class BudgetCheck:
    """The leave-one-budget-out check (:func:`leave_one_budget_out`): the planner's pick at ``C_max`` from the data
    at ``C <= from_C`` only, against what was observed at ``C_max``."""

    C_max: float
    from_C: float
    recommended: str
    predicted: float
    low: float
    high: float
    p_best: float
    observed_best: str | None
    observed_best_value: float
    observed_recommended: float
    hit: bool
    covered: bool | None
    """Whether the pick's observed value is inside its predicted interval (None: it was not observed)."""
    shortfall: float
    within_noise: tuple[str, ...]
    warnings: tuple[str, ...]
    observed: dict[str, float]
    """Each allocation observed at C_max -> its seed mean of the running best there."""
    candidates: tuple[str, ...]


class Planner:
    """Fits of every allocation of the pooled sweeps, and their bootstrap refits; :meth:`at` answers at a C."""

    def __init__(self, sweeps: list[SweepData], metric: str = "mean", *, bootstrap: int = 200, seed: int = 0) -> None:
        if metric not in METRICS:
            raise ConfigError(f"metric {metric!r}: allowed {list(METRICS)}")
        if not sweeps:
            raise ConfigError("no sweeps to plan from")
        self.sweeps = sweeps
        self.curves: list[Curve] = []
        self.budget_of: dict[str, int] = {}
        self.repeats: dict[str, int] = {}
        """sweep id -> its trials left out as repeats of a trial of another sweep (same allocation and seed)."""
        seen: set[RunId] = set()
        # The same run in two sweeps is one run measured twice, not two seeds: keep the one that reaches
        # furthest (largest budget).
        for data in sorted(sweeps, key=lambda d: -d.budget):
            for c in data.curves:
                run = run_identity(data, c)
                if run in seen:
                    self.repeats[data.sweep_id] = self.repeats.get(data.sweep_id, 0) + 1
                    continue
                seen.add(run)
                key = f"{data.sweep_id}/{c.key}"
                self.curves.append(Curve(key=key, config=c.config, fields=dict(c.fields), compute=c.compute,
                                         values=c.values, counts=c.counts, samples=c.samples, eval_set=c.eval_set,
                                         zero_signal=c.zero_signal))
                self.budget_of[key] = data.budget
        if not self.curves:
            raise ConfigError(f"the sweeps {[d.sweep_id for d in sweeps]} have no evaluated trial")
        self.metric = metric_name(self.curves, metric)
        self.configs: dict[str, dict] = {}
        for c in self.curves:
            self.configs.setdefault(c.config, {"n": int(c.fields["n"]), "Bp": int(c.fields["Bp"])})
        self.keys = sorted(self.configs, key=lambda k: (self.configs[k]["Bp"], self.configs[k]["n"]))
        self.reach = {key: max(reached(c, self.budget_of[c.key]) for c in self.curves if c.config == key)
                      for key in self.keys}
        fitted = fit_allocations(self.curves, [self.metric], self.keys, bootstrap=bootstrap, seed=seed)[self.metric]
        self.noise = fitted.noise
        self.base = fitted.base
        self.fits: dict[str, F.SigmoidFit] = fitted.fits
        self.unfitted: dict[str, str] = fitted.unfitted
        if not self.fits:
            raise ConfigError(f"no allocation of the sweeps {[d.sweep_id for d in sweeps]} could be fitted on "
                              f"{self.metric}: {self.unfitted}")
        self.groups: dict[str, Pairs] = fitted.groups
        """The observed evaluations by allocation."""
        self.replicates: tuple[dict[str, F.SigmoidFit], ...] = fitted.replicates
        self.data_C = max(self.reach.values())

    # ----------------------------------------------------------------------------- at a C

    def _candidates(self, C: float) -> tuple[list[str], bool]:
        """The allocations that compete at ``C``, and whether that is on extrapolated fits: those whose data
        reach C; but where fewer than two do (one long run beside shorter grids), a field of one is no race, so
        every fitted allocation competes, beyond its data where it stops short of C."""
        fitted = [k for k in self.keys if k in self.fits]
        inside = [k for k in fitted if self.reach[k] * 1.0001 >= C]
        return (inside, False) if len(inside) >= 2 or inside == fitted else (fitted, True)

    def _values(self, keys: list[str], C: float) -> tuple[np.ndarray, np.ndarray]:
        """Observed fitted values ``(keys,)`` and the replicates' ``(replicates, keys)`` (nan: no refit)."""
        full = np.array([float(self.fits[k].predict(C)) for k in keys])
        reps = np.full((len(self.replicates), len(keys)), np.nan)
        for r, rep in enumerate(self.replicates):
            for i, k in enumerate(keys):
                if k in rep:
                    reps[r, i] = float(rep[k].predict(C))
        return full, reps

    def winner_at(self, C: float, replicate: int | None = None) -> str | None:
        keys, _ = self._candidates(C)
        fits = self.fits if replicate is None else self.replicates[replicate]
        values = {k: float(fits[k].predict(C)) for k in keys if k in fits}
        return max(values, key=values.get) if values else None

    def at(self, C: float) -> Recommendation:
        """The recommendation at budget ``C`` (rollouts per run)."""
        if not (isinstance(C, (int, float)) and math.isfinite(C) and C > 0):
            raise ConfigError(f"budget {C!r}: must be a positive number of rollouts (e.g. 1e5)")
        keys, extrapolated = self._candidates(C)
        full, reps = self._values(keys, C)
        w = int(np.argmax(full))
        valid = ~np.all(np.isnan(reps), axis=1)
        p_best = np.full(len(keys), math.nan)
        if valid.any():
            p_best = np.bincount(np.nanargmax(reps[valid], axis=1), minlength=len(keys)) / valid.sum()
        contenders = []
        for i, k in enumerate(keys):
            own = reps[:, i][~np.isnan(reps[:, i])]
            low, high = (float(q) for q in np.quantile(own, [0.05, 0.95])) if len(own) else (math.nan, math.nan)
            diff = reps[:, w] - reps[:, i]
            diff = diff[~np.isnan(diff)]
            lead_low, lead_high = ((float(q) for q in np.quantile(diff, [0.05, 0.95])) if len(diff) and i != w
                                   else (math.nan, math.nan))
            cfg = self.configs[k]
            contenders.append(Contender(
                config=k, n=cfg["n"], Bp=cfg["Bp"], M=int(C // (cfg["n"] * cfg["Bp"])), value=float(full[i]), low=low,
                high=high, p_best=float(p_best[i]), lead=float(full[w] - full[i]), lead_low=lead_low,
                lead_high=lead_high,
                within_noise=bool(i == w or p_best[i] >= P_BEST_FLOOR or (not math.isnan(lead_low) and lead_low <= 0)),
                extrapolated=bool(self.reach[k] * 1.0001 < C), reach=self.reach[k],
                not_identified=tuple(F.identification(self.fits[k], self.reach[k]))))
        contenders.sort(key=lambda c: -c.value)
        top = next(c for c in contenders if c.config == keys[w])
        rec = Recommendation(C=float(C), metric=self.metric, config=keys[w], n=top.n, Bp=top.Bp, M=top.M,
                             value=top.value, low=top.low, high=top.high, p_best=top.p_best,
                             extrapolated=extrapolated, contenders=contenders, data_C=self.data_C,
                             replicates=len(self.replicates), noise=self.noise, sources=self.sources())
        rec.trend = self.trend(C)
        found = self._warnings(rec)
        rec.flags, rec.warnings = [f for f, _ in found], [w for _, w in found]
        return rec

    def sources(self) -> list[Source]:
        """The sweeps pooled."""
        out = []
        for data in self.sweeps:
            mine = [c for c in self.curves if c.key.startswith(f"{data.sweep_id}/")]
            out.append(Source(data.sweep_id, data.budget, len(mine), self.repeats.get(data.sweep_id, 0),
                              tuple(sorted({int(c.fields.get("seed", 0)) for c in mine})),
                              tuple(sorted({c.config for c in mine})),
                              max((reached(c, data.budget) for c in mine), default=0.0)))
        return out

    # ----------------------------------------------------------------------------- across budgets

    def trend(self, C: float) -> PlanTrend:
        """n*(C) and Bp*(C) as straight lines of ``log2 n*`` and ``log2 Bp*`` in ``log10 C`` over the data
        (the winner on a log grid of C), with the replicates' spread, and what they give at ``C``."""
        low_c = min(float(c.compute[c.compute > 0].min()) for c in self.curves if np.any(c.compute > 0))
        grid = np.geomspace(low_c, self.data_C, TREND_GRID)
        x = np.log10(grid)
        winners = {r: [self.winner_at(float(c), r) for c in grid] for r in [None, *range(len(self.replicates))]}
        lines = {}
        for name in ("n", "Bp"):
            def line(replicate: int | None) -> tuple[float, float] | None:
                pts = [(xi, math.log2(self.configs[w][name])) for xi, w in zip(x, winners[replicate]) if w is not None]
                if len(pts) < 2:
                    return None
                xs, ys = np.array(pts).T
                slope = float(np.polyfit(xs, ys, 1)[0]) if np.ptp(xs) > 0 else 0.0
                return slope, float(np.mean(ys) + slope * (math.log10(C) - np.mean(xs)))
            observed = line(None)
            if observed is None:
                continue
            reps = [r for r in (line(i) for i in range(len(self.replicates))) if r is not None]
            slopes = np.array([r[0] for r in reps]) if reps else np.array([observed[0]])
            at = np.array([r[1] for r in reps]) if reps else np.array([observed[1]])
            lines[name] = AllocationLine(observed[0], float(np.quantile(slopes, 0.05)), float(np.quantile(slopes, 0.95)),
                                         2.0 ** observed[1], 2.0 ** float(np.quantile(at, 0.05)),
                                         2.0 ** float(np.quantile(at, 0.95)),
                                         tuple(sorted({cfg[name] for cfg in self.configs.values()})))
        return PlanTrend(float(grid[0]), float(grid[-1]), **lines)

    # ----------------------------------------------------------------------------- warnings

    def _warnings(self, rec: Recommendation) -> list[tuple[str, str]]:
        """``(flag, warning)`` pairs: a short label and the warning with what to run."""
        out = []
        reaching = [k for k in self.keys if k in self.fits and self.reach[k] * 1.0001 >= rec.C]
        if rec.extrapolated and reaching:
            out.append(("beyond the data", f"only {reaching[0]} has data at C = {rec.C:,.0f}: every allocation "
                        "competes on its fit, extrapolated for those studied below C; run the others at this budget "
                        "to measure them (--suggest writes it)"))
        elif rec.extrapolated:
            out.append(("beyond the data", f"C = {rec.C:,.0f} is beyond every allocation's data (they reach "
                        f"{self.data_C:,.0f} at most): the values are the fits extrapolated; run a sweep at this budget "
                        "to measure them (--suggest writes it)"))
        if rec.C > EXTRAPOLATION_SPAN * self.data_C:
            out.append((f"{rec.C / self.data_C:.0f}x past the data", f"C = {rec.C:,.0f} is {rec.C / self.data_C:.0f}x "
                        f"the largest compute studied ({self.data_C:,.0f}); beyond {EXTRAPOLATION_SPAN:g}x no fit here "
                        "has been checked against data: read the allocation as a direction, and run the next budget "
                        "(at most 4x) first"))
        left = [k for k in self.keys if k in self.fits and k not in {c.config for c in rec.contenders}]
        if left:
            out.append(("not every allocation reaches C", f"{len(left)} allocation(s) were studied only below C = "
                        f"{rec.C:,.0f} and did not compete: " + ", ".join(f"{k} (to {self.reach[k]:,.0f})" for k in left)
                        + "; run them at this budget to compare them"))
        likelier = [c for c in rec.contenders if c.p_best > rec.p_best]
        if likelier:
            top = max(likelier, key=lambda c: c.p_best)
            out.append(("a tie: another wins more replicates", f"{top.config} wins more bootstrap replicates "
                        f"(P(best) {top.p_best:.2f}) than the recommendation ({rec.p_best:.2f}), whose fitted value "
                        "is the higher: the two are a tie at this noise; more seeds at C would separate them"))
        if self.unfitted:
            out.append(("allocations without a fit", "no curve could be fitted for " + "; ".join(
                f"{k} ({why})" for k, why in self.unfitted.items()) + ": they did not compete; more evaluations or "
                "a larger budget would give them one"))
        cfg = self.configs[rec.config]
        for name, other in (("n", "Bp"), ("Bp", "n")):
            studied = sorted({c[name] for c in self.configs.values() if c[other] == cfg[other]})
            if name == "n" and cfg[name] == studied[0] == MIN_GROUP:
                continue  # GRPO's floor: n* = 2 is an answer, not a grid to extend
            if len(studied) > 1 and cfg[name] in (studied[0], studied[-1]):
                side, way = ("smallest", "smaller") if cfg[name] == studied[0] else ("largest", "larger")
                out.append((f"{name}* at grid edge", f"{name}* = {cfg[name]} is the {side} {name} studied at {other} = "
                            f"{cfg[other]} ({studied}): the best {name} may be {way}; extend the grid to {way} {name}"))
        trend_n = rec.trend.n if rec.trend else None
        if rec.extrapolated and trend_n:
            studied = list(trend_n.studied)
            if trend_n.at_C_low > studied[-1] or trend_n.at_C_high < studied[0]:
                out.append(("n* trend leaves the grid", f"the trend of n*(C) over the data gives n* ~ "
                            f"{trend_n.at_C:.3g} at C (90% [{trend_n.at_C_low:.3g}, {trend_n.at_C_high:.3g}]), "
                            f"outside the n studied ({studied}): extend the grid"))
        why = F.identification(self.fits[rec.config], self.reach[rec.config])
        if why:
            out.append(("winner's fit not identified", f"the winner's fit is not identified ({'; '.join(why)}): its "
                        "curve has not shown its bend, so its value beyond the data is a guess and the ranking may "
                        "change at larger C"))
        out += [("sweeps disagree", w) for w in self._disagreements()]
        methods = {}
        for data in self.sweeps:
            for key, value in method(data).items():
                methods.setdefault(key, {}).setdefault(value, []).append(data.sweep_id)
        differing = {key: values for key, values in methods.items() if len(values) > 1}
        if differing:
            listed = "; ".join(f"{key}: " + ", ".join(f"{v} ({', '.join(ids)})" for v, ids in values.items())
                               for key, values in differing.items())
            out.append(("methods differ", f"the sweeps pooled differ in method settings ({listed}); pass --sweeps "
                        "to plan from one method"))
        return out

    def _disagreements(self) -> list[str]:
        """Allocations run by two sweeps whose mean running bests at the compute both reach differ beyond their
        seed noise (:func:`beyond_chance`: a pooled two-sample t test, corrected for every comparison made here;
        untestable, and skipped, when no sweep has two trials of the allocation)."""
        tests = []
        for key in self.keys:
            by_sweep: dict[str, list[tuple[Curve, np.ndarray]]] = {}
            for curve, values in self.groups[key]:
                by_sweep.setdefault(curve.key.split("/")[0], []).append((curve, values))
            if len(by_sweep) < 2 or sum(len(v) for v in by_sweep.values()) <= len(by_sweep):
                continue
            common = min(max(float(c.compute.max()) for c, _ in pairs) for pairs in by_sweep.values())
            per_sweep = {sid: [float(v[c.compute <= common].max()) for c, v in pairs] for sid, pairs in by_sweep.items()}
            tests += [(key, common, gap) for gap in sweep_gaps(per_sweep)]
        return [f"{key}: sweeps {g.a} and {g.b} disagree at C = {common:,.0f} ({g.mean_a:.3f} vs {g.mean_b:.3f}, "
                f"gap {g.gap:+.3f}, {abs(g.t):.1f} SE from {g.df} degrees of freedom of seed spread; beyond chance "
                f"at 5% over the {len(tests)} comparison{'s' * (len(tests) > 1)} made): check what differs between "
                "them before pooling" for key, common, g in tests if beyond_chance(g, len(tests))]


@dataclass
class SweepGap:
    """Two sweeps' mean value of one allocation, the gap between them and its two-sample t statistic."""
    a: str
    b: str
    mean_a: float
    mean_b: float
    gap: float
    t: float
    df: int


def sweep_gaps(per_sweep: dict[str, list[float]]) -> list[SweepGap]:
    """Every pair of sweeps (values: one per trial, i.e. per seed): the gap of their means and its t statistic,
    the standard deviation pooled from the seed spread within every sweep (Student's two-sample test with equal
    variances when there are two sweeps). Empty when no sweep has two trials or the spread is 0."""
    df = sum(len(xs) for xs in per_sweep.values()) - len(per_sweep)
    if df <= 0:
        return []
    within = sum(float(np.sum((np.array(xs) - np.mean(xs)) ** 2)) for xs in per_sweep.values())
    sd = math.sqrt(within / df)
    if sd <= 0:
        return []
    ids, out = list(per_sweep), []
    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            a, b = per_sweep[ids[i]], per_sweep[ids[j]]
            gap = float(np.mean(a) - np.mean(b))
            out.append(SweepGap(ids[i], ids[j], float(np.mean(a)), float(np.mean(b)), gap,
                                gap / (sd * math.sqrt(1 / len(a) + 1 / len(b))), df))
    return out


def beyond_chance(gap: SweepGap, comparisons: int, alpha: float = 0.05) -> bool:
    """Whether ``gap``'s two-sided p value is below ``alpha`` over the number of ``comparisons`` made together
    (Bonferroni): with two seeds per sweep the t statistic has few degrees of freedom, and a fixed "twice the
    standard error" would flag about one honest pair in five."""
    return 2 * student.sf(abs(gap.t), gap.df) < alpha / comparisons


# --------------------------------------------------------------------------------- what to run next


def nice(C: float) -> int:
    """``C`` rounded to two significant digits (88,160 -> 88,000): a budget to type."""
    digits = max(0, int(math.floor(math.log10(C))) - 1)
    return int(round(C / 10 ** digits) * 10 ** digits)


def suggestion(planner: Planner, rec: Recommendation) -> tuple[dict, str]:
    """The one sweep (a sweep spec as a dict) that would most shrink ``rec``'s uncertainty, and why.

    In order: n* at the edge of the studied n (other than GRPO's floor, n = 2) -> the grid extended past
    it at the winner's Bp (two more n, doubling); else C beyond the data -> the contenders within noise at
    the next budget toward C (C itself when it is at most 4x the data, else 4x the data); else a tie or a
    P(best) under 0.9 -> two more seeds of the contenders within noise at C; else (settled) -> two more
    seeds of the winner and the runner-up, the cheapest check of the call.
    """
    cfg = planner.configs[rec.config]
    contenders = [c for c in rec.contenders if c.within_noise] or rec.contenders[:1]
    if len(contenders) == 1 and len(rec.contenders) > 1:
        contenders = rec.contenders[:2]
    used_seeds = sorted({s for src in rec.sources for s in src.seeds})
    next_seeds = [max(used_seeds, default=-1) + 1 + i for i in range(2)]
    budget = int(rec.C) if rec.C <= EXTRAPOLATION_SPAN * planner.data_C else nice(EXTRAPOLATION_SPAN * planner.data_C)
    studied_n = sorted({c["n"] for c in planner.configs.values() if c["Bp"] == cfg["Bp"]})
    if len(studied_n) > 1 and cfg["n"] == studied_n[-1]:
        grid = {"n": [cfg["n"], cfg["n"] * 2, cfg["n"] * 4], "Bp": [cfg["Bp"]]}
        seeds, why = [0, 1], (f"n* = {cfg['n']} is the largest n studied at Bp = {cfg['Bp']}: the grid extended to "
                              f"n = {cfg['n'] * 4} at C = {budget:,}")
    elif len(studied_n) > 1 and cfg["n"] == studied_n[0] and cfg["n"] > MIN_GROUP:
        smaller = sorted({max(MIN_GROUP, cfg["n"] // 4), max(MIN_GROUP, cfg["n"] // 2), cfg["n"]})
        grid = {"n": smaller, "Bp": [cfg["Bp"]]}
        seeds, why = [0, 1], (f"n* = {cfg['n']} is the smallest n studied at Bp = {cfg['Bp']}: the grid extended to "
                              f"n = {smaller[0]} at C = {budget:,}")
    elif rec.extrapolated:
        grid = {"n": sorted({c.n for c in contenders}), "Bp": sorted({c.Bp for c in contenders})}
        seeds, why = [0, 1], (f"C is beyond the data ({planner.data_C:,.0f}): the {len(contenders)} contenders within "
                              f"noise measured at C = {budget:,}" + (" (4x the data, the next step toward C)"
                                                                      if budget < rec.C else ""))
    else:
        grid = {"n": sorted({c.n for c in contenders}), "Bp": sorted({c.Bp for c in contenders})}
        seeds = next_seeds
        why = (f"the call at C = {budget:,} is "
               + ("a tie" if len([c for c in rec.contenders if c.within_noise]) > 1 else f"settled (P(best) "
                                                                                             f"{rec.p_best:.2f})")
               + f": seeds {next_seeds} of {', '.join(c.config for c in contenders)} to shrink its interval")
    source = max(planner.sweeps, key=lambda d: d.budget)
    sp = source.sweep_params
    settings = {key[len("spec.set."):]: _value(value) for key, value in sp.items() if key.startswith("spec.set.")}
    difficulty = identity(source)["task.difficulty"]
    spec = {
        "name": f"next-{difficulty}-{short_count(budget)}",
        "description": f"suggested by isosweep recommend --budget {rec.C:g}: {why}",
        "study": "isocompute",
        "trial": sp.get("spec.trial", "trials/easy.yaml"),
        "budget": budget,
        "grid": grid,
        "seeds": seeds,
        "set": settings,
        "frontier": {"metric": rec.metric.split("@")[0], "points": 8, "bootstrap": 200},
        "_trial_from": str(Path(sp.get("sweep.file", "sweeps/x.yaml")).parent),
    }
    return spec, why


def _value(text: str):
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def write_suggestion(spec: dict, why: str, path: str | Path) -> Path:
    """The suggested sweep as a YAML file at ``path`` (its trial file made relative to it)."""
    path = Path(path)
    spec = dict(spec)
    trial = Path(spec.pop("_trial_from")) / spec["trial"]
    spec["trial"] = os.path.relpath(os.path.abspath(trial), os.path.abspath(path.parent))
    path.parent.mkdir(parents=True, exist_ok=True)
    header = f"# {why}\n#   make sweep SWEEP={path}\n"
    path.write_text(header + yaml.safe_dump(spec, sort_keys=False))
    return path


# --------------------------------------------------------------------------------- text


def _f(x: float, digits: int = 3) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def text(rec: Recommendation) -> str:
    """The recommendation as the command prints it."""
    lines = [f"At C = {rec.C:,.0f} rollouts per run ({rec.metric}):", ""]
    lines.append(f"  run  n = {rec.n}, Bp = {rec.Bp}, M = {rec.M:,} steps   ({rec.config}, {rec.n * rec.Bp} rollouts "
                 "per step)")
    lines.append(f"  predicted {rec.metric} = {_f(rec.value)}  (90% interval [{_f(rec.low)}, {_f(rec.high)}])"
                 + ("  -- extrapolated beyond the data" if rec.extrapolated else ""))
    lines.append(f"  P(best) = {_f(rec.p_best, 2)} over {rec.replicates} bootstrap replicates ({rec.noise})")
    close = rec.within_noise()
    if close:
        lines.append("  within noise of it:")
        for c in close:
            lines.append(f"    n = {c.n}, Bp = {c.Bp} (M = {c.M:,}): {_f(c.value)} [{_f(c.low)}, "
                         f"{_f(c.high)}], P(best) {_f(c.p_best, 2)}, behind by {_f(c.lead)} "
                         f"[{_f(c.lead_low)}, {_f(c.lead_high)}]")
    else:
        lines.append("  no other allocation is within noise of it")
    lines.append("")
    lines.append("  every allocation that competed:")
    header = f"    {'config':<12} {'M':>8} {'value':>7} {'90% interval':>17} {'P(best)':>8}  data reach"
    lines.append(header)
    for c in rec.contenders:
        lines.append(f"    {c.config:<12} {c.M:>8,} {_f(c.value):>7} [{_f(c.low)}, {_f(c.high)}]"
                     f"{_f(c.p_best, 2):>9}  {c.reach:,.0f}" + ("  (fit not identified)" if c.not_identified
                                                                        else ""))
    for name, t in (("n", rec.trend.n), ("Bp", rec.trend.Bp)) if rec.trend else ():
        if t:
            lines.append(f"  {name}*(C) trend over C = {rec.trend.C_from:,.0f} .. {rec.trend.C_to:,.0f}: "
                         f"{t.slope_per_decade:+.2f} doublings per decade of C (90% [{t.slope_low:+.2f}, "
                         f"{t.slope_high:+.2f}]); at C: {name}* ~ {t.at_C:.3g} [{t.at_C_low:.3g}, "
                         f"{t.at_C_high:.3g}] (studied {list(t.studied)})")
    lines.append("")
    lines.append("  rests on: " + "; ".join(
        f"{s.sweep_id} (C = {s.budget:,}, {s.trials} trials, seeds {list(s.seeds)}"
        + (f"; {s.repeats_left_out} repeat(s) of another sweep's trial left out" if s.repeats_left_out else "")
        + ")" for s in rec.sources))
    if rec.warnings:
        lines.append("")
        lines += [f"  warning: {w}" for w in rec.warnings]
    return "\n".join(lines)


def plot(rec: Recommendation) -> bytes:
    """Each competing allocation's predicted value at C with its 90% interval (the recommendation filled)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(rec.contenders) + 1.6))
    for i, c in enumerate(reversed(rec.contenders)):
        low, high = c.low, c.high
        if not math.isnan(low):
            ax.plot([low, high], [i, i], color="tab:blue" if c.within_noise else "0.6", lw=2)
        ax.plot(c.value, i, "o", color="tab:blue" if c.within_noise else "0.6",
                mfc="tab:blue" if c.config == rec.config else "white")
    ax.set_yticks(range(len(rec.contenders)))
    ax.set_yticklabels([f"{c.config} (M={c.M:,})" for c in reversed(rec.contenders)])
    ax.set_xlabel(f"predicted {rec.metric} at C = {rec.C:,.0f}" + (" (extrapolated)" if rec.extrapolated else ""))
    ax.set_title(f"recommend: {rec.config}, P(best) {rec.p_best:.2f}; blue: within noise")
    fig.tight_layout()
    try:
        return png(fig)
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------------- checks


def cut(curve: Curve, C: float) -> Curve:
    """``curve`` as it stood when its trial reached compute ``C``: the evaluations at compute <= C, and its
    zero-signal check if one of those is past compute 0 (the first such record carries it)."""
    keep = curve.compute <= C
    return Curve(key=curve.key, config=curve.config, fields=dict(curve.fields), compute=curve.compute[keep],
                 values={k: v[keep] for k, v in curve.values.items()},
                 counts=None if curve.counts is None else curve.counts[keep], samples=curve.samples,
                 eval_set=curve.eval_set,
                 zero_signal=curve.zero_signal if np.any(curve.compute[keep] > 0) else None)


def truncate(sweeps: list[SweepData], C: float) -> list[SweepData]:
    """The sweeps as if each had been run at budget ``C`` (<= its own): every evaluation above C dropped."""
    return [SweepData(data.sweep_id, int(min(C, data.budget)), data.trial_params, data.sweep_params,
                      [cut(c, C) for c in data.curves]) for data in sweeps]


def observed_at(sweeps: list[SweepData], metric: str, C: float) -> dict[str, float]:
    """Each allocation's mean over its trials of the running best at compute <= C, among the trials reaching C."""
    seen: dict[str, list[float]] = {}
    for data in sweeps:
        for c in data.curves:
            if reached(c, data.budget) * 1.0001 >= C and metric in c.values:
                seen.setdefault(c.config, []).append(float(c.values[metric][c.compute <= C].max()))
    return {k: float(np.mean(v)) for k, v in seen.items()}


def metric_name(curves: list[Curve], metric: str) -> str:
    """The logged name of ``metric`` (``mean`` -> ``mean@4``) that every one of ``curves`` has."""
    names = sorted(set.intersection(*(set(c.values) for c in curves)))
    have = sorted({m.split("@")[0] for m in names})
    chosen = [m for m in names if m.split("@")[0] == metric]
    if len(chosen) != 1:
        raise ConfigError(f"metric {metric!r}: not logged by every trial of the sweeps used "
                          f"(every trial has {have or 'no eval metric'}; k values: {names})")
    return chosen[0]


def leave_one_budget_out(sweeps: list[SweepData], metric: str = "mean", *, fraction: float = 0.25,
                         bootstrap: int = 100) -> BudgetCheck:
    """Recommend at the largest budget studied from the data at ``C <= fraction * C_max`` only, and compare
    with what was observed at C_max: the recommendation, its interval, the observed best, and whether the
    recommended allocation's observed value is within its interval and within noise of the observed best.
    C_max is the largest budget at which at least two allocations were observed (a single long run beside
    shorter grids leaves nothing to pick between at its own budget). The planner picks among the allocations
    observed at C_max (``candidates``): a pick that was never run there could not be scored."""
    name = metric_name([c for d in sweeps for c in d.curves], metric)
    budgets = sorted({d.budget for d in sweeps}, reverse=True)
    c_max = next((b for b in budgets if len(observed_at(sweeps, name, b)) >= 2), budgets[0])
    seen = observed_at(sweeps, name, c_max)
    runs = [replace(d, curves=[c for c in d.curves if c.config in seen]) for d in sweeps]
    planner = Planner(truncate([d for d in runs if d.curves], fraction * c_max), metric, bootstrap=bootstrap)
    rec = planner.at(c_max)
    best = max(seen, key=seen.get) if seen else None
    got = seen.get(rec.config, math.nan)
    return BudgetCheck(c_max, fraction * c_max, rec.config, rec.value, rec.low, rec.high, rec.p_best, best,
                       seen.get(best, math.nan), got, rec.config == best,
                       bool(rec.low <= got <= rec.high) if not math.isnan(got) else None,
                       (seen[best] - got) if best and not math.isnan(got) else math.nan,
                       tuple(c.config for c in rec.contenders if c.within_noise), tuple(rec.warnings), seen,
                       tuple(sorted(seen)))
