"""Verifiable problem families for GRPO, each with its pure reward beside it.

Synthetic tasks for the tiny character-level models -- ``arithmetic`` (a+b=), ``countdown`` (reach a
target with + - * over given numbers) and ``codes`` (recall a family's random code, with base pass
rates planted by the warm-up; variants ``codes-nodrift`` and ``codes-transfer``) -- whose prompts and
solutions use only `ALPHABET`, and two readers of user datasets graded by numeric answer: JSONL files
(``jsonl``) and anything Hugging Face ``datasets`` loads (``hf_dataset``: a local parquet, JSON or
CSV file or folder, or a hub dataset such as ``openai/gsm8k``). Train and eval are split by a hash
of the prompt (`split_of`), never by seed, so they cannot overlap -- unless a dataset brings its
own eval split.

>>> task = get_task("arithmetic")
>>> [p] = task.problems("train", level=2, count=1, seed=0)
>>> task.reward(p, p.answer)
1.0
"""

from __future__ import annotations

from isosweep.tasks.arithmetic import ArithmeticTask
from isosweep.tasks.base import ALPHABET, Problem, Task, split_of
from isosweep.tasks.codes import CodesTask
from isosweep.tasks.countdown import CountdownTask
from isosweep.tasks.hf_dataset import HFDatasetTask
from isosweep.tasks.jsonl import JsonlTask

__all__ = [
    "ALPHABET",
    "SYNTHETIC",
    "TASKS",
    "ArithmeticTask",
    "CodesTask",
    "CountdownTask",
    "HFDatasetTask",
    "JsonlTask",
    "Problem",
    "Task",
    "get_task",
    "split_of",
]

TASKS: dict[str, Task] = {
    "arithmetic": ArithmeticTask(),
    "countdown": CountdownTask(),
    "codes": CodesTask("codes"),
    "codes-nodrift": CodesTask("codes-nodrift", drift=False),
    "codes-transfer": CodesTask("codes-transfer", drift=False, transfer=True),
}

SYNTHETIC = tuple(TASKS)
"""The built-in tasks: the ones a tiny base model is warmed up on."""


def get_task(name: str) -> Task:
    """The task called ``name``: a key of `TASKS`; a JSONL dataset given as ``"path/to/data.jsonl"``
    or ``"jsonl:path/to/data"``; or a dataset read with Hugging Face ``datasets``, given as
    ``"hf:path/to/data.parquet"`` (or ``.json``, ``.jsonl``, ``.csv``, or a folder of such files) or
    ``"hf:owner/name"`` on the hub. An ``hf:`` task made here has the default columns (``prompt``,
    ``answer``) and splits (``train``, eval by prompt hash); nothing is loaded until its problems are
    asked for.
    """
    if name in TASKS:
        return TASKS[name]
    if name.startswith("hf:"):
        return HFDatasetTask(name.removeprefix("hf:"))
    if name.startswith("jsonl:"):
        return JsonlTask(name.removeprefix("jsonl:"))
    if name.endswith(".jsonl"):
        return JsonlTask(name)
    raise ValueError(
        f"unknown task {name!r}; allowed: {', '.join(sorted(TASKS))}, "
        "a path ending in '.jsonl', 'jsonl:<path>', "
        "'hf:<path>' (a local .parquet, .json, .jsonl or .csv file, or a folder of them) "
        "or 'hf:<owner>/<name>' (a hub dataset)"
    )
