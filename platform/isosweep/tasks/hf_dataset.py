"""User datasets read with Hugging Face ``datasets``: a local file or folder, or a dataset on the hub.

A task name ``hf:<source>`` names the data; ``<source>`` is

- a local ``.parquet``, ``.json``/``.jsonl`` or ``.csv`` file, loaded with
  ``load_dataset("parquet" | "json" | "csv", data_files=...)`` (its one split is ``train``);
- a local folder of such files, loaded with ``load_dataset(folder)``: its splits come from the file
  names (``train.parquet`` and ``test.parquet`` give ``train`` and ``test``);
- otherwise a hub dataset ``owner/name`` (``openai/gsm8k``), loaded with
  ``load_dataset(name, config, split=...)`` and downloaded on first use.

Rows are read through the JSONL loader's `problem_rows`, so they are graded, validated and split
exactly as a JSONL file's: ``answer`` may be GSM8K-style (``"... #### 42"``) and is reduced to its
canonical number, `numeric_reward` grades a completion. The prompt and answer columns are
configurable (GSM8K's are ``question`` and ``answer``). With an eval split named, its rows are the
eval problems and the train split's the training ones; without, the train split is divided by
`split_of` on the prompt, as JSONL lines without a ``split`` are. Every row is level 0.

Nothing is read when the task is made: the source's form is checked (a local path must exist), and
the data is loaded when problems are first asked for, then kept in the object. So a config naming a
hub dataset validates without a download.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from pathlib import Path

from isosweep.tasks.base import Problem, Split, check_request
from isosweep.tasks.jsonl import numeric_reward, pick_problems, problem_rows

PREFIX = "hf:"
DATA_FILES = {".parquet": "parquet", ".json": "json", ".jsonl": "json", ".csv": "csv"}
"""Local file suffix -> the ``datasets`` builder that reads it."""
HUB_NAME = re.compile(r"[\w.-]+/[\w.-]+")


def check_source(source: str, config: str | None = None) -> None:
    """Raise ValueError unless ``source`` is an existing local data file or folder, or of a hub name's form.

    Reads nothing but the file system's entry for ``source``; never the hub.
    """
    path = Path(source).expanduser()
    allowed = (f"allowed: {PREFIX}<a local {'/'.join(DATA_FILES)} file or a folder of them> "
               f"or {PREFIX}<owner>/<name> of a hub dataset")
    if path.is_file():
        if path.suffix not in DATA_FILES:
            raise ValueError(f"{source}: not a data file ({path.suffix or 'no suffix'}); {allowed}")
        if config is not None:
            raise ValueError(f"{source}: a dataset config ({config!r}) is for hub datasets and folders, not one file")
    elif not path.is_dir() and (path.suffix in DATA_FILES or not HUB_NAME.fullmatch(source)):
        raise ValueError(f"{source}: no such file or folder; {allowed}")


def load_split(source: str, config: str | None, split: str):
    """One split of ``source`` as a ``datasets.Dataset``: the one place a dataset is loaded."""
    import datasets  # reason: seconds to import; only a trial on an hf: dataset needs it

    path = Path(source).expanduser()
    try:
        if path.is_file():
            return datasets.load_dataset(DATA_FILES[path.suffix], data_files=str(path), split=split)
        return datasets.load_dataset(str(path) if path.is_dir() else source, config, split=split)
    except ValueError as error:  # an unknown split: datasets names the ones there are
        raise ValueError(f"{PREFIX}{source}: {error}") from error


class HFDatasetTask:
    """A dataset read with ``datasets.load_dataset``, lazily; see the module docstring."""

    levels: tuple[int, ...] = (0,)

    def __init__(self, source: str, config: str | None = None, train_split: str = "train",
                 eval_split: str | None = None, prompt_column: str = "prompt", answer_column: str = "answer"):
        check_source(source, config)
        if eval_split == train_split:
            raise ValueError(f"{PREFIX}{source}: the eval split {eval_split!r} is also the train split; "
                             "allowed: another split of the dataset, or none (train and eval by prompt hash)")
        self.source, self.config = source, config
        self.train_split, self.eval_split = train_split, eval_split
        self.prompt_column, self.answer_column = prompt_column, answer_column
        self.name = f"{PREFIX}{source}"
        self._rows: list[tuple[Problem, Split]] | None = None

    def rows(self) -> list[tuple[Problem, Split]]:
        """Every ``(problem, split)`` of the dataset, loaded on the first call."""
        if self._rows is None:
            self._rows = problem_rows(self._records(), self.name, self.name)
        return self._rows

    def _records(self) -> Iterator[tuple[str, str, dict]]:
        """``(where, label, {"prompt", "answer"[, "split"]})`` of every row of the splits used."""
        ours: dict[str, Split] = {self.train_split: "train"}
        if self.eval_split is not None:
            ours[self.eval_split] = "eval"
        for theirs, split in ours.items():
            data = load_split(self.source, self.config, theirs)
            for role, column in (("prompt", self.prompt_column), ("answer", self.answer_column)):
                if column not in data.column_names:
                    raise ValueError(f"{self.name} split {theirs!r} has no column {column!r} (the {role} column, "
                                     f"task.columns.{role}); its columns: {', '.join(data.column_names)}")
            for i, (prompt, answer) in enumerate(zip(data[self.prompt_column], data[self.answer_column])):
                record = {"prompt": prompt, "answer": answer}
                if self.eval_split is not None:
                    record["split"] = split
                yield f"{self.name} ({theirs} row {i})", f"{theirs} row {i}", record

    def problems(self, split: Split, level: int, count: int, seed: int) -> list[Problem]:
        """``count`` of the dataset's ``split`` problems at ``level``, shuffled by ``seed``."""
        check_request(self, split, level, count)
        return pick_problems(self.rows(), self.name, self.name, split, level, count, seed)

    def reward(self, problem: Problem, completion: str) -> float:
        return numeric_reward(problem, completion)

    def solution(self, problem: Problem, rng: random.Random) -> str:
        raise ValueError("user datasets have no generated solutions; warm up a real model elsewhere")
