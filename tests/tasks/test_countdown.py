"""Countdown: problem shape, the safe reward, and render/parse agreeing on value."""

from __future__ import annotations

import random
import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isosweep.tasks import Problem, split_of
from isosweep.tasks.countdown import (
    NUMBER_RANGE,
    TARGET_RANGE,
    CountdownTask,
    Expr,
    evaluate,
    leaves,
    parse,
    render,
    reward,
    target_of,
)

TASK = CountdownTask()
PROMPT = re.compile(r"^(\d+(?:,\d+)*)>(\d+):$")
P = Problem(prompt="3,5,7>22:", answer="3*5+7", task="countdown", level=3, numbers=(3, 5, 7))


@pytest.mark.parametrize(
    "completion",
    ["3*5+7", " 7+3*5 ", "5*3+7", "(3*5)+7", "((3)*(5))+(7)", "3 * 5 + 7", "7+(5*3)"],
)
def test_reward_accepts_correct_expressions(completion):
    assert reward(P, completion) == 1.0
    assert TASK.reward(P, completion) == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "3*5+7+7",  # reuses a number
        "3*5+7-7+7",  # reuses numbers, same value
        "15+7",  # numbers not given
        "3*5",  # misses a number
        "3*5+7+0",  # extra number
        "(3+5)*7",  # wrong value
        "-3+5*7-10",  # unary minus and extra number
        "7-(-3*5)",  # unary minus
        "3*5+14/2",  # division
        "3*5+7//1",  # floor division
        "2**99999",  # power: must be rejected without evaluating
        "3*5+7=22",  # keeps the equation
        "3×5+7",  # unknown character
        "3*5+x",  # a name
        "3*5+7.0",  # float
        "3*5+0_7",  # underscore digits
        "",
        "   ",
        "3*5+",
        "(3*5+7",
        "3\x00*5+7",
        "(" * 150 + "3" + ")" * 150 + "*5+7",  # correct but over MAX_COMPLETION_CHARS
        "(" * 250,  # nesting beyond the parser's limit
        "3" * 5000,
    ],
)
def test_reward_rejects_everything_else(completion):
    assert reward(P, completion) == 0.0


def test_reward_on_power_is_instant():
    start = time.perf_counter()
    for completion in ["2**99999", "9**9**9**9", "(3*5+7)**999999", "3" * 300 + "**" + "9" * 300]:
        assert reward(P, completion) == 0.0
    assert time.perf_counter() - start < 0.5


@given(st.text(max_size=60))
def test_reward_never_raises(completion):
    assert reward(P, completion) in (0.0, 1.0)


@given(st.text(alphabet="0123456789+-*() ", max_size=40))
def test_reward_never_raises_on_alphabet_noise(completion):
    assert reward(P, completion) in (0.0, 1.0)


def test_reward_is_zero_for_a_malformed_prompt():
    bad = Problem(prompt="3,5,7=22", answer="3*5+7", task="countdown", level=3, numbers=(3, 5, 7))
    assert reward(bad, "3*5+7") == 0.0
    assert target_of("1,2>x:") is None


@pytest.mark.parametrize("level", TASK.levels)
def test_problems_are_well_formed_and_solved_by_their_answer(level):
    for p in TASK.problems("train", level, 200, seed=5):
        numbers_text, target_text = PROMPT.match(p.prompt).groups()
        assert tuple(map(int, numbers_text.split(","))) == p.numbers
        assert len(p.numbers) == level
        assert all(NUMBER_RANGE[0] <= n <= NUMBER_RANGE[1] for n in p.numbers)
        assert TARGET_RANGE[0] <= int(target_text) <= TARGET_RANGE[1]
        expr = parse(p.answer)
        assert expr is not None and evaluate(expr) == int(target_text)
        assert sorted(leaves(expr)) == sorted(p.numbers)


def test_level_two_split_is_exact():
    universe = {
        f"{a},{b}>{t}:"
        for a in range(1, 13)
        for b in range(1, 13)
        for t in {a + b, a - b, b - a, a * b}
        if t >= 1
    }
    train = {k for k in universe if split_of("countdown", k) == "train"}
    held_out = universe - train
    assert {p.prompt for p in TASK.problems("train", 2, len(train), seed=0)} == train
    assert {p.prompt for p in TASK.problems("eval", 2, len(held_out), seed=0)} == held_out
    with pytest.raises(ValueError, match="fewer than"):
        TASK.problems("eval", 2, len(held_out) + 1, seed=0)


def _trees(numbers: st.SearchStrategy[int]) -> st.SearchStrategy[Expr]:
    return st.recursive(
        numbers,
        lambda sub: st.tuples(st.sampled_from("+-*"), sub, sub),
        max_leaves=6,
    )


@given(_trees(st.integers(0, 99)))
def test_render_keeps_value_and_leaf_order(expr):
    text = render(expr)
    parsed = parse(text)
    assert parsed is not None
    assert evaluate(parsed) == evaluate(expr)
    assert leaves(parsed) == leaves(expr)


@given(expr=_trees(st.integers(1, 12)), seed=st.integers(0, 2**32))
def test_solution_is_a_valid_respelling(expr, seed):
    numbers = tuple(leaves(expr))
    target = evaluate(expr)
    if not TARGET_RANGE[0] <= target <= TARGET_RANGE[1]:
        return
    prompt = f"{','.join(map(str, numbers))}>{target}:"
    p = Problem(prompt, render(expr), task="countdown", level=len(numbers), numbers=numbers)
    assert reward(p, TASK.solution(p, random.Random(seed))) == 1.0


def test_solution_varies_with_rng():
    p = Problem("1,2,3,4>10:", "1+2+3+4", task="countdown", level=4, numbers=(1, 2, 3, 4))
    spellings = {TASK.solution(p, random.Random(seed)) for seed in range(30)}
    assert len(spellings) > 1
    assert all(reward(p, s) == 1.0 for s in spellings)


def test_solution_rejects_an_unparsable_answer():
    bad = Problem(prompt="1,2>3:", answer="1/2", task="countdown", level=2, numbers=(1, 2))
    with pytest.raises(ValueError, match="unparsable"):
        TASK.solution(bad, random.Random(0))
