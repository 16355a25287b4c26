"""A finished table of learning curves as a simulator of HPO studies: the curves, what a trial costs, snapping.

A table (``isosweep hpo-table``: every configuration of a grid x every size of a model ladder x training
seeds, each curve evaluated at a few budgets) is read by :class:`Curves`. A replayed trial "runs"
``(size, configuration, seed)`` by reading that curve up to its budget and is charged what training it would
have cost (:class:`Study`), so a study that takes hours live takes a second.

**Cost**, in the units the study is charged in: one unit is one target-size trial at the full budget C. A
trial of ``r`` rollouts on a size with ``p`` parameters costs ``fixed + (r / C) * (p / p_target)`` (compute is
proportional to parameters x rollouts; ``fixed`` is what every trial pays whatever its length: start-up, model
load, the base evaluation). A study budget of ``4x`` is what four full target trials cost, ``4 * (1 + fixed)``.
A **promotion** (the same size, configuration and training seed continued to a larger budget, from its
checkpoint) is charged the added rollouts only. A study never overspends: a trial starts only if what is left
pays for it.

**Score**: the *true value* of a configuration is the table's mean over its training seeds at the target and
the full budget; the regret of a recommendation is the best true value minus its true value.

**Snapping** (:func:`snap`): a proposal off the grid is read at each axis's nearest grid value (log distance
on log axes) and the next evaluation budget the table has.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from isosweep.experiments.hpo_table import TableSpec, config_key, configs
from isosweep.experiments.replay.records import ProxyVerdict, ReplayRecord
from isosweep.experiments.replay.stats import compute_to_eps
from isosweep.hpo.space import Param, SearchSpace
from isosweep.models.sizes import SIZES, param_count

SLACK = 1e-12
"""What a study may overrun its budget by (float rounding of the charges)."""


class Curves:
    """A finished table as a simulator: ``value(size, key, seed, rollouts)`` and the true values.

    ``shuffle_proxies`` (a searcher seed) gives each proxy size's curves to the wrong configurations (a fixed
    derangement drawn from the seed), so the proxies carry no information about the target; the target's curves
    and the true values are untouched."""

    def __init__(self, table: dict[str, Any], params: dict[str, int] | None = None,
                 shuffle_proxies: int | None = None) -> None:
        spec = TableSpec(**table["spec"])
        self.spec, self.sizes, self.target, self.budget = spec, list(spec.sizes), spec.sizes[-1], spec.budget
        self.configs = configs(spec)
        self.keys = [config_key(c) for c in self.configs]
        self.seeds = list(spec.seeds)
        unknown = [s for s in self.sizes if s not in SIZES and s not in (params or {})]
        if unknown:
            raise ValueError(f"sizes {unknown} are not tiny sizes: give their parameter counts")
        self.params = {s: (params or {}).get(s) or param_count(s) for s in self.sizes}
        self._values: dict[tuple[str, str, int], dict[int, float]] = {}
        variances = []
        for cell in table["cells"]:
            rates = {int(p["rollouts"]): np.asarray(p["counts"], dtype=float) / p["samples"] for p in cell["curve"]}
            self._values[(cell["size"], config_key(cell["config"]), int(cell["seed"]))] = {
                r: float(v.mean()) for r, v in rates.items()}
            variances += [float(v.var(ddof=1) / v.size) for v in rates.values() if v.size > 1]
        self.eval_variance = statistics.median(variances) if variances else 0.0
        """The variance of one evaluation's value from its finite eval set (median over the table)."""
        expected = len(self.sizes) * len(self.keys) * len(self.seeds)
        if len(self._values) < expected:
            raise ValueError(f"the table {table['name']!r} has {len(self._values)} of {expected} curves: "
                             "build the rest (isosweep hpo-table) before replaying searchers on it")
        shared = set.intersection(*(set(curve) for curve in self._values.values()))
        self.points = sorted(r for r in shared if r > 0)
        if not self.points or self.points[-1] != self.budget:
            raise ValueError(f"the curves share no evaluation at the full budget C = {self.budget:,}")
        self.base = {size: statistics.fmean(curve[0] for (s, _, _), curve in self._values.items() if s == size)
                     for size in self.sizes}
        self._alias = {size: {key: key for key in self.keys} for size in self.sizes}
        if shuffle_proxies is not None:
            rng = np.random.default_rng([shuffle_proxies, 7])
            for size in self.sizes[:-1]:
                order = derangement(len(self.keys), rng)
                self._alias[size] = {key: self.keys[j] for key, j in zip(self.keys, order)}
        self.true = {key: statistics.fmean(self._values[(self.target, key, s)][self.budget] for s in self.seeds)
                     for key in self.keys}
        self.best = max(self.true.values())

    def value(self, size: str, key: str, seed: int, rollouts: int) -> float:
        return self._values[(size, self._alias[size][key], seed)][rollouts]

    def ratio(self, size: str) -> float:
        """Parameters relative to the target: what one rollout costs on ``size`` in target units."""
        return self.params[size] / self.params[self.target]

    def regret(self, key: str) -> float:
        return self.best - self.true[key]


def derangement(n: int, rng: np.random.Generator) -> list[int]:
    """A random permutation of ``range(n)`` that moves every element (n >= 2)."""
    while True:
        order = rng.permutation(n).tolist()
        if n < 2 or all(i != j for i, j in enumerate(order)):
            return order


@dataclass(eq=False)
class Run:
    """One trial of a study: ``(size, key, seed)`` trained to ``done`` rollouts so far; ``stopped`` when it
    collapsed (it is not continued again). Compared and hashed by identity: a study's runs are its state."""

    size: str
    key: str
    seed: int
    done: int = 0
    stopped: bool = False


@dataclass(frozen=True)
class Step:
    """The study after one trial: spent (in study units) and what it recommended then, with its regret."""

    spent: float
    recommended: str | None
    regret: float | None


class Study:
    """One replayed study: the spend, the runs (continuable), and the recommendation after each trial."""

    def __init__(self, curves: Curves, study_budget: float, fixed: float, collapse: float | None = None) -> None:
        self.curves, self.study_budget, self.fixed = curves, float(study_budget), float(fixed)
        self.collapse = collapse
        self.stops = 0
        self.spent = 0.0
        self.runs: list[Run] = []
        self.trajectory: list[Step] = []
        self.trials = 0
        self.promotions = 0
        self.by_size = {size: 0 for size in curves.sizes}
        self.proxy_verdict: ProxyVerdict | None = None

    @property
    def left(self) -> float:
        return self.study_budget - self.spent

    def price(self, size: str, upto: int, run: Run | None = None) -> float:
        """What a fresh trial (``run`` None) or the continuation of ``run`` to ``upto`` rollouts costs."""
        done = 0 if run is None else run.done
        return (self.fixed if run is None else 0.0) + (upto - done) / self.curves.budget * self.curves.ratio(size)

    def affords(self, size: str, upto: int, run: Run | None = None, keep: float = 0.0) -> bool:
        """Whether the study, keeping ``keep`` back, can pay for a fresh trial or the continuation of ``run``."""
        return self.price(size, upto, run) <= self.left - keep + SLACK

    def run(self, size: str, key: str, upto: int, seed: int | None = None, run: Run | None = None,
            ) -> tuple[Run, list[tuple[int, float]]]:
        """Train a fresh trial (``seed``) or continue ``run`` to ``upto``; charge it; its new evaluations.

        A trial whose evaluation falls more than ``collapse`` below its size's base model stops there
        (``run.stopped``) and is charged only the rollouts it trained; it is not continued again.
        """
        if not self.affords(size, upto, run):
            raise ValueError("the study cannot pay for this trial")
        if run is None:
            run = Run(size, key, seed)
            self.runs.append(run)
            self.by_size[size] += 1
            self.spent += self.fixed
        else:
            self.promotions += 1
        points = []
        for r in self.curves.points:
            if run.done < r <= upto:
                points.append((r, self.curves.value(size, key, run.seed, r)))
                if self.collapse is not None and points[-1][1] < self.curves.base[size] - self.collapse:
                    run.stopped = True
                    self.stops += 1
                    upto = r
                    break
        self.spent += (upto - run.done) / self.curves.budget * self.curves.ratio(size)
        run.done = upto
        self.trials += 1
        return run, points

    def record(self, recommended: str | None) -> None:
        self.trajectory.append(Step(self.spent, recommended,
                                    None if recommended is None else self.curves.regret(recommended)))

    def result(self, method: str, seed: int, eps: float) -> ReplayRecord:
        """The study's outcome; spends in full target trials (``1 + fixed`` each)."""
        unit = 1 + self.fixed
        final = self.trajectory[-1].recommended if self.trajectory else None
        return ReplayRecord(
            seed=seed, method=method, recommended=final, regret=None if final is None else self.curves.regret(final),
            compute_to_eps=compute_to_eps([(p.spent / unit, p.regret) for p in self.trajectory], eps),
            spent=self.spent / unit, trials=self.trials, promotions=self.promotions, stops=self.stops,
            by_size=dict(self.by_size), proxy_verdict=self.proxy_verdict,
            trajectory=tuple((round(p.spent / unit, 4), None if p.regret is None else round(p.regret, 5))
                             for p in self.trajectory))


def search_space(curves: Curves, size_scale: str = "params") -> SearchSpace:
    """The grid's axes as a JF-HPO space (log axes where the values span a decade or more)."""
    params = []
    for key, values in curves.spec.grid.items():
        low, high = min(values), max(values)
        if len(values) < 2 or not all(isinstance(v, (int, float)) for v in values):
            raise ValueError(f"grid axis {key!r}: JF-HPO needs numeric axes with at least two values")
        params.append(Param(key, float(low), float(high), log=low > 0 and high / low >= 10))
    step = curves.points[0]
    if any(p % step for p in curves.points):
        raise ValueError(f"the table's evaluation budgets {curves.points} are not multiples of the first")
    return SearchSpace(params=tuple(params), sizes=dict(curves.params), budget_min=step, budget_max=curves.budget,
                       target=curves.target, budget_step=step, min_budget=step, size_scale=size_scale)


def snap(curves: Curves, space: SearchSpace, config: dict[str, Any]) -> tuple[str, str, int]:
    """``(size, configuration key, budget)`` of a proposal: each axis at its nearest grid value (log
    distance on log axes), the budget up to the next evaluation the table has."""
    chosen = {}
    for param in space.params:
        value = float(config[param.name])
        grid = curves.spec.grid[param.name]
        dist = (lambda v: abs(math.log(v) - math.log(value))) if param.log else (lambda v: abs(v - value))
        chosen[param.name] = min(grid, key=dist)
    budget = next(p for p in curves.points if p >= int(config[space.budget_key]) - 1e-9)
    return str(config[space.size_key]), config_key(chosen), budget
