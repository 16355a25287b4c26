"""Searchers replayed on a table of learning curves: JF-HPO against random search, ASHA and Hyperband.

A table (``isosweep hpo-table``: every configuration of a grid x every size of a model ladder x
training seeds, each curve evaluated at a few budgets) is a simulator of HPO studies. A replayed
trial "runs" ``(size, configuration, seed)`` by reading that curve up to its budget and is charged
what training it would have cost, so a study that takes hours live takes a second, and each
method can be run on 20+ searcher seeds.

**Cost**, in the units the study is charged in: one unit is one target-size trial at the full
budget C. A trial of ``r`` rollouts on a size with ``p`` parameters costs
``fixed + (r / C) * (p / p_target)`` (compute is proportional to parameters x rollouts; ``fixed``
is what every trial pays whatever its length: start-up, model load, the base evaluation). A study
budget of ``4x`` is what four full target trials cost, ``4 * (1 + fixed)``. A
**promotion** (the same size, configuration and training seed continued to a larger budget, from
its checkpoint) is charged the added rollouts only. A study never overspends: a trial starts
only if what is left pays for it.

**The methods** (each with its own random stream, derived from the searcher seed):

- ``random``: a configuration drawn uniformly from the grid (with replacement), at the target
  size and budget C; recommends the configuration with the best mean of its observed values.
- ``asha``: asynchronous successive halving at the target size, rungs at the table's evaluation
  budgets, reduction factor 2, run one trial at a time (promote the best not-yet-promoted
  configuration of the highest rung that has one in its top half, else start a new random one at
  the lowest rung); recommends the best configuration of the highest rung reached.
- ``jfhpo-log``: the same with the size fidelity on a log scale (``size_scale: log``: rungs at
  0.5, 0.75, 1 for a ladder that doubles twice, instead of 0.06, 0.25, 1 in parameters).
- ``bo-target``: the ablation of JF-HPO's proxies: the same searcher, every trial at the target size
  (``proxy_budget`` 0, no proxy check), so its only cheaper fidelity is the budget. What JF-HPO gains
  over it is what the smaller sizes buy.
- ``hyperband``: Hyperband's brackets over the same rungs (factor 2), in turn; each bracket is a
  successive halving from its own lowest rung; recommends like ``asha``.
- ``jfhpo``: isosweep's ``JFHPOSearcher`` (multi-fidelity GP over hyperparameters x size x budget,
  cost-aware log EI) driven directly: its acquisition is scored on every point of the table (each
  configuration x size x evaluation budget, ``candidates``; option ``acquisition: continuous``
  optimises it over the continuous box instead and snaps the proposal to the grid, nearest value of
  each axis, in log space for log axes, and to the table's budgets, up to the next evaluation),
  its GP's hyperparameters are refitted every 4 observations (``refit_every``; in between the last
  fit is conditioned on the new data: a replay 1.5-3.6x faster on seeds 0-3 of the ladder table,
  whose recommendations kept their learning rate),
  every evaluation of a trial is reported to it (intermediate observations), its cost model
  is fitted to the nominal cost above (the units the study is charged in), the objective is the
  gain over the size's base model, the GP's noise is floored at the evaluation's own variance (from
  the table's per-problem counts), a proposal that repeats a configuration run at a smaller
  budget is a promotion, and one full target trial's worth of the budget is kept for the end,
  where its recommendation is run at the target (a recommendation backed by a full-fidelity run).
  Its proxies must earn their trust (``proxy_check``, :data:`PROXY_CHECK` configurations run at the
  target's smallest budget after the initial design; distrusted, the rest of the study is at the target)
  and may cost at most :data:`PROXY_SHARE` of the study budget (``proxy_budget``). Both settings were
  chosen on searcher seeds 100-107 of the muP-style ladder's table (3 or 4 configurations, with and
  without the cap), apart from the seeds 0-19 a comparison reports.

**Score**: the *true value* of a configuration is the table's mean over its training seeds at
the target and the full budget. A study's **regret** is the best true value minus the true value
of what it recommends at the end; its **compute to epsilon** is the spend at which its
recommendation first came within ``eps`` of the best (``None``: never). Over searcher seeds:
medians with bootstrap intervals and a paired Wilcoxon test (the same seed index for every
method: the same training-seed draws are not shared, but the same table is).

**Control**: ``shuffle_proxies`` gives each proxy size's curves to the wrong configurations (a
fixed permutation per searcher seed), so the proxies carry no information about the target; a
method that trusts its proxies must not fall far below random search there.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import statistics
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import wilcoxon

from isosweep.experiments.hpo_table import RHO_MIN, TableSpec, config_key, configs, signal
from isosweep.hpo.space import Param, SearchSpace
from isosweep.models.sizes import SIZES, param_count
from isosweep.spec.yamlio import ConfigError

METHODS = ("jfhpo", "jfhpo-log", "bo-target", "random", "asha", "hyperband")
PROXY_CHECK = 3
"""JF-HPO's proxy check in the replay: configurations verified at the target (``JFHPOSearcher(proxy_check=)``)."""
PROXY_SHARE = 0.5
"""The most of a study's budget JF-HPO may spend below the target size in the replay (``proxy_budget``)."""
ETA = 2


class Curves:
    """A finished table as a simulator: ``value(size, key, seed, rollouts)`` and the true values."""

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


class Study:
    """One replayed study: the spend, the runs (continuable), and the recommendation after each trial."""

    def __init__(self, curves: Curves, study_budget: float, fixed: float, collapse: float | None = None) -> None:
        self.curves, self.study_budget, self.fixed = curves, float(study_budget), float(fixed)
        self.collapse = collapse
        self.stops = 0
        self.spent = 0.0
        self.runs: list[dict[str, Any]] = []  # {size, key, seed, done}
        self.trajectory: list[dict[str, Any]] = []
        self.trials = 0
        self.promotions = 0
        self.by_size = {size: 0 for size in curves.sizes}
        self.extra: dict[str, Any] = {}

    @property
    def left(self) -> float:
        return self.study_budget - self.spent

    def price(self, size: str, upto: int, run: dict[str, Any] | None = None) -> float:
        """What a fresh trial (``run`` None) or the continuation of ``run`` to ``upto`` rollouts costs."""
        done = 0 if run is None else run["done"]
        return (self.fixed if run is None else 0.0) + (upto - done) / self.curves.budget * self.curves.ratio(size)

    def run(self, size: str, key: str, upto: int, seed: int | None = None, run: dict[str, Any] | None = None,
            ) -> tuple[dict[str, Any], list[tuple[int, float]]]:
        """Train a fresh trial (``seed``) or continue ``run`` to ``upto``; charge it; its new evaluations.

        A trial whose evaluation falls more than ``collapse`` below its size's base model stops there
        (``run["stopped"]``) and is charged only the rollouts it trained; it is not continued again.
        """
        cost = self.price(size, upto, run)
        if cost > self.left + 1e-12:
            raise ValueError("the study cannot pay for this trial")
        if run is None:
            run = {"size": size, "key": key, "seed": seed, "done": 0, "stopped": False}
            self.runs.append(run)
            self.by_size[size] += 1
            self.spent += self.fixed
        else:
            self.promotions += 1
        points = []
        for r in self.curves.points:
            if run["done"] < r <= upto:
                points.append((r, self.curves.value(size, key, run["seed"], r)))
                if self.collapse is not None and points[-1][1] < self.curves.base[size] - self.collapse:
                    run["stopped"] = True
                    self.stops += 1
                    upto = r
                    break
        self.spent += (upto - run["done"]) / self.curves.budget * self.curves.ratio(size)
        run["done"] = upto
        self.trials += 1
        return run, points

    def record(self, recommended: str | None) -> None:
        self.trajectory.append({"spent": self.spent, "recommended": recommended,
                                "regret": None if recommended is None else self.curves.regret(recommended)})

    def result(self, method: str, eps: float) -> dict[str, Any]:
        """The study's outcome; spends in full target trials (``1 + fixed`` each)."""
        unit = 1 + self.fixed
        final = self.trajectory[-1]["recommended"] if self.trajectory else None
        reach = next((p["spent"] / unit for p in self.trajectory if p["regret"] is not None and p["regret"] <= eps),
                     None)
        return {"method": method, "recommended": final, "regret": None if final is None else self.curves.regret(final),
                "compute_to_eps": reach, "spent": self.spent / unit, "trials": self.trials,
                "promotions": self.promotions, "stops": self.stops, "by_size": dict(self.by_size), **self.extra,
                "trajectory": [[round(p["spent"] / unit, 4), None if p["regret"] is None else round(p["regret"], 5)]
                               for p in self.trajectory]}


# -- the baselines -------------------------------------------------------------------------------

def run_random(curves: Curves, study: Study, seed: int) -> None:
    rng = np.random.default_rng([seed, 1])
    observed: dict[str, list[float]] = {}
    target, budget = curves.target, curves.budget
    while study.price(target, budget) <= study.left + 1e-12:
        key = curves.keys[int(rng.integers(len(curves.keys)))]
        _, points = study.run(target, key, budget, seed=int(rng.choice(curves.seeds)))
        observed.setdefault(key, []).append(points[-1][1])
        study.record(max(observed, key=lambda k: statistics.fmean(observed[k])))


def _best_of_highest_rung(rungs: list[list[tuple[float, dict]]]) -> str | None:
    for rung in reversed(rungs):
        if rung:
            return max(rung, key=lambda entry: entry[0])[1]["key"]
    return None


def run_asha(curves: Curves, study: Study, seed: int) -> None:
    rng = np.random.default_rng([seed, 2])
    target, points = curves.target, curves.points
    rungs: list[list[tuple[float, dict]]] = [[] for _ in points]
    promoted: list[set[int]] = [set() for _ in points]  # per rung: the runs promoted out of it
    while True:
        job = None
        for k in reversed(range(len(points) - 1)):
            ranked = sorted(rungs[k], key=lambda entry: entry[0], reverse=True)
            top = [entry for entry in ranked[:len(ranked) // ETA]
                   if id(entry[1]) not in promoted[k] and not entry[1]["stopped"]]
            if top and study.price(target, points[k + 1], top[0][1]) <= study.left + 1e-12:
                job = (k + 1, top[0][1])
                break
        if job is not None:
            k, run = job
            promoted[k - 1].add(id(run))
            _, new = study.run(target, run["key"], points[k], run=run)
        else:
            if study.price(target, points[0]) > study.left + 1e-12:
                break
            key = curves.keys[int(rng.integers(len(curves.keys)))]
            run, new = study.run(target, key, points[0], seed=int(rng.choice(curves.seeds)))
        rungs[points.index(run["done"])].append((new[-1][1], run))
        study.record(_best_of_highest_rung(rungs))


def run_hyperband(curves: Curves, study: Study, seed: int) -> None:
    rng = np.random.default_rng([seed, 3])
    target, points = curves.target, curves.points
    s_max = len(points) - 1
    rungs: list[list[tuple[float, dict]]] = [[] for _ in points]
    bracket = s_max
    while study.price(target, points[s_max - bracket]) <= study.left + 1e-12:
        n = math.ceil((s_max + 1) / (bracket + 1) * ETA ** bracket)
        level = s_max - bracket
        alive: list[tuple[float, dict]] = []
        for _ in range(n):
            if study.price(target, points[level]) > study.left + 1e-12:
                break
            key = curves.keys[int(rng.integers(len(curves.keys)))]
            run, new = study.run(target, key, points[level], seed=int(rng.choice(curves.seeds)))
            rungs[points.index(run["done"])].append((new[-1][1], run))
            if not run["stopped"]:
                alive.append(rungs[points.index(run["done"])][-1])
            study.record(_best_of_highest_rung(rungs))
        while level < s_max and alive:
            keep = max(1, len(alive) // ETA)
            alive = sorted(alive, key=lambda entry: entry[0], reverse=True)[:keep]
            level += 1
            nxt = []
            for _, run in alive:
                if study.price(target, points[level], run) > study.left + 1e-12:
                    break
                _, new = study.run(target, run["key"], points[level], run=run)
                rungs[level].append((new[-1][1], run))
                if not run["stopped"]:
                    nxt.append(rungs[level][-1])
                study.record(_best_of_highest_rung(rungs))
            alive = nxt
        bracket = s_max if bracket == 0 else bracket - 1


# -- JF-HPO --------------------------------------------------------------------------------------

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


def snap(curves: Curves, space, config: dict[str, Any]) -> tuple[str, str, int]:
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


def run_jfhpo(curves: Curves, study: Study, seed: int, options: dict[str, Any] | None = None,
              size_scale: str = "params") -> None:
    from isosweep.hpo.searcher import JFHPOSearcher  # reason: torch and BoTorch, for the JF-HPO methods only

    options = {"num_restarts": 2, "raw_samples": 64, "fit_maxiter": 60, "acq_maxiter": 60, "refit_every": 4,
               "proxy_check": PROXY_CHECK, "proxy_share": PROXY_SHARE, **(options or {})}
    share = options.pop("proxy_share")
    options["proxy_budget"] = None if share is None else share * study.study_budget
    space = search_space(curves, size_scale)
    if options.pop("acquisition", "grid") == "grid":  # the table is a grid: score its points, not the continuous box
        options["candidates"] = [{**config, space.size_key: size, space.budget_key: point}
                                 for config in curves.configs for size in curves.sizes for point in curves.points]
    rng = np.random.default_rng([seed, 4])
    by_key = dict(zip(curves.keys, curves.configs))
    options.setdefault("noise_floor", curves.eval_variance)
    searcher = JFHPOSearcher(space, metric="gain", mode="max", seed=seed, time_attr="nominal",
                             progress_key="rollouts", intermediate=len(curves.points), **options)
    target, budget = curves.target, curves.budget
    reserve = study.price(target, budget)  # the final full-fidelity run of the recommendation
    runs: dict[tuple[str, str], dict[str, Any]] = {}

    def recommended() -> str | None:
        config = searcher.recommend()
        return None if config is None else snap(curves, space, config)[1]

    def observe(trial_id: str, size: str, key: str, upto: int, run: dict | None) -> dict:
        run, new = study.run(size, key, upto, seed=int(rng.choice(curves.seeds)) if run is None else None, run=run)
        searcher.replace_live(trial_id, {**{p.name: by_key[key][p.name] for p in space.params},
                                         space.size_key: size, space.budget_key: upto})
        for rollouts, value in new[:-1]:
            searcher.on_trial_result(trial_id, {"gain": value - curves.base[size], "rollouts": rollouts})
        rollouts, value = new[-1]
        searcher.on_trial_complete(trial_id, {"gain": value - curves.base[size], "rollouts": rollouts,
                                              "nominal": study.price(size, run["done"])})
        return run

    i = 0
    while study.left - reserve > 1e-12:
        trial_id = f"t{i}"
        i += 1
        config = searcher.suggest(trial_id)
        size, key, upto = snap(curves, space, config)
        run = runs.get((size, key))
        if run is not None and (run["done"] >= upto or run["stopped"]):
            run = None  # a repeat of what it has seen (or a stopped trial): a fresh trial, another training seed
        # cut what does not fit: the budget first, then the size (unless the searcher keeps to the target)
        while study.price(size, upto, run) > study.left - reserve + 1e-12:
            lower = [p for p in curves.points if p < upto and (run is None or p > run["done"])]
            smaller = [] if searcher.target_only() else curves.sizes[:curves.sizes.index(size)]
            if lower:
                upto = lower[-1]
            elif smaller:
                size, upto = smaller[-1], curves.points[-1]
                run = runs.get((size, key))
                if run is not None and (run["done"] >= upto or run["stopped"]):
                    run = None
            else:
                break
        if study.price(size, upto, run) > study.left - reserve + 1e-12:
            searcher.on_trial_complete(trial_id, None)  # nothing fits: the search phase is over
            break
        runs[(size, key)] = observe(trial_id, size, key, upto, run)
        study.record(recommended())
    # the recommendation, run at the target (a continuation when the search ran it part-way)
    key = recommended()
    if key is not None:
        run = runs.get((target, key))
        if run is not None and (run["done"] >= budget or run["stopped"]):
            run = None
        if study.price(target, budget, run) <= study.left + 1e-12:
            trial_id = f"t{i}"
            searcher.suggest(trial_id)
            observe(trial_id, target, key, budget, run)
            study.record(recommended())
    study.extra["proxy_verdict"] = searcher.proxy_verdict


RUNNERS: dict[str, Callable[..., None]] = {"random": run_random, "asha": run_asha, "hyperband": run_hyperband}


def replay(curves: Curves, method: str, study_budget: float, seed: int, fixed: float, eps: float,
           options: dict[str, Any] | None = None, collapse: float | None = None) -> dict[str, Any]:
    """One study of ``method`` on ``curves`` with a budget of ``study_budget`` full target trials (trials
    that collapse by more than ``collapse`` below their base model stop there)."""
    study = Study(curves, study_budget * (1 + fixed), fixed, collapse)
    if method.startswith("jfhpo") or method == "bo-target":
        import torch  # reason: the GP's thread count, for the JF-HPO methods only

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one thread in every process: a study's result does not depend on --jobs
        try:
            if method == "bo-target":
                options = {**(options or {}), "proxy_check": 0, "proxy_share": 0.0}
            run_jfhpo(curves, study, seed, options, size_scale="log" if method == "jfhpo-log" else "params")
        finally:
            torch.set_num_threads(threads)
    else:
        RUNNERS[method](curves, study, seed)
    return {"seed": seed, **study.result(method, eps)}


_WORKER: dict[str, Any] = {}
"""What every study of one comparison shares, in each process: the table's settings and its curves."""


def _init_worker(table: dict[str, Any], fixed: float, eps: float, options: dict[str, Any] | None,
                 collapse: float | None) -> None:
    _WORKER.clear()
    _WORKER.update(table=table, fixed=fixed, eps=eps, options=options, collapse=collapse,
                   curves={None: Curves(table)})


def _replay_task(task: tuple[bool | None, str, float, int]) -> dict[str, Any]:
    """One study of a comparison (``(shuffled, method, study budget, seed)``) in this process's worker state."""
    shuffle, method, study_budget, seed = task
    key = seed if shuffle else None  # the control's permutation is drawn from the searcher seed
    if key not in _WORKER["curves"]:
        _WORKER["curves"][key] = Curves(_WORKER["table"], shuffle_proxies=seed)
    return replay(_WORKER["curves"][key], method, study_budget, seed, _WORKER["fixed"], _WORKER["eps"],
                  _WORKER["options"], _WORKER["collapse"])


# -- statistics ----------------------------------------------------------------------------------

def bootstrap_median(values: list[float], rng: np.random.Generator, draws: int = 2000) -> tuple[float, float, float]:
    """The median and its 95% percentile-bootstrap interval (``inf`` stands for never)."""
    data = np.asarray(values, dtype=float)
    medians = np.median(data[rng.integers(0, len(data), (draws, len(data)))], axis=1)
    return float(np.median(data)), float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def paired_test(a: list[float], b: list[float]) -> dict[str, Any]:
    """Wilcoxon signed-rank test of ``a - b`` (paired by searcher seed); equal pairs are split. ``inf``
    (never reached) ranks above every finite value and ties with itself."""
    never = 1e9
    diffs = (np.nan_to_num(np.asarray(a, dtype=float), posinf=never)
             - np.nan_to_num(np.asarray(b, dtype=float), posinf=never))
    if diffs.size == 0 or not np.any(diffs != 0):
        return {"median_diff": 0.0 if diffs.size else None, "p": 1.0, "wins": 0, "losses": 0, "ties": int(diffs.size)}
    p = float(wilcoxon(diffs, zero_method="zsplit").pvalue)
    median = float(np.median(diffs))
    # a median that involves a never-reached seed is not a number of target trials (an even count of pairs
    # averages a finite middle value with 1e9: about 5e8)
    return {"median_diff": None if abs(median) >= never / 4 else median, "p": p, "wins": int((diffs < 0).sum()),
            "losses": int((diffs > 0).sum()), "ties": int((diffs == 0).sum())}


def summarize(results: dict[str, list[dict[str, Any]]], seed: int = 0) -> dict[str, Any]:
    """Per method: median regret and compute to epsilon with intervals; JF-HPO against each baseline."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for method, runs in results.items():
        regrets = [r["regret"] for r in runs]
        reach = [math.inf if r["compute_to_eps"] is None else r["compute_to_eps"] for r in runs]
        med, lo, hi = bootstrap_median(regrets, rng)
        cmed, clo, chi = bootstrap_median(reach, rng)
        out[method] = {
            "regret_median": med, "regret_ci95": [lo, hi], "regret_mean": statistics.fmean(regrets),
            "zero_regret": f"{sum(r == 0 for r in regrets)}/{len(runs)}",
            "compute_to_eps_median": None if math.isinf(cmed) else cmed,
            "compute_to_eps_ci95": [None if math.isinf(v) else v for v in (clo, chi)],
            "reached_eps": f"{sum(math.isfinite(v) for v in reach)}/{len(runs)}",
            "trials_mean": statistics.fmean(r["trials"] for r in runs),
            "promotions_mean": statistics.fmean(r["promotions"] for r in runs),
            "stops_mean": statistics.fmean(r["stops"] for r in runs),
            "by_size_mean": {size: statistics.fmean(r["by_size"][size] for r in runs) for size in runs[0]["by_size"]},
        }
        verdicts = [r["proxy_verdict"] for r in runs if r.get("proxy_verdict")]
        if verdicts:
            out[method]["proxies_trusted"] = f"{sum(v['trusted'] for v in verdicts)}/{len(runs)}"
    for mine in [m for m in results if m.startswith("jfhpo")]:
        for method in results:
            if method.startswith("jfhpo"):
                continue
            a, b = results[mine], results[method]
            out[mine][f"vs_{method}"] = {
                "regret": paired_test([r["regret"] for r in a], [r["regret"] for r in b]),
                "compute_to_eps": paired_test(
                    [math.inf if r["compute_to_eps"] is None else r["compute_to_eps"] for r in a],
                    [math.inf if r["compute_to_eps"] is None else r["compute_to_eps"] for r in b]),
            }
    return out


def compare(table: dict[str, Any], study_budgets: list[float], seeds: list[int], eps: float, fixed: float,
            methods: tuple[str, ...] = METHODS, shuffled: bool = True, options: dict[str, Any] | None = None,
            collapse: float | None = None, log: Callable[[str], None] = print, jobs: int = 1) -> dict[str, Any]:
    """Every method x study budget x searcher seed on the table (and on its shuffled-proxy control), in
    ``jobs`` processes (the same results for any number: each study is its own seeded computation)."""
    curves = Curves(table)
    out: dict[str, Any] = {
        "table": table["name"], "target": curves.target, "sizes": {s: curves.params[s] for s in curves.sizes},
        "budget": curves.budget, "points": curves.points, "fixed": fixed, "eps": eps, "seeds": len(seeds),
        "collapse": collapse, "eval_variance": curves.eval_variance,
        "true_values": curves.true, "best": curves.best, "best_configs": [k for k, v in curves.true.items()
                                                                          if curves.best - v <= eps],
        "studies": {},
    }
    if jobs < 1:
        raise ConfigError(f"jobs={jobs}: the studies need at least one process")
    variants = [("table", None)] + ([("shuffled", True)] if shuffled else [])
    tasks = [(shuffle, method, study_budget, seed) for _, shuffle in variants for study_budget in study_budgets
             for seed in seeds for method in methods]
    settings = (table, fixed, eps, options, collapse)
    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                                 initargs=settings) as pool:
            done = dict(zip(tasks, pool.map(_replay_task, tasks)))
    else:
        _init_worker(*settings)
        done = {task: _replay_task(task) for task in tasks}
    for variant, shuffle in variants:
        for study_budget in study_budgets:
            results = {method: [done[(shuffle, method, study_budget, seed)] for seed in seeds] for method in methods}
            name = f"{variant}@{study_budget:g}x"
            out["studies"][name] = {"study_budget": study_budget, "variant": variant,
                                    "summary": summarize(results), "runs": results}
            for method, row in out["studies"][name]["summary"].items():
                log(f"[hpo-replay] {name} {method}: median regret {row['regret_median']:.4f} "
                    f"[{row['regret_ci95'][0]:.4f}, {row['regret_ci95'][1]:.4f}], within eps {row['reached_eps']}, "
                    f"median compute to eps {row['compute_to_eps_median']}")
    return out


def measured_fixed(table: dict[str, Any]) -> float:
    """The per-trial fixed cost measured in the table, in full target trials: the median time a target
    curve took to its first evaluation (start-up, model load, base evaluation) over the median time
    of a whole target curve."""
    target = table["spec"]["sizes"][-1]
    cells = [c for c in table["cells"] if c["size"] == target and c["curve"][0].get("wall_s") is not None]
    if not cells:
        raise ValueError(f"the table's {target} curves carry no wall times: give the fixed cost")
    first = statistics.median(c["curve"][0]["wall_s"] for c in cells)
    whole = statistics.median(c["curve"][-1]["wall_s"] for c in cells)
    return first / whole


def wall_ratios(table: dict[str, Any]) -> dict[str, float | None]:
    """Median wall seconds of a whole curve per size over the target's (nominal cost: parameters)."""
    walls: dict[str, list[float]] = {}
    for cell in table["cells"]:
        if cell.get("run_wall_s"):
            walls.setdefault(cell["size"], []).append(cell["run_wall_s"])
    target = table["spec"]["sizes"][-1]
    if target not in walls:
        return {}
    top = statistics.median(walls[target])
    return {size: statistics.median(w) / top for size, w in walls.items()}


def plot(study: dict[str, Any], path, title: str) -> None:
    """Median regret of each method's recommendation over spent compute (and the quartiles)."""
    from isosweep.report.plots import pyplot  # reason: matplotlib, only when plotting

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    budget = study["study_budget"]
    grid = np.linspace(0, budget * 1.1, 200)
    for method, runs in study["runs"].items():
        curves = []
        for run in runs:
            line = np.full(grid.shape, np.nan)
            for spent, regret in run["trajectory"]:
                if regret is not None:
                    line[grid >= spent] = regret
            curves.append(line)
        stack = np.array(curves)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            med = np.nanmedian(stack, axis=0)
            lo, hi = np.nanpercentile(stack, 25, axis=0), np.nanpercentile(stack, 75, axis=0)
        line, = ax.step(grid, med, where="post", label=method)
        ax.fill_between(grid, lo, hi, step="post", alpha=0.12, color=line.get_color())
    ax.set_xlabel("spent compute (full target trials, fixed cost included)")
    ax.set_ylabel("regret of the recommendation (true mean@k)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_text(result: dict[str, Any]) -> str:
    """``dashboards/hpo-bench/table.md``: the comparison's tables, one per study."""
    lines = [f"# Searchers replayed on {result['table']}", "",
             f"Target {result['target']}, C = {result['budget']:,} rollouts, evaluations at {result['points']}; "
             f"sizes {', '.join(f'{s} ({p:,})' for s, p in result['sizes'].items())}. A study budget of Nx is N full "
             f"target trials; every trial also pays a fixed {result['fixed']:.3f} of one (measured: the time to a "
             f"target curve's first evaluation over a whole curve). {result['seeds']} searcher seeds per method, "
             f"the same seeds for every method. Regret: the best true value ({result['best']:.4f}, "
             f"{', '.join(result['best_configs'])} within eps) minus the true value of the final recommendation. "
             f"Compute to eps: full target trials spent when the recommendation first came within "
             f"eps = {result['eps']} of the best (inf: never). "
             + ("A trial stops where its evaluation falls more than "
                f"{result['collapse']} below its size's base model (collapse stops). "
                if result.get("collapse") is not None else "")
             + "Trials, promotions, stops and trials per size are means over seeds.", ""]
    check = result.get("signal")
    if check and check.get("complete"):
        missing = unmet(check)
        lines += ["## Does this table have the signal a comparison needs?", "",
                  "| precondition | met |", "| --- | --- |"]
        lines += [f"| {name} | {'not yet' if met is None else 'yes' if met else 'no'} |"
                  for name, met in check["checks"].items()]
        lines += [""]
        if check["rho"]:
            lines += ["Spearman rho of each proxy's ranking of the configurations with the target's: "
                      + ", ".join(f"{s} {r:.2f}" for s, r in check["rho"].items())
                      + f" (the check asks >= {RHO_MIN:g}). Each proxy's best configuration: "
                      + ", ".join(f"{s} {b}" for s, b in check["proxy_best"].items())
                      + f"; the target's: {check['best']}.", ""]
        if missing:
            whom = "searchers that use proxies" if all(n.startswith("rho(") for n in missing) else "searchers"
            lines += [f"**Not a fair test of {whom}: {', '.join(missing)} "
                      f"{'is' if len(missing) == 1 else 'are'} not met.** What follows measures how "
                      "each method does on this table as it is, not which method is better where the "
                      "preconditions hold.", ""]
    if result.get("wall_ratios"):
        lines += ["Wall time of a whole curve relative to the target's (nominal cost: parameters): "
                  + ", ".join(f"{s} {r:.2f} (nominal {result['sizes'][s] / result['sizes'][result['target']]:.3f})"
                              for s, r in result["wall_ratios"].items()), ""]
    for name, study in result["studies"].items():
        lines += [f"## {name}", "", "| method | median regret [95% CI] | mean regret | zero regret | within eps | "
                  "median compute to eps [95% CI] | trials | promotions | collapse stops | trials per size |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for method, row in study["summary"].items():
            lo, hi = row["compute_to_eps_ci95"]
            fmt = lambda v: "inf" if v is None else f"{v:.2f}"  # noqa: E731
            lines.append(f"| {method} | {row['regret_median']:.4f} [{row['regret_ci95'][0]:.4f}, "
                         f"{row['regret_ci95'][1]:.4f}] | {row['regret_mean']:.4f} | {row['zero_regret']} | "
                         f"{row['reached_eps']} | {fmt(row['compute_to_eps_median'])} [{fmt(lo)}, {fmt(hi)}] | "
                         f"{row['trials_mean']:.1f} | {row['promotions_mean']:.1f} | {row['stops_mean']:.2f} | "
                         + ", ".join(f"{v:.1f}" for v in row["by_size_mean"].values()) + " |")
        trusted = [f"{method} on {row['proxies_trusted']}" for method, row in study["summary"].items()
                   if "proxies_trusted" in row]
        if trusted:
            lines += ["", "Proxies trusted after the proxy check (searcher seeds): " + ", ".join(trusted) + "."]
        lines += ["", "| JF-HPO vs | regret: median difference, wins/losses/ties, Wilcoxon p | "
                  "compute to eps: median difference, wins/losses/ties, p |", "| --- | --- | --- |"]
        for mine, row in study["summary"].items():
            for key, test in row.items():
                if not key.startswith("vs_"):
                    continue
                r, c = test["regret"], test["compute_to_eps"]
                fmt = lambda v: "n/a" if v is None else f"{v:+.3f}"  # noqa: E731
                lines.append(f"| {mine} vs {key[3:]} | {fmt(r['median_diff'])}, {r['wins']}/{r['losses']}/{r['ties']}, "
                             f"p = {r['p']:.3g} | {fmt(c['median_diff'])}, {c['wins']}/{c['losses']}/{c['ties']}, "
                             f"p = {c['p']:.3g} |")
        lines.append("")
    return "\n".join(lines)


def unmet(check: dict[str, Any]) -> list[str]:
    """The preconditions a table's signal check (:func:`isosweep.experiments.hpo_table.signal`) does not
    meet, or does not meet yet: a searcher comparison on such a table cannot say which method is better."""
    if not check.get("complete"):
        return [check.get("why", "the table is not complete")]
    return [name for name, met in check["checks"].items() if not met]


DEFAULT_TABLE = "hpo-table-mup"
"""The table ``make hpo-bench`` replays by default: its figures keep the key ``table`` of ``bench/hpo.json`` and the
files ``table*`` under ``dashboards/hpo-bench/`` (what the live studies are scored against)."""


def output_name(table_name: str) -> str:
    """The key in ``bench/hpo.json`` and the file prefix under ``dashboards/hpo-bench/`` of a replay of a table:
    ``table`` for the default table, ``table-<name less 'hpo-table-'>`` for any other, so replays of two tables
    never overwrite each other."""
    return "table" if table_name == DEFAULT_TABLE else "table-" + table_name.removeprefix("hpo-table-")


def run(table_path, out_json, dashboards, seeds: int = 20, study_budgets: tuple[float, ...] = (4.0, 8.0),
        eps: float = 0.01, fixed: float | None = None, methods: tuple[str, ...] = METHODS,
        collapse: float | None = 0.05, force: bool = False, log: Callable[[str], None] = print,
        jobs: int = 1) -> dict[str, Any]:
    """Replay every method on the table; write the summary into ``out_json`` (key :func:`output_name`, ``table``
    for the default table) and the runs, tables and plots into ``dashboards`` (files named after the same key).

    A table that does not meet its signal check's preconditions is refused (a ConfigError that names
    them) unless ``force``: then the comparison runs and its report says that it is not a fair test.
    """
    table = json.loads(Path(table_path).read_text())
    check = signal(table)
    missing = unmet(check)
    if missing and not force:
        raise ConfigError(
            f"{table_path}: the table does not meet {'; '.join(missing)} (its signal check: isosweep hpo-table), so "
            "a comparison of searchers on it would not say which is better. Build a table that meets them, or "
            "replay this one anyway with --force (FORCE=1 for make hpo-bench): its report then says it is not a "
            "fair test")
    if missing:
        log(f"[hpo-replay] --force: replaying a table that does not meet {'; '.join(missing)}")
    fixed = measured_fixed(table) if fixed is None else fixed
    result = compare(table, list(study_budgets), list(range(seeds)), eps, fixed, methods=methods,
                     collapse=collapse, log=log, jobs=jobs)
    result["wall_ratios"] = wall_ratios(table)
    result["signal"] = check
    key = output_name(table["name"])
    dashboards = Path(dashboards)
    dashboards.mkdir(parents=True, exist_ok=True)
    (dashboards / f"{key}_runs.json").write_text(json.dumps(
        {name: study["runs"] for name, study in result["studies"].items()}) + "\n")
    (dashboards / f"{key}.md").write_text(report_text(result))
    for name, study in result["studies"].items():
        plot(study, dashboards / f"{key}_{name.replace('@', '_')}.png",
             f"{name}: median regret (quartiles shaded), {seeds} seeds")
    summary = {**result, "studies": {name: {k: v for k, v in study.items() if k != "runs"}
                                     for name, study in result["studies"].items()}}
    out_json = Path(out_json)
    merged = json.loads(out_json.read_text()) if out_json.exists() else {}
    merged[key] = summary
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    log(f"[hpo-replay] figures -> {out_json} (key '{key}'); tables and plots -> {dashboards}/{key}*")
    return result
