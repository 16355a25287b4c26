"""Datasets read with Hugging Face ``datasets``: local parquet, JSON, CSV files and folders, column mapping,
the dataset's own splits or the prompt-hash split, errors naming the columns, and hub names validated offline.

Every dataset here is a local file: a hub name is only ever validated (which must not load it).
Run this file (``python tests/tasks/test_hf_dataset.py``) to rewrite the committed GSM8K-format sample.
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from isosweep.spec.trial import TrialConfig, load_trial, task_of
from isosweep.spec.yamlio import ConfigError
from isosweep.tasks import get_task, split_of
from isosweep.tasks.hf_dataset import HFDatasetTask, check_source
from isosweep.tasks.jsonl import SPLIT_KEY_NAME, JsonlTask

ROOT = Path(__file__).resolve().parents[2]
JSONL_SAMPLE = ROOT / "sweeps" / "data" / "gsm8k-style-sample.jsonl"
GSM8K_SAMPLE = ROOT / "sweeps" / "data" / "gsm8k-sample"
TEST_ROWS = 8
"""The sample's last rows form its ``test`` split, as GSM8K's ``test`` split sits beside ``train``."""


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """``datasets`` writes an Arrow copy of every file it loads: into this test's folder, not the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def gsm8k_sample() -> dict[str, dict[str, list[str]]]:
    """The JSONL sample in GSM8K's layout: splits ``train`` and ``test`` with columns ``question`` and
    ``answer`` (the worked solution ending ``#### N``); the question drops the JSONL prompt's
    ``Question: ``/``\\nAnswer:`` frame, which a chat template or the user's own prompt supplies."""
    rows = [json.loads(line) for line in JSONL_SAMPLE.read_text().splitlines() if line.strip()]
    columns = {"question": [r["prompt"].removeprefix("Question: ").removesuffix("\nAnswer:") for r in rows],
               "answer": [r["answer"] for r in rows]}
    return {"train": {name: values[:-TEST_ROWS] for name, values in columns.items()},
            "test": {name: values[-TEST_ROWS:] for name, values in columns.items()}}


def write_gsm8k_sample(folder: Path = GSM8K_SAMPLE) -> None:
    """Write `gsm8k_sample` as ``train.parquet`` and ``test.parquet`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, columns in gsm8k_sample().items():
        datasets.Dataset.from_dict(columns).to_parquet(folder / f"{split}.parquet")


def rows(n: int = 30, start: int = 0) -> datasets.Dataset:
    """``n`` GSM8K-style rows: ``question`` and an ``answer`` ending ``#### 3i``."""
    numbers = range(start, start + n)
    return datasets.Dataset.from_dict({"question": [f"What is {i} times 3?" for i in numbers],
                                       "answer": [f"{i} * 3 = {3 * i}\n#### {3 * i:,}" for i in numbers]})


def written(data: datasets.Dataset, path: Path) -> str:
    """``data`` written to ``path`` in the format its suffix names (``.json``: JSON lines, as ``datasets`` writes)."""
    {".parquet": data.to_parquet, ".csv": data.to_csv, ".jsonl": data.to_json, ".json": data.to_json}[path.suffix](path)
    return str(path)


def everything(task: HFDatasetTask) -> dict[str, set[str]]:
    """The prompts of each split of ``task``."""
    return {split: {p.prompt for p, s in task.rows() if s == split} for split in ("train", "eval")}


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl", ".json"])
def test_a_local_file_loads_graded_and_split_like_jsonl(tmp_path, suffix):
    path = written(rows(), tmp_path / f"data{suffix}")
    task = HFDatasetTask(path, prompt_column="question")
    assert task.name == f"hf:{path}" and task.levels == (0,)
    problems = task.problems("train", 0, 5, seed=0)
    for p in problems:
        i = int(p.prompt.split()[2])
        assert p.answer == str(3 * i) and p.task == task.name and p.level == 0  # "#### 3i" -> canonical number
        assert task.reward(p, f"so it is #### {3 * i}") == 1.0 and task.reward(p, str(3 * i + 1)) == 0.0
    # no eval split named: train and eval by prompt hash, the same assignment a JSONL file gets
    assert everything(task) == {split: {q for q in rows()["question"] if split_of(SPLIT_KEY_NAME, q) == split}
                                for split in ("train", "eval")}
    assert problems == task.problems("train", 0, 5, seed=0) != task.problems("train", 0, 5, seed=1)


def test_rows_are_read_once_and_only_when_problems_are_asked_for(tmp_path, monkeypatch):
    calls = []
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a) or real(*a, **k))
    task = HFDatasetTask(written(rows(), tmp_path / "data.parquet"), prompt_column="question")
    assert calls == []
    task.problems("train", 0, 3, seed=0)
    task.problems("eval", 0, 1, seed=0)
    assert len(calls) == 1


def test_same_rows_as_the_jsonl_loader(tmp_path):
    """One reading of a dataset's rows: a parquet file and a JSONL file of the same rows give the same problems."""
    data = rows().rename_column("question", "prompt")
    parquet = HFDatasetTask(written(data, tmp_path / "data.parquet"))
    jsonl = JsonlTask(written(data, tmp_path / "data.jsonl"))
    for split, prompts in everything(parquet).items():
        from_jsonl = jsonl.problems(split, 0, len(prompts), seed=0)  # all of them: asking for one more fails
        assert {(p.prompt, p.answer) for p in from_jsonl} == {(p.prompt, p.answer) for p, s in parquet.rows()
                                                              if s == split}


def test_a_folder_brings_its_own_splits(tmp_path):
    folder = tmp_path / "gsm"
    folder.mkdir()
    written(rows(20), folder / "train.parquet")
    written(rows(6, start=100), folder / "test.parquet")
    own = HFDatasetTask(str(folder), eval_split="test", prompt_column="question")
    assert everything(own) == {"train": set(rows(20)["question"]), "eval": set(rows(6, start=100)["question"])}
    assert len(own.problems("eval", 0, 6, seed=0)) == 6
    hashed = HFDatasetTask(str(folder), prompt_column="question")  # no eval split: the train split, by hash
    assert everything(hashed)["train"] | everything(hashed)["eval"] == set(rows(20)["question"])
    with pytest.raises(ValueError, match=r"Unknown split.*validation.*'test'"):
        HFDatasetTask(str(folder), eval_split="validation", prompt_column="question").rows()


def test_the_committed_gsm8k_sample_is_the_jsonl_sample_in_gsm8k_layout():
    for split, columns in gsm8k_sample().items():
        assert datasets.Dataset.from_parquet(str(GSM8K_SAMPLE / f"{split}.parquet")).to_dict() == columns
    task = HFDatasetTask(str(GSM8K_SAMPLE), eval_split="test", prompt_column="question")
    assert [len(everything(task)[s]) for s in ("train", "eval")] == [40 - TEST_ROWS, TEST_ROWS]
    assert all("####" not in p.prompt and p.answer.lstrip("-").isdigit() for p, _ in task.rows())


def test_a_bad_column_lists_the_dataset_columns(tmp_path):
    path = written(rows(), tmp_path / "data.parquet")
    with pytest.raises(ValueError, match=r"no column 'prompt' \(the prompt column, task.columns.prompt\); "
                                         r"its columns: question, answer"):
        HFDatasetTask(path).rows()
    with pytest.raises(ValueError, match="no column 'solution'.*its columns: question, answer"):
        HFDatasetTask(path, prompt_column="question", answer_column="solution").problems("train", 0, 1, 0)


def test_rows_are_validated_like_jsonl_lines(tmp_path):
    bad = rows(5).map(lambda row, i: {"answer": "no idea"} if i == 3 else row, with_indices=True)
    with pytest.raises(ValueError, match=r"\(train row 3\): answer 'no idea' contains no number"):
        HFDatasetTask(written(bad, tmp_path / "bad.csv"), prompt_column="question").rows()
    twice = datasets.concatenate_datasets([rows(3), rows(1)])
    with pytest.raises(ValueError, match=r"\(train row 3\): duplicate prompt \(first on train row 0\)"):
        HFDatasetTask(written(twice, tmp_path / "twice.parquet"), prompt_column="question").rows()


def test_sources_are_checked_without_loading(tmp_path, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("validation must not load a dataset")

    monkeypatch.setattr(datasets, "load_dataset", no_loading)
    hub = HFDatasetTask("openai/gsm8k", "main", eval_split="test", prompt_column="question")
    assert hub.name == "hf:openai/gsm8k" and hub.levels == (0,)
    check_source(written(rows(), tmp_path / "data.csv"))
    check_source(str(tmp_path))  # an existing folder
    for source in (str(tmp_path / "absent.parquet"), str(tmp_path / "absent"), "not a hub name", "a/b/c"):
        with pytest.raises(ValueError, match="no such file or folder"):
            check_source(source)
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"not a data file \(\.txt\).*allowed: hf:<a local \.parquet/"):
        check_source(str(tmp_path / "notes.txt"))
    with pytest.raises(ValueError, match="a dataset config .* not one file"):
        HFDatasetTask(str(tmp_path / "data.csv"), "main")
    with pytest.raises(ValueError, match="the eval split 'train' is also the train split"):
        HFDatasetTask("openai/gsm8k", eval_split="train")


def trial_yaml(tmp_path, task: str) -> Path:
    path = tmp_path / "trial.yaml"
    path.write_text(f"budget: 1000\ntask: {task}\nmodel: {{name: {tmp_path}}}\n")
    return path


def test_trial_configs_name_hub_datasets_without_a_download(tmp_path, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("validation must not load a dataset")

    monkeypatch.setattr(datasets, "load_dataset", no_loading)
    cfg = load_trial(trial_yaml(tmp_path, "{name: 'hf:openai/gsm8k', dataset_config: main, eval_split: test, "
                                          "columns: {prompt: question}, levels: [0]}"))
    task = task_of(cfg.task)
    assert isinstance(task, HFDatasetTask) and task is task_of(cfg.task)  # one object per config: loaded once
    assert (task.source, task.config, task.train_split, task.eval_split) == ("openai/gsm8k", "main", "train", "test")
    assert (task.prompt_column, task.answer_column) == ("question", "answer")
    assert isinstance(get_task("hf:openai/gsm8k"), HFDatasetTask)


@pytest.mark.parametrize("task", ["{name: arithmetic}", "{name: 'hf:openai/gsm8k', eval_split: test, levels: [0], "
                                  "columns: {prompt: question}, dataset_config: main, prompt_format: chat}"])
def test_a_dumped_config_reloads_as_itself(tmp_path, task):
    """What a Ray Train worker does with its trial's config: every key is written, defaults included."""
    cfg = load_trial(trial_yaml(tmp_path, task))
    assert TrialConfig.model_validate(cfg.model_dump(mode="json")) == cfg


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        ("{name: 'hf:absent.parquet', levels: [0]}", ["key 'task.name'", "absent.parquet: no such file or folder"]),
        ("{name: 'hf:a b', levels: [0]}", ["key 'task.name'", "hf:<owner>/<name>"]),
        ("{name: 'hf:openai/gsm8k'}", ["key 'task'", "levels [2] not allowed", "[0]"]),
        ("{name: arithmetic, eval_split: test}", ["task.eval_split: for hf: datasets only", "'arithmetic'"]),
        ("{name: 'hf:openai/gsm8k', levels: [0], columns: {question: q}}", ["key 'task.columns.question'"]),
        ("{name: 'hf:openai/gsm8k', levels: [0], prompt_format: chatml}", ["key 'task.prompt_format'", "'chat'"]),
        ("{name: sudoku}", ["unknown task 'sudoku'", "'hf:<owner>/<name>' (a hub dataset)"]),
    ],
)
def test_bad_dataset_configs_name_the_key(tmp_path, task, expected):
    path = trial_yaml(tmp_path, task)
    with pytest.raises(ConfigError) as error:
        load_trial(path)
    assert str(path) in str(error.value)
    for fragment in expected:
        assert fragment in str(error.value), (fragment, str(error.value))


if __name__ == "__main__":
    write_gsm8k_sample()
    print(f"wrote {', '.join(str(p) for p in sorted(GSM8K_SAMPLE.iterdir()))}")
