"""Easy and hard problem sets, defined by the base model's measured pass rate.

As in the IsoCompute study, difficulty is a property of a problem *for a given base model*: each
problem of a pool is sampled ``samples`` times from the base model and its pass rate measured.
The easy set holds the problems whose rate lies in the easy band, the hard set those in the hard
band (``isosweep.spec.trial.DIFFICULTY_BANDS``). Train and eval pools are probed separately, so the
eval set has the same difficulty as the train set without sharing a problem with it.

A probe is a JSON file ``{split: {level: [{"prompt", "answer", "numbers", "rate"}, ...]}}``; the
tiny base models carry theirs (measured right after warm-up).
"""

from __future__ import annotations

from collections.abc import Iterable

from isosweep.rollout.base import RolloutEngine
from isosweep.tasks import Problem, Task

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
                 "rate": sum(rewards[i * samples:(i + 1) * samples]) / samples}
                for i, p in enumerate(problems)
            ]
    return probe


def select(probe: Probe, task: str, split: str, levels: Iterable[int], band: tuple[float, float]) -> list[Problem]:
    """The problems of ``split`` and ``levels`` whose pass rate lies in ``band = [low, high)``
    (``high`` inclusive when it is 1.0), in probe order."""
    low, high = band
    chosen = []
    for level in levels:
        for row in probe[split].get(str(level), []):
            rate = row["rate"]
            if low <= rate < high or (high >= 1.0 and rate == 1.0):
                chosen.append(Problem(row["prompt"], row["answer"], task, level, tuple(row["numbers"])))
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
