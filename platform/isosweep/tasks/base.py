"""What every task shares: the `Problem` record, the train/eval split, and the `Task` protocol.

The split is a pure function of the task name and the prompt (`split_of`), not of a seed, so no
seed, level or count can ever put an eval prompt into training. Synthetic tasks draw problems
with `draw_problems`, which keeps only the draws that fall in the requested split.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")

ALPHABET = "0123456789+-*()=,:> "
"""Every character a synthetic prompt, answer or completion may use: the tiny models' vocabulary."""


@dataclass(frozen=True)
class Problem:
    """One verifiable problem.

    The prompt is fed to the model verbatim; a completion is the text the model generates after
    it (no end-of-sequence token), and the task's reward scores that completion alone.
    """

    prompt: str
    """Text the model is conditioned on, e.g. ``"12+34="``."""
    answer: str
    """One correct completion (synthetic tasks) or the canonical numeric answer (user datasets)."""
    task: str
    """Name of the task that produced it."""
    level: int
    """Difficulty level within the task."""
    numbers: tuple[int, ...] = ()
    """The numbers a countdown completion must use, each exactly once; empty for other tasks."""


def split_of(task_name: str, key: str, eval_fraction: float = 0.2) -> Split:
    """Assign ``key`` to train or eval from sha256 of ``f"{task_name}:{key}"``.

    The same (task_name, key) always lands in the same split, on every machine and Python
    version, which is what keeps train and eval disjoint whatever seed draws the problems.

    >>> split_of("arithmetic", "1+2=") == split_of("arithmetic", "1+2=")
    True
    >>> split_of("arithmetic", "1+2=", eval_fraction=0.0)
    'train'
    """
    if not 0.0 <= eval_fraction <= 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1], got {eval_fraction}")
    digest = hashlib.sha256(f"{task_name}:{key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64  # uniform in [0, 1)
    return "eval" if u < eval_fraction else "train"


def seeded_rng(*parts: object) -> random.Random:
    """A `random.Random` seeded by sha256 of the parts, stable across processes (unlike `hash`)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


@dataclass(frozen=True)
class Band:
    """A range of base pass rates, ``[low, high)`` unless the flags say otherwise: a difficulty's problems
    (``spec.trial.difficulty_band``) are those whose probed rate it contains.

    >>> Band(0.3, 1.0, high_closed=True).contains(1.0), Band(0.0, 0.05, low_open=True, high_closed=True).contains(0.0)
    (True, False)
    >>> str(Band(0.0, 0.05, low_open=True, high_closed=True))
    '(0, 0.05]'
    """

    low: float
    high: float
    low_open: bool = False
    """Exclude ``low`` itself (``(0, x]``: at least one success in the probe)."""
    high_closed: bool = False
    """Include ``high`` itself."""

    def contains(self, rate: float) -> bool:
        above = rate > self.low if self.low_open else rate >= self.low
        below = rate <= self.high if self.high_closed else rate < self.high
        return above and below

    def __str__(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{']' if self.high_closed else ')'}"


@runtime_checkable
class Task(Protocol):
    """A family of verifiable problems, graded by a pure reward."""

    name: str
    levels: tuple[int, ...]

    def problems(self, split: Split, level: int, count: int, seed: int) -> list[Problem]:
        """``count`` problems of ``split`` at ``level``, with unique prompts.

        Deterministic for (split, level, count, seed). Raises ValueError if the level is unknown
        or the split holds fewer than ``count`` distinct problems at that level.
        """
        ...

    def reward(self, problem: Problem, completion: str) -> float:
        """1.0 if ``completion`` solves ``problem``, else 0.0; pure and never raises."""
        ...

    def solution(self, problem: Problem, rng: random.Random) -> str:
        """A warm-up target for supervised warm-up (synthetic tasks only): a correct completion, except where
        the task plants its base pass rate through it (``codes``)."""
        ...


def check_request(task: Task, split: str, level: int, count: int) -> None:
    """Raise ValueError naming the task if split, level or count is not a valid request."""
    if split not in SPLITS:
        raise ValueError(f"{task.name}: split must be one of {SPLITS}, got {split!r}")
    if level not in task.levels:
        raise ValueError(f"{task.name}: unknown level {level!r}; levels are {task.levels}")
    if count < 0:
        raise ValueError(f"{task.name}: count must be >= 0, got {count}")


def draw_problems(
    task: Task,
    split: Split,
    level: int,
    count: int,
    seed: int,
    draw: Callable[[random.Random], Problem],
) -> list[Problem]:
    """Draw problems with ``draw`` until ``count`` distinct prompts of ``split`` are collected.

    The random stream depends on (task, split, level, seed) only, so the result is deterministic.
    Gives up after ``100 * count + 10_000`` draws: for the small levels (a few hundred prompts)
    that many draws see every prompt with overwhelming probability, so running out means the
    split really holds fewer than ``count`` problems.
    """
    check_request(task, split, level, count)
    rng = seeded_rng(task.name, split, level, seed)
    max_draws = 100 * count + 10_000
    chosen: dict[str, Problem] = {}
    draws = 0
    while len(chosen) < count and draws < max_draws:
        problem = draw(rng)
        draws += 1
        if problem.prompt not in chosen and split_of(task.name, problem.prompt) == split:
            chosen[problem.prompt] = problem
    if len(chosen) < count:
        raise ValueError(
            f"{task.name} level {level} has fewer than {count} distinct {split} problems "
            f"(found {len(chosen)} in {max_draws} draws); ask for fewer or use a higher level"
        )
    return list(chosen.values())
