"""Easy and hard problem sets, defined by the base model's measured pass rate.

As in the IsoCompute study, difficulty is a property of a problem *for a given base model*: each
problem of a pool is sampled ``samples`` times from the base model and its pass rate measured.
The easy set holds the problems whose rate lies in the easy band, the hard set those in the hard
band (``isosweep.spec.trial.difficulty_band``: a task may have bands of its own). Train and eval pools are probed separately, so the
eval set has the same difficulty as the train set without sharing a problem with it.

A probe is a JSON file ``{split: {level: [{"prompt", "answer", "numbers", "rate", "samples"}, ...]}}``
(``samples``, what each rate is out of, is absent from probes written before it was recorded); the tiny
base models carry theirs (measured right after warm-up).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from isosweep.rollout.base import RolloutEngine
from isosweep.tasks import Problem, Task
from isosweep.tasks.base import Band

Probe = dict[str, dict[str, list[dict]]]


def probe_pass_rates(engine: RolloutEngine, task: Task, levels: Iterable[int], pool: int,
                     samples: int, seed: int) -> Probe:
    """Measure every problem's pass rate over ``samples`` samples, for pools of up to ``pool``
    problems per (split, level)."""
    probe: Probe = {}
    for split in ("train", "eval"):
        probe[split] = {}
        for level in levels:
            problems = _pool(task, split, level, pool, seed)
            rollouts = engine.generate([p.prompt for p in problems], samples, seed=seed + level)
            rewards = [task.reward(problems[i // samples], text) for i, text in enumerate(rollouts.texts)]
            probe[split][str(level)] = [
                {"prompt": p.prompt, "answer": p.answer, "numbers": list(p.numbers),
                 "rate": sum(rewards[i * samples:(i + 1) * samples]) / samples, "samples": samples}
                for i, p in enumerate(problems)
            ]
    return probe


def select(probe: Probe, task: str, split: str, levels: Iterable[int], band: Band) -> list[Problem]:
    """The problems of ``split`` and ``levels`` whose pass rate lies in ``band``, in probe order."""
    return [problem for problem, _ in rated(probe, task, split, levels, band)]


def rated(probe: Probe, task: str, split: str, levels: Iterable[int], band: Band,
          samples: int | None = None) -> list[tuple[Problem, tuple[int, int]]]:
    """`select`'s problems, each with its probe as ``(successes, samples)``: the row's ``samples``, else
    ``samples`` (what the probe took, for a probe written before rows recorded it; None: 0 where unknown)."""
    chosen = []
    for level in levels:
        for row in probe[split].get(str(level), []):
            if band.contains(row["rate"]):
                taken = row.get("samples", samples or 0)
                chosen.append((Problem(row["prompt"], row["answer"], task, level, tuple(row["numbers"])),
                               (round(row["rate"] * taken), taken)))
    return chosen


def level_pass_rates(probe: Probe, split: str = "eval") -> dict[str, float]:
    """Mean base pass rate (pass@1) of each probed level of ``split``."""
    return {level: round(sum(r["rate"] for r in rows) / len(rows), 4) for level, rows in probe[split].items() if rows}


def _pool(task: Task, split: str, level: int, want: int, seed: int) -> list[Problem]:
    """Up to ``want`` distinct problems of one split and level (small levels hold fewer)."""
    while True:
        try:
            return task.problems(split, level, want, seed)
        except ValueError:
            if want <= 8:
                raise
            want //= 2


def rate_prior(rates: Sequence[float], samples: int) -> tuple[float, float]:
    """An empirical-Bayes ``Beta(a, b)`` prior of the true pass rates behind probed ``rates`` (each out of
    ``samples``), by the method of moments with the binomial noise of the probe taken out:
    ``Var(rate) = mu (1 - mu) (1 + (samples - 1) rho) / samples`` with ``rho = 1 / (a + b + 1)``.

    >>> a, b = rate_prior([0.0, 0.125, 0.25, 0.5, 0.125, 0.0], samples=8)
    >>> round(a / (a + b), 4)
    0.1667
    """
    if not rates or samples < 1:
        raise ValueError(f"rate_prior needs rates and samples >= 1, got {len(rates)} rates and samples {samples}")
    mu = min(max(statistics.fmean(rates), 1e-4), 1 - 1e-4)
    spread = statistics.pvariance(rates) if len(rates) > 1 else 0.0
    rho = (samples * spread / (mu * (1 - mu)) - 1) / (samples - 1) if samples > 1 else 0.5
    total = 1 / min(max(rho, 1e-4), 0.999) - 1
    return mu * total, (1 - mu) * total


def zero_signal(counts: Sequence[tuple[int, int]], n: int, prior: tuple[float, float]) -> tuple[float, float]:
    """The expected fraction of groups of ``n`` samples whose rewards are all equal (no GRPO signal), over
    problems probed at ``counts`` = ``(successes, samples)`` each, and its standard deviation over one batch of
    those problems.

    A problem of pass rate p gives such a group with probability ``q = (1 - p)^n + p^n``. p is not known, only
    its probe, and the problems were *selected* on that probe, so q is taken under each problem's posterior
    ``Beta(a + k, b + m - k)`` from the pool's ``prior`` (`rate_prior`): a selection on k changes which
    problems enter, not what k says about p. The fraction over the batch has variance
    ``sum q (1 - q) / len^2`` (groups are independent given their rates).
    """
    if not counts:
        raise ValueError("zero_signal needs at least one problem")
    a, b = prior
    qs = []
    for k, m in counts:
        a_k, b_k = a + k, b + m - k
        norm = math.lgamma(a_k + b_k) - math.lgamma(a_k + b_k + n)
        none = math.exp(norm + math.lgamma(b_k + n) - math.lgamma(b_k))
        every = math.exp(norm + math.lgamma(a_k + n) - math.lgamma(a_k))
        qs.append(none + every)
    return statistics.fmean(qs), math.sqrt(sum(q * (1 - q) for q in qs)) / len(qs)
