"""The baselines JF-HPO is compared with, replayed on a table: random search, ASHA and Hyperband.

Each runs at the target size only, draws from its own random stream (derived from the searcher seed), and
records its recommendation after every trial (:meth:`~isosweep.experiments.replay.simulator.Study.record`):

- ``random``: a configuration drawn uniformly from the grid (with replacement), at the target size and budget
  C; recommends the configuration with the best mean of its observed values.
- ``asha``: asynchronous successive halving, rungs at the table's evaluation budgets, reduction factor
  :data:`ETA`, run one trial at a time (promote the best not-yet-promoted configuration of the highest rung
  that has one in its top half, else start a new random one at the lowest rung); recommends the best
  configuration of the highest rung reached.
- ``hyperband``: Hyperband's brackets over the same rungs (factor :data:`ETA`), in turn; each bracket is a
  successive halving from its own lowest rung; recommends like ``asha``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

import numpy as np

from isosweep.experiments.replay.simulator import Curves, Run, Study

ETA = 2
"""The reduction factor of ASHA's and Hyperband's rungs."""

Rung = list[tuple[float, Run]]
"""The runs that reached one rung, each with its value there."""


def run_random(curves: Curves, study: Study, seed: int) -> None:
    rng = np.random.default_rng([seed, 1])
    observed: dict[str, list[float]] = {}
    target, budget = curves.target, curves.budget
    while study.affords(target, budget):
        key = curves.keys[int(rng.integers(len(curves.keys)))]
        _, points = study.run(target, key, budget, seed=int(rng.choice(curves.seeds)))
        observed.setdefault(key, []).append(points[-1][1])
        study.record(max(observed, key=lambda k: statistics.fmean(observed[k])))


def best_of_highest_rung(rungs: list[Rung]) -> str | None:
    for rung in reversed(rungs):
        if rung:
            return max(rung, key=lambda entry: entry[0])[1].key
    return None


def start_random(curves: Curves, study: Study, rng: np.random.Generator, upto: int,
                 rungs: list[Rung]) -> tuple[Run, tuple[float, Run]]:
    """A new trial of a random configuration and training seed at the target to ``upto``, entered in its rung."""
    key = curves.keys[int(rng.integers(len(curves.keys)))]
    run, new = study.run(curves.target, key, upto, seed=int(rng.choice(curves.seeds)))
    rungs[curves.points.index(run.done)].append((new[-1][1], run))
    return run, rungs[curves.points.index(run.done)][-1]


def run_asha(curves: Curves, study: Study, seed: int) -> None:
    rng = np.random.default_rng([seed, 2])
    target, points = curves.target, curves.points
    rungs: list[Rung] = [[] for _ in points]
    promoted: list[set[Run]] = [set() for _ in points]  # per rung: the runs promoted out of it
    while True:
        job = None
        for k in reversed(range(len(points) - 1)):
            ranked = sorted(rungs[k], key=lambda entry: entry[0], reverse=True)
            top = [entry for entry in ranked[:len(ranked) // ETA]
                   if entry[1] not in promoted[k] and not entry[1].stopped]
            if top and study.affords(target, points[k + 1], top[0][1]):
                job = (k + 1, top[0][1])
                break
        if job is not None:
            k, run = job
            promoted[k - 1].add(run)
            _, new = study.run(target, run.key, points[k], run=run)
            rungs[points.index(run.done)].append((new[-1][1], run))
        elif study.affords(target, points[0]):
            start_random(curves, study, rng, points[0], rungs)
        else:
            break
        study.record(best_of_highest_rung(rungs))


def run_hyperband(curves: Curves, study: Study, seed: int) -> None:
    rng = np.random.default_rng([seed, 3])
    target, points = curves.target, curves.points
    s_max = len(points) - 1
    rungs: list[Rung] = [[] for _ in points]
    bracket = s_max
    while study.affords(target, points[s_max - bracket]):
        n = math.ceil((s_max + 1) / (bracket + 1) * ETA ** bracket)
        level = s_max - bracket
        alive: list[tuple[float, Run]] = []
        for _ in range(n):
            if not study.affords(target, points[level]):
                break
            run, entry = start_random(curves, study, rng, points[level], rungs)
            if not run.stopped:
                alive.append(entry)
            study.record(best_of_highest_rung(rungs))
        while level < s_max and alive:
            keep = max(1, len(alive) // ETA)
            alive = sorted(alive, key=lambda entry: entry[0], reverse=True)[:keep]
            level += 1
            nxt = []
            for _, run in alive:
                if not study.affords(target, points[level], run):
                    break
                _, new = study.run(target, run.key, points[level], run=run)
                rungs[level].append((new[-1][1], run))
                if not run.stopped:
                    nxt.append(rungs[level][-1])
                study.record(best_of_highest_rung(rungs))
            alive = nxt
        bracket = s_max if bracket == 0 else bracket - 1


RUNNERS: dict[str, Callable[[Curves, Study, int], None]] = {
    "random": run_random, "asha": run_asha, "hyperband": run_hyperband}
"""The baselines by method name."""
