"""Addition of two L-digit numbers: prompt ``"a+b="``, completion the decimal sum.

Level L means both operands have exactly L digits; level 1 means 0-9 (so it includes 0).
The completion is graded by exact string match, so ``"046"`` does not count as 46: the model has
to learn the canonical form, not just the value.
"""

from __future__ import annotations

import random

from isosweep.tasks.base import Problem, Split, draw_problems

NAME = "arithmetic"


def reward(problem: Problem, completion: str) -> float:
    """1.0 iff the completion, stripped of surrounding whitespace, is exactly the sum.

    >>> p = Problem(prompt="12+34=", answer="46", task="arithmetic", level=2)
    >>> reward(p, "46"), reward(p, " 46 "), reward(p, "47"), reward(p, "046")
    (1.0, 1.0, 0.0, 0.0)
    """
    return 1.0 if completion.strip() == problem.answer else 0.0


def operand_range(level: int) -> tuple[int, int]:
    """Inclusive bounds of an operand with exactly ``level`` digits (level 1 includes 0).

    >>> operand_range(1), operand_range(3)
    ((0, 9), (100, 999))
    """
    return (0 if level == 1 else 10 ** (level - 1), 10**level - 1)


class ArithmeticTask:
    """Addition problems at levels 1..5 (operand digits)."""

    name: str = NAME
    levels: tuple[int, ...] = (1, 2, 3, 4, 5)

    def problems(self, split: Split, level: int, count: int, seed: int) -> list[Problem]:
        def draw(rng: random.Random) -> Problem:
            lo, hi = operand_range(level)
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            return Problem(prompt=f"{a}+{b}=", answer=str(a + b), task=NAME, level=level)

        return draw_problems(self, split, level, count, seed, draw)

    def reward(self, problem: Problem, completion: str) -> float:
        return reward(problem, completion)

    def solution(self, problem: Problem, rng: random.Random) -> str:
        # A sum has one canonical spelling, so there is nothing to randomise.
        return problem.answer
