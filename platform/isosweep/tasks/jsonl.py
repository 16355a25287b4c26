"""User datasets from JSONL files, graded by numeric equality of the final answer.

Each line is ``{"prompt": ..., "answer": ...}`` with optional ``"split"`` ("train"/"eval") and
``"level"`` (int). Answers may be plain (``"1,234"``), GSM8K-style (``"... #### 42"``) or LaTeX
(``"\\boxed{42}"``); `Problem.answer` holds the extracted canonical number. Lines without an
explicit split are assigned by `split_of` keyed on the prompt under the name ``"jsonl"`` rather
than the file's, so renaming or copying the file does not move problems between splits.

`problem_rows` (validation, canonical answers, split assignment, duplicates) and `pick_problems`
are the one reading of a user dataset's rows: :mod:`isosweep.tasks.hf_dataset` uses them too.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterable, Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path

from isosweep.tasks.base import SPLITS, Problem, Split, check_request, seeded_rng, split_of

SPLIT_KEY_NAME = "jsonl"

# Thousands-grouped numbers first, so "1,234" is one number while "3,5,7" is three.
_NUMBER = re.compile(r"-?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(\d+)\}$")


def _canonical(number: str) -> str | None:
    """``"1,234.50"`` -> ``"1234.5"``, ``"42.0"`` -> ``"42"``; None if not a number."""
    try:
        value = Decimal(number.replace(",", ""))
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    return "0" if value == 0 else format(value.normalize(), "f")


def _last_number(text: str) -> str | None:
    """The last number in ``text``, canonical; a minus after a digit is subtraction, not a sign."""
    text = text.replace("$", "")
    matches = list(_NUMBER.finditer(text))
    if not matches:
        return None
    number, start = matches[-1].group(), matches[-1].start()
    if number.startswith("-") and start > 0 and text[start - 1] in "0123456789)":
        number = number[1:]
    return _canonical(number)


def _first_number(text: str) -> str | None:
    match = _NUMBER.search(text.replace("$", ""))
    return _canonical(match.group()) if match else None


def _last_boxed(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}`` (braces balanced), or None if absent or unclosed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{") - 1
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin + 1 : i]
    return None


def extract_answer(text: str) -> str | None:
    r"""The canonical final number of ``text``, or None if it has none.

    Prefers the number after ``####`` (GSM8K), then the last ``\boxed{...}`` (a ``\frac{a}{b}``
    in it is divided out), then the last number anywhere. Commas and ``$`` are dropped.

    >>> extract_answer("3 boxes of 2 is 6, plus 36 #### 1,234")
    '1234'
    >>> extract_answer(r"so $x = \boxed{42}$"), extract_answer(r"\boxed{\frac{1}{4}}")
    ('42', '0.25')
    >>> extract_answer("it costs $3.50 and then -2.0"), extract_answer("no digits")
    ('-2', None)
    """
    _, sep, tail = text.partition("####")
    if sep:
        found = _first_number(tail)
        if found is not None:
            return found
    boxed = _last_boxed(text)
    if boxed is not None:
        content = boxed.replace(" ", "").replace("$", "")
        frac = _FRAC.match(content)
        if frac:
            sign, num, den = frac.groups()
            if int(den) != 0:
                value = Decimal(num) / Decimal(den)
                return _canonical(str(-value if sign else value))
        found = _last_number(content)
        if found is not None:
            return found
    return _last_number(text)


def numeric_reward(problem: Problem, completion: str) -> float:
    """1.0 iff the completion's extracted answer equals ``problem.answer`` within 1e-6 relative.

    Never raises; a completion with no number scores 0.0.

    >>> p = Problem(prompt="6*7?", answer="42", task="jsonl:demo", level=0)
    >>> numeric_reward(p, "42.0"), numeric_reward(p, "so #### 42"), numeric_reward(p, "6*7 = 42")
    (1.0, 1.0, 1.0)
    >>> numeric_reward(p, "42 is wrong, it is 43"), numeric_reward(p, "no idea")
    (0.0, 0.0)
    """
    got = extract_answer(completion)
    if got is None:
        return 0.0
    try:
        return 1.0 if math.isclose(float(got), float(problem.answer), rel_tol=1e-6) else 0.0
    except (ValueError, OverflowError):
        return 0.0


def problem_rows(records: Iterable[tuple[str, str, object]], source: str, name: str) -> list[tuple[Problem, Split]]:
    """Validate records into ``(problem, split)`` rows: the one reading of a user dataset's rows.

    Each record comes as ``(where, label, record)``: ``where`` starts its error messages
    (``data.jsonl:3``), ``label`` names it as the first of a duplicate (``line 3``), and ``record``
    must be a dict with ``prompt`` and ``answer`` and optionally ``split`` and ``level``. Rows
    without a split are assigned by `split_of` under `SPLIT_KEY_NAME`. Raises ValueError naming
    the record; ``source`` names the dataset when it has no rows at all.
    """
    rows: list[tuple[Problem, Split]] = []
    first: dict[str, str] = {}
    for where, label, record in records:
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        for key in ("prompt", "answer"):
            if key not in record:
                raise ValueError(f"{where}: missing required key {key!r}")
        prompt, raw_answer = record["prompt"], record["answer"]
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"{where}: 'prompt' must be a non-empty string")
        if isinstance(raw_answer, bool) or not isinstance(raw_answer, (str, int, float)):
            raise ValueError(f"{where}: 'answer' must be a string or a number")
        answer = extract_answer(str(raw_answer))
        if answer is None:
            raise ValueError(f"{where}: answer {str(raw_answer)[-80:]!r} contains no number")
        split = record["split"] if "split" in record else split_of(SPLIT_KEY_NAME, prompt)
        if split not in SPLITS:
            raise ValueError(f"{where}: 'split' must be one of {SPLITS}, got {split!r}")
        level = record.get("level", 0)
        if isinstance(level, bool) or not isinstance(level, int):
            raise ValueError(f"{where}: 'level' must be an integer, got {level!r}")
        # A repeated prompt could sit in both splits and leak eval into training.
        if prompt in first:
            raise ValueError(f"{where}: duplicate prompt (first on {first[prompt]})")
        first[prompt] = label
        rows.append((Problem(prompt=prompt, answer=answer, task=name, level=level), split))
    if not rows:
        raise ValueError(f"{source}: dataset has no problems")
    return rows


def pick_problems(rows: list[tuple[Problem, Split]], source: str, name: str, split: Split, level: int,
                  count: int, seed: int) -> list[Problem]:
    """``count`` of the rows' ``split`` problems at ``level``, shuffled by ``(name, split, level, seed)``."""
    pool = [p for p, s in rows if s == split and p.level == level]
    if len(pool) < count:
        raise ValueError(f"{source}: level {level} has {len(pool)} {split} problems, fewer than {count}")
    seeded_rng(name, split, level, seed).shuffle(pool)
    return pool[:count]


def _records(path: Path) -> Iterator[tuple[str, str, object]]:
    """``(where, label, record)`` of every non-blank line; ValueError names the file and line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise ValueError(f"{path}: cannot read dataset: {error}") from error
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg})") from error
        yield where, f"line {lineno}", record


class JsonlTask:
    """A user dataset loaded once from a JSONL file; see the module docstring for the format."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = f"jsonl:{self.path.stem}"
        self._rows = problem_rows(_records(self.path), str(self.path), self.name)
        self.levels: tuple[int, ...] = tuple(sorted({problem.level for problem, _ in self._rows}))

    def problems(self, split: Split, level: int, count: int, seed: int) -> list[Problem]:
        """``count`` of the file's ``split`` problems at ``level``, shuffled by ``seed``."""
        check_request(self, split, level, count)
        return pick_problems(self._rows, str(self.path), self.name, split, level, count, seed)

    def reward(self, problem: Problem, completion: str) -> float:
        return numeric_reward(problem, completion)

    def solution(self, problem: Problem, rng: random.Random) -> str:
        raise ValueError(
            "user datasets have no generated solutions; warm up a real model elsewhere"
        )
