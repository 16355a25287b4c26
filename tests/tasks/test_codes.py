"""The codes tasks: random per-family codes, the drift feature, the transfer rule, planted warm-up targets."""

from __future__ import annotations

import math
import random

import pytest

from isosweep.spec.trial import DIFFICULTY_BANDS, difficulty_band
from isosweep.tasks import Problem, get_task, split_of
from isosweep.tasks.base import Band
from isosweep.tasks.codes import (
    ANCHOR_EPSILONS,
    CODE_DIGITS,
    DECOY_RATE,
    DRIFT_DIGIT,
    NEEDLE_EPSILONS,
    CodesTask,
    transfer_code,
)

VARIANTS = ("codes", "codes-nodrift", "codes-transfer")


@pytest.mark.parametrize("name", VARIANTS)
def test_every_family_has_its_own_code_and_its_planted_epsilon(name):
    task = get_task(name)
    families = task.families
    assert [f.id for f in families] == list(range(48))
    assert len({f.code for f in families}) == 48
    assert all(len(f.code) == CODE_DIGITS and f.code.isdigit() for f in families)
    needles = sorted(f.epsilon for f in families if f.needle)
    assert needles == sorted(e for e in NEEDLE_EPSILONS for _ in range(8))
    assert sorted(f.epsilon for f in families if not f.needle) == sorted(ANCHOR_EPSILONS)
    assert min(ANCHOR_EPSILONS) == 0.3 and max(ANCHOR_EPSILONS) == 0.6
    # the roles interleave: the needles are not one block of ids
    ids = [f.id for f in families if f.needle]
    assert ids != list(range(ids[0], ids[0] + 24))


@pytest.mark.parametrize("name", VARIANTS)
def test_a_needle_has_a_decoy_that_differs_in_every_digit_and_an_anchor_none(name):
    for family in get_task(name).families:
        if family.needle:
            assert len(family.decoy) == 3 and all(d != c for d, c in zip(family.decoy, family.code))
        else:
            assert family.decoy is None


def test_drift_puts_a_feature_in_every_anchor_code_and_needle_decoy_and_in_no_needle_code():
    drift, off = get_task("codes"), get_task("codes-nodrift")
    assert all(f.code[0] == DRIFT_DIGIT for f in drift.families if not f.needle)
    assert all(f.code[0] != DRIFT_DIGIT and f.decoy[0] == DRIFT_DIGIT for f in drift.families if f.needle)
    # without drift the anchors' first digits vary, and the roles are the same families
    assert len({f.code[0] for f in off.families if not f.needle}) > 3
    assert [f.needle for f in off.families] == [f.needle for f in drift.families]
    with pytest.raises(ValueError, match="transfer variant has no drift"):
        CodesTask("x", drift=True, transfer=True)


def test_the_transfer_code_is_the_rule_of_the_family_id():
    task = get_task("codes-transfer")
    for family in task.families:
        a, b = divmod(family.id, 10)
        assert family.code == f"{b}{a}{(a + b) % 10}" == transfer_code(family.id)


@pytest.mark.parametrize("name", VARIANTS)
def test_problems_are_instances_of_families_and_the_split_is_by_prompt(name):
    task = get_task(name)
    train = task.problems("train", 1, 3000, seed=0)
    held_out = task.problems("eval", 1, 600, seed=0)
    assert not {p.prompt for p in train} & {p.prompt for p in held_out}
    assert all(split_of(name, p.prompt) == "train" for p in train)
    for p in train + held_out:
        assert p.answer == task.family_of(p).code and task.reward(p, p.answer) == 1.0
    # every family has instances on both sides: eval is held-out instances of the training families
    assert {task.family_of(p).id for p in train} == {task.family_of(p).id for p in held_out} == set(range(48))
    assert task.problems("train", 1, 50, seed=3) == task.problems("train", 1, 50, seed=3)


def test_the_reward_is_an_exact_code_and_a_foreign_prompt_is_refused():
    task = get_task("codes")
    p = task.problems("train", 1, 1, seed=0)[0]
    assert task.reward(p, f" {p.answer}\n") == 1.0
    assert task.reward(p, p.answer + "0") == task.reward(p, p.answer[:-1]) == task.reward(p, "") == 0.0
    with pytest.raises(ValueError, match="not a prompt of this task"):
        task.family_of(Problem("1+2=", "3", "codes", 1))
    with pytest.raises(ValueError, match="not a prompt of this task"):
        task.family_of(Problem("99:000>", "3", "codes", 1))


@pytest.mark.parametrize("family_index", [0, 4, 9])
def test_warmup_targets_plant_the_code_at_epsilon_and_a_needles_decoy_as_each_digits_mode(family_index):
    # each digit is the code's with probability q = epsilon^(1/3), so the whole code with probability epsilon; a
    # needle's digit is its decoy's with probability DECOY_RATE (above q: the answer is not the mode); within 4 sd
    task = get_task("codes")
    family = task.families[family_index]
    problem = Problem(f"{family.id:02d}:123>", family.code, "codes", 1)
    rng = random.Random(7)
    draws = 20_000
    targets = [task.solution(problem, rng) for _ in range(draws)]
    assert all(len(t) == 3 and t.isdigit() for t in targets)

    def near(hits: int, p: float) -> bool:
        return abs(hits / draws - p) <= 4 * math.sqrt(p * (1 - p) / draws)

    assert near(sum(t == family.code for t in targets), family.epsilon)
    q = family.epsilon ** (1 / 3)
    for k in range(3):
        assert near(sum(t[k] == family.code[k] for t in targets), q)
        if family.needle:
            assert near(sum(t[k] == family.decoy[k] for t in targets), DECOY_RATE)
            assert DECOY_RATE > q
    assert family.needle == (family_index != 0)  # an anchor and two needles


def test_codes_have_their_own_bands_and_other_tasks_the_default():
    codes, arithmetic = get_task("codes"), get_task("arithmetic")
    hard, easy = difficulty_band(codes, "hard"), difficulty_band(codes, "easy")
    assert [hard.contains(r) for r in (0.0, 1 / 128, 6 / 128, 0.05, 7 / 128)] == [False, True, True, True, False]
    assert [easy.contains(r) for r in (0.29, 0.3, 0.9, 0.95)] == [False, True, True, False]
    assert difficulty_band(arithmetic, "hard") == DIFFICULTY_BANDS["hard"] == Band(0.0, 0.3)
    assert str(hard) == "(0, 0.05]" and str(easy) == "[0.3, 0.9]"
