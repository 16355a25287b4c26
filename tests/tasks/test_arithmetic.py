"""Addition problems: operand sizes, exact-match reward, and the exhaustive level-1 split."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isosweep.tasks import Problem, split_of
from isosweep.tasks.arithmetic import ArithmeticTask, operand_range, reward

TASK = ArithmeticTask()
PROMPT = re.compile(r"^(\d+)\+(\d+)=$")


def _problem(a: int, b: int) -> Problem:
    return Problem(prompt=f"{a}+{b}=", answer=str(a + b), task="arithmetic", level=1)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [("46", 1.0), (" 46 ", 1.0), ("46\n", 1.0), ("47", 0.0), ("046", 0.0), ("4 6", 0.0),
     ("", 0.0), ("46=", 0.0), ("+46", 0.0), ("12+34=46", 0.0)],
)
def test_reward_is_exact_match_after_strip(completion, expected):
    p = Problem(prompt="12+34=", answer="46", task="arithmetic", level=2)
    assert reward(p, completion) == expected
    assert TASK.reward(p, completion) == expected


@given(a=st.integers(0, 99_999), b=st.integers(0, 99_999))
def test_reward_accepts_the_sum_only(a, b):
    p = _problem(a, b)
    assert reward(p, str(a + b)) == 1.0
    assert reward(p, str(a + b + 1)) == 0.0
    assert reward(p, "0" + str(a + b)) == 0.0


@pytest.mark.parametrize("level", TASK.levels)
def test_operands_have_exactly_level_digits(level):
    lo, hi = operand_range(level)
    for p in TASK.problems("train", level, 50, seed=3):
        a, b = map(int, PROMPT.match(p.prompt).groups())
        assert lo <= a <= hi and lo <= b <= hi
        assert p.answer == str(a + b)
        if level > 1:
            assert len(str(a)) == len(str(b)) == level


def test_level_one_is_every_pair_of_digits_split_exactly():
    universe = {f"{a}+{b}=" for a in range(10) for b in range(10)}
    train = {k for k in universe if split_of("arithmetic", k) == "train"}
    held_out = universe - train
    assert {p.prompt for p in TASK.problems("train", 1, len(train), seed=0)} == train
    assert {p.prompt for p in TASK.problems("eval", 1, len(held_out), seed=0)} == held_out
    with pytest.raises(ValueError, match="fewer than"):
        TASK.problems("eval", 1, len(held_out) + 1, seed=0)


def test_solution_is_the_answer():
    for p in TASK.problems("eval", 3, 20, seed=1):
        assert TASK.solution(p, random.Random(0)) == p.answer
