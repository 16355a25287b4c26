"""Verifiable problem families for GRPO, each with its pure reward beside it.

Two synthetic tasks for the tiny character-level models -- ``arithmetic`` (a+b=) and
``countdown`` (reach a target with + - * over given numbers) -- whose prompts and solutions use
only `ALPHABET`, and a loader for user JSONL datasets graded by numeric answer. Train and eval
are split by a hash of the prompt (`split_of`), never by seed, so they cannot overlap.

>>> task = get_task("arithmetic")
>>> [p] = task.problems("train", level=2, count=1, seed=0)
>>> task.reward(p, p.answer)
1.0
"""

from __future__ import annotations

from isosweep.tasks.arithmetic import ArithmeticTask
from isosweep.tasks.base import ALPHABET, Problem, Task, split_of
from isosweep.tasks.countdown import CountdownTask
from isosweep.tasks.jsonl import JsonlTask

__all__ = [
    "ALPHABET",
    "TASKS",
    "ArithmeticTask",
    "CountdownTask",
    "JsonlTask",
    "Problem",
    "Task",
    "get_task",
    "split_of",
]

TASKS: dict[str, Task] = {"arithmetic": ArithmeticTask(), "countdown": CountdownTask()}


def get_task(name: str) -> Task:
    """The task called ``name``: a key of `TASKS`, or a JSONL dataset given as
    ``"path/to/data.jsonl"`` or ``"jsonl:path/to/data"``.
    """
    if name in TASKS:
        return TASKS[name]
    if name.startswith("jsonl:"):
        return JsonlTask(name.removeprefix("jsonl:"))
    if name.endswith(".jsonl"):
        return JsonlTask(name)
    raise ValueError(
        f"unknown task {name!r}; allowed: {', '.join(sorted(TASKS))}, "
        "a path ending in '.jsonl', or 'jsonl:<path>'"
    )
