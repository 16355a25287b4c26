"""The contract every synthetic task keeps, the split, and the task registry."""

from __future__ import annotations

import dataclasses
import doctest
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import isosweep.tasks
from isosweep.tasks import (
    ALPHABET,
    TASKS,
    CodesTask,
    Problem,
    Task,
    arithmetic,
    base,
    codes,
    countdown,
    get_task,
    jsonl,
    split_of,
)

SYNTHETIC = sorted(TASKS)


def _levels(name: str) -> list[tuple[str, int]]:
    return [(name, level) for level in TASKS[name].levels]


TASK_LEVELS = [pair for name in SYNTHETIC for pair in _levels(name)]


@pytest.mark.parametrize("module", [isosweep.tasks, base, arithmetic, codes, countdown, jsonl])
def test_docstring_examples_hold(module):
    result = doctest.testmod(module)
    assert result.failed == 0


# --- split_of ---------------------------------------------------------------------------------


def test_split_of_is_deterministic_and_near_the_fraction():
    keys = [f"{i}+{i % 7}=" for i in range(20_000)]
    first = [split_of("arithmetic", k) for k in keys]
    assert first == [split_of("arithmetic", k) for k in keys]
    assert set(first) == {"train", "eval"}
    # Binomial sd is 0.003 at n=20000, so 0.015 is five sd.
    assert abs(first.count("eval") / len(keys) - 0.2) < 0.015


def test_split_of_depends_on_the_task_name():
    keys = [str(i) for i in range(200)]
    assert [split_of("a", k) for k in keys] != [split_of("b", k) for k in keys]


def test_split_of_extreme_fractions():
    keys = [str(i) for i in range(500)]
    assert {split_of("t", k, eval_fraction=0.0) for k in keys} == {"train"}
    assert {split_of("t", k, eval_fraction=1.0) for k in keys} == {"eval"}


@pytest.mark.parametrize("fraction", [-0.1, 1.5])
def test_split_of_rejects_bad_fraction(fraction):
    with pytest.raises(ValueError, match="eval_fraction"):
        split_of("t", "k", eval_fraction=fraction)


def test_seeded_rng_is_stable():
    assert base.seeded_rng("a", 1).random() == base.seeded_rng("a", 1).random()
    assert base.seeded_rng("a", 1).random() != base.seeded_rng("a", 2).random()


# --- Problem and ALPHABET -----------------------------------------------------------------------


def test_problem_is_frozen_with_empty_numbers_by_default():
    p = Problem(prompt="1+2=", answer="3", task="arithmetic", level=1)
    assert p.numbers == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.answer = "4"  # type: ignore[misc]


def test_alphabet_is_the_tiny_vocabulary():
    assert ALPHABET == "0123456789+-*()=,:> "
    assert len(set(ALPHABET)) == len(ALPHABET)


# --- the contract of every synthetic task -------------------------------------------------------


@pytest.mark.parametrize("name", SYNTHETIC)
def test_tasks_satisfy_the_protocol(name):
    task = TASKS[name]
    assert isinstance(task, Task)
    assert task.name == name
    assert task.levels == tuple(sorted(task.levels))


@pytest.mark.parametrize(("name", "level"), TASK_LEVELS)
def test_problems_are_deterministic_unique_and_labelled(name, level):
    task = TASKS[name]
    for split in ("train", "eval"):
        # Arithmetic level 1 has only about 20 eval problems.
        problems = task.problems(split, level, 15, seed=7)
        assert problems == task.problems(split, level, 15, seed=7)
        assert len(problems) == 15
        assert len({p.prompt for p in problems}) == 15
        assert all(p.task == name and p.level == level for p in problems)


@pytest.mark.parametrize(("name", "level"), TASK_LEVELS)
def test_different_seeds_give_different_problems(name, level):
    task = TASKS[name]
    assert task.problems("train", level, 10, seed=0) != task.problems("train", level, 10, seed=1)


@pytest.mark.parametrize(("name", "level"), TASK_LEVELS)
def test_train_and_eval_never_overlap_across_seeds(name, level):
    task = TASKS[name]
    train = {p.prompt for seed in range(20) for p in task.problems("train", level, 15, seed)}
    held_out = {p.prompt for seed in range(20) for p in task.problems("eval", level, 4, seed)}
    assert train and held_out
    assert not train & held_out


@settings(max_examples=60, deadline=None)
@given(
    pair=st.sampled_from(TASK_LEVELS),
    split=st.sampled_from(["train", "eval"]),
    seed=st.integers(0, 2**32),
)
def test_every_problem_is_in_the_split_asked(pair, split, seed):
    name, level = pair
    for p in TASKS[name].problems(split, level, 10, seed):
        assert split_of(name, p.prompt) == split


@settings(max_examples=60, deadline=None)
@given(pair=st.sampled_from(TASK_LEVELS), seed=st.integers(0, 2**32))
def test_every_solution_earns_full_reward_and_uses_the_alphabet(pair, seed):
    name, level = pair
    task = TASKS[name]
    rng = random.Random(seed)
    for p in task.problems("train", level, 10, seed):
        completion = task.solution(p, rng)
        if not isinstance(task, CodesTask):  # a codes warm-up target plants a pass rate (tests/tasks/test_codes.py)
            assert task.reward(p, completion) == 1.0
        assert task.reward(p, p.answer) == 1.0
        assert set(p.prompt + p.answer + completion) <= set(ALPHABET) - {" "}


@pytest.mark.parametrize("name", SYNTHETIC)
def test_bad_requests_raise_clear_errors(name):
    task = TASKS[name]
    level = task.levels[0]
    with pytest.raises(ValueError, match="unknown level 99"):
        task.problems("train", 99, 1, seed=0)
    with pytest.raises(ValueError, match="split must be one of"):
        task.problems("test", level, 1, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count must be >= 0"):
        task.problems("train", level, -1, seed=0)
    too_many = 10_000 if isinstance(task, CodesTask) else 500  # a codes level holds 48,000 problems, ~9,600 eval
    with pytest.raises(ValueError, match=f"fewer than {too_many} distinct eval problems"):
        task.problems("eval", level, too_many, seed=0)
    assert task.problems("eval", level, 0, seed=0) == []


# --- registry -----------------------------------------------------------------------------------


def test_get_task_returns_registered_tasks():
    for name in SYNTHETIC:
        assert get_task(name) is TASKS[name]


def test_get_task_lists_allowed_names_for_unknown():
    with pytest.raises(ValueError, match="arithmetic, codes, codes-nodrift, codes-transfer, countdown") as error:
        get_task("multiplication")
    assert ".jsonl" in str(error.value)
