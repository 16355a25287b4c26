"""User JSONL datasets: answer extraction, numeric reward, splits, and errors naming the line."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from isosweep.tasks import Problem, get_task, split_of
from isosweep.tasks.jsonl import (
    SPLIT_KEY_NAME,
    JsonlTask,
    extract_answer,
    numeric_reward,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", "42"),
        ("1,234", "1234"),
        ("-3.5", "-3.5"),
        ("42.0", "42"),
        ("1.50", "1.5"),
        ("$1,000", "1000"),
        ("0.0", "0"),
        ("Natalia sold 48/2 = 24 clips in May.\n48+24 = 72 #### 72", "72"),
        ("2 + 3 = 5 ... #### 1,234", "1234"),
        ("#### $-7", "-7"),
        (r"So the answer is $\boxed{42}$.", "42"),
        (r"\boxed{1} first, then \boxed{2}", "2"),
        (r"\boxed{3} apples, 5 pears", "3"),
        (r"\boxed{\frac{1}{4}}", "0.25"),
        (r"\boxed{-\frac{3}{2}}", "-1.5"),
        (r"\boxed{x = 1,234}", "1234"),
        (r"#### 9 and \boxed{3}", "9"),
        ("3,5,7", "7"),
        ("10-3", "3"),
        ("the total is 42.", "42"),
        ("no number here", None),
        (r"\boxed{}", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("42", 1.0),
        ("42.0", 1.0),
        ("42.0000001", 1.0),
        ("6 times 7 is 42", 1.0),
        ("#### 42", 1.0),
        (r"\boxed{42}", 1.0),
        ("43", 0.0),
        ("42.01", 0.0),
        ("-42", 0.0),
        ("", 0.0),
        ("I don't know", 0.0),
    ],
)
def test_numeric_reward(completion, expected):
    p = Problem(prompt="6*7?", answer="42", task="jsonl:demo", level=0)
    assert numeric_reward(p, completion) == expected


@given(st.text(max_size=80))
def test_numeric_reward_never_raises(completion):
    p = Problem(prompt="q", answer="1234", task="jsonl:demo", level=0)
    assert numeric_reward(p, completion) in (0.0, 1.0)


@given(st.decimals(min_value=-(10**9), max_value=10**9, places=3))
def test_extracted_plain_numbers_round_trip(value):
    text = format(value, "f")
    assert float(extract_answer(text)) == pytest.approx(float(value), rel=1e-9, abs=1e-12)


def _write(tmp_path, name: str, records: list[dict | str]) -> str:
    path = tmp_path / name
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def _dataset(tmp_path, n: int = 60) -> str:
    records: list[dict | str] = []
    for i in range(n):
        answer = f"{i} * 3 = {3 * i} #### {3 * i:,}"
        record: dict = {"prompt": f"What is {i} times 3?", "answer": answer}
        if i % 10 == 0:
            record["split"] = "eval"
        if i % 2:
            record["level"] = 1
        records.append(record)
    return _write(tmp_path, "gsm_like.jsonl", records)


def test_loads_name_levels_and_canonical_answers(tmp_path):
    task = JsonlTask(_dataset(tmp_path))
    assert task.name == "jsonl:gsm_like"
    assert task.levels == (0, 1)
    problems = task.problems("train", 0, 5, seed=0)
    for p in problems:
        i = int(p.prompt.split()[2])
        assert p.answer == str(3 * i)
        assert p.task == "jsonl:gsm_like" and p.level == 0
        assert task.reward(p, f"... #### {3 * i}") == 1.0


def test_default_level_is_zero(tmp_path):
    records = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)]
    path = _write(tmp_path, "plain.jsonl", records)
    assert JsonlTask(path).levels == (0,)


def test_splits_follow_explicit_field_else_split_of(tmp_path):
    task = JsonlTask(_dataset(tmp_path))
    explicit = {f"What is {i} times 3?" for i in range(0, 60, 10)}
    # The explicit field must override the hash, so some explicit eval prompts hash to train.
    assert any(split_of(SPLIT_KEY_NAME, q) == "train" for q in explicit)
    for level in task.levels:
        pool = [f"What is {i} times 3?" for i in range(60) if i % 2 == level]
        for split in ("train", "eval"):
            expected = {
                q
                for q in pool
                if ("eval" if q in explicit else split_of(SPLIT_KEY_NAME, q)) == split
            }
            got = task.problems(split, level, len(expected), seed=0)
            assert {p.prompt for p in got} == expected
            with pytest.raises(ValueError, match="fewer than"):
                task.problems(split, level, len(expected) + 1, seed=0)


def test_problems_are_deterministic_and_seed_shuffled(tmp_path):
    task = JsonlTask(_dataset(tmp_path))
    first = task.problems("train", 0, 10, seed=0)
    assert first == task.problems("train", 0, 10, seed=0)
    assert first != task.problems("train", 0, 10, seed=1)
    assert len({p.prompt for p in first}) == 10


def test_bad_requests_raise(tmp_path):
    task = JsonlTask(_dataset(tmp_path))
    with pytest.raises(ValueError, match="unknown level 7"):
        task.problems("train", 7, 1, seed=0)
    with pytest.raises(ValueError, match="fewer than 1000"):
        task.problems("train", 0, 1000, seed=0)
    with pytest.raises(ValueError, match="no generated solutions"):
        task.solution(task.problems("train", 0, 1, seed=0)[0], random.Random(0))


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ('{"prompt": "q", "answer": ', "not valid JSON"),
        ('["q", "1"]', "expected a JSON object"),
        ('{"answer": "1"}', "missing required key 'prompt'"),
        ('{"prompt": "q"}', "missing required key 'answer'"),
        ('{"prompt": "q", "answer": "seven"}', "contains no number"),
        ('{"prompt": "q", "answer": null}', "'answer' must be"),
        ('{"prompt": "", "answer": "1"}', "'prompt' must be"),
        ('{"prompt": "q", "answer": "1", "split": "test"}', "'split' must be one of"),
        ('{"prompt": "q", "answer": "1", "level": "hard"}', "'level' must be an integer"),
        ('{"prompt": "ok 0", "answer": "1"}', "duplicate prompt \\(first on line 1\\)"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, bad_line, message):
    # Line 2 is blank: line numbers count physical lines, as an editor shows them.
    path = _write(tmp_path, "broken.jsonl", [{"prompt": "ok 0", "answer": "1"}, "", bad_line])
    with pytest.raises(ValueError, match=message) as error:
        JsonlTask(path)
    assert f"{path}:3:" in str(error.value)


def test_missing_or_empty_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        JsonlTask(tmp_path / "absent.jsonl")
    empty = _write(tmp_path, "empty.jsonl", [""])
    with pytest.raises(ValueError, match="no problems"):
        JsonlTask(empty)


def test_numeric_json_answers_are_accepted(tmp_path):
    records = [
        {"prompt": "a", "answer": 42, "split": "train"},
        {"prompt": "b", "answer": -3.5, "split": "train"},
    ]
    path = _write(tmp_path, "nums.jsonl", records)
    assert {p.answer for p in JsonlTask(path).problems("train", 0, 2, seed=0)} == {"42", "-3.5"}


def test_get_task_loads_jsonl_by_suffix_or_prefix(tmp_path):
    path = _dataset(tmp_path)
    by_suffix, by_prefix = get_task(path), get_task(f"jsonl:{path}")
    assert isinstance(by_suffix, JsonlTask) and isinstance(by_prefix, JsonlTask)
    assert by_suffix.name == by_prefix.name == "jsonl:gsm_like"
    assert by_suffix.problems("eval", 1, 3, 0) == by_prefix.problems("eval", 1, 3, 0)
