"""Bad input, kind by kind: each is answered with exit status 2 and a message naming the file or variable,
the key and what is allowed, before anything is written (no runs folder, no MLflow run, no Ray job).

`CASES` is the table the user guide shows (``platform/docs/``, "Bad input and what isosweep says"); a test
keeps the two the same, so a row cannot outlive its check. Kinds checked by other
test modules (they need a cluster config, a running sweep or a server) are listed in `ELSEWHERE`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from isosweep.cli import main

ROOT = Path(__file__).resolve().parents[2]
EASY = ROOT / "sweeps" / "trials" / "easy.yaml"
# The pages that may show the bad-input table; it is found by its header row.
GUIDE = [ROOT / "README.md", *sorted((ROOT / "platform" / "docs").glob("*.md"))]
TABLE_HEAD = "| bad input | example | the message holds | test |"


@dataclass(frozen=True)
class Case:
    """One kind of bad input: the command (``{tmp}`` is the test's folder), the files it reads, the environment,
    and the words the message must hold."""

    kind: str
    command: str
    says: tuple[str, ...]
    files: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def sweep_file(extra: str = "", grid: str = "{n: [4], Bp: [8]}", head: str = "name: bad\nstudy: isocompute\n") -> str:
    return f"{head}trial: {EASY}\nbudget: 2000\ngrid: {grid}\n{extra}"


TRIAL = f"trial {EASY.relative_to(ROOT)} --out {{tmp}}/out --set"
SWEEP = "sweep {tmp}/s.yaml --dry-run"

CASES = [
    # sweep files
    Case("sweep file missing", "sweep {tmp}/none.yaml", ("none.yaml: no such file",)),
    Case("sweep file not YAML", SWEEP, ("s.yaml: not valid YAML", "line 2"), {"s.yaml": "name: x\nstudy: [isocompute\n"}),
    Case("sweep file empty", SWEEP, ("s.yaml: key 'study'", "allowed: isocompute, fixed-batch, hpo"), {"s.yaml": ""}),
    Case("unknown sweep key", SWEEP, ("s.yaml: key 'grdi': unknown key", "allowed here: name,"),
         {"s.yaml": sweep_file("grdi: 1\n")}),
    Case("unknown study kind", SWEEP, ("s.yaml: key 'study'", "allowed: isocompute, fixed-batch, hpo"),
         {"s.yaml": sweep_file(head="name: bad\nstudy: isocomputing\n")}),
    Case("trial file missing", SWEEP, ("s.yaml: key 'trial': no such file",),
         {"s.yaml": "name: bad\nstudy: isocompute\ntrial: nope.yaml\nbudget: 2000\ngrid: {n: [4], Bp: [8]}\n"}),
    Case("unknown key under set:", SWEEP, ("key 'algorithm.nope': unknown key", "allowed here: lr_ref"),
         {"s.yaml": sweep_file("set: {algorithm.nope: 1}\n")}),
    Case("repeated grid values", SWEEP, ("s.yaml: key 'grid.n': values must be distinct",),
         {"s.yaml": sweep_file(grid="{n: [4, 4], Bp: [8]}")}),
    Case("no seeds", SWEEP, ("s.yaml: key 'seeds'", "at least 1 item"), {"s.yaml": sweep_file("seeds: []\n")}),
    Case("unknown frontier metric", SWEEP, ("s.yaml: key 'frontier.metric'", "'mean', 'best' or 'worst'"),
         {"s.yaml": sweep_file("frontier: {metric: median}\n")}),
    Case("budget below one step of a grid point", "sweep sweeps/smoke.yaml --budget 40 --dry-run",
         ("sweeps/smoke.yaml: grid point n8-Bp8", "smaller than one step", "allowed: budget >= Bp * n")),
    # trial files and --set
    Case("unknown trial key", f"{TRIAL} algorithm.lr_reff=1", ("key 'algorithm.lr_reff': unknown key", "allowed here: lr_ref")),
    Case("wrong type", f"{TRIAL} Bp=sixteen", ("easy.yaml (with --set Bp=sixteen): key 'Bp'", "valid integer")),
    Case("value out of range", f"{TRIAL} rollout.temperature=-1", ("key 'rollout.temperature': must be greater than 0",)),
    Case("unknown rollout precision", f"{TRIAL} rollout.precision=int5",
         ("key 'rollout.precision': must be 'fp32', 'bf16', 'fp8', 'int8', 'int6', 'int4', 'int3' or 'int2'",)),
    Case("integer rollout precision with NCCL weight sync", f"{TRIAL} profile=h200-multinode --set rollout.precision=int4",
         ("rollout.precision 'int4' is emulated", "profile 'h200-multinode' syncs weights over NCCL",
          "allowed with it: bf16 or fp8")),
    Case("unknown rollout engine", f"{TRIAL} rollout.engine=sglang", ("key 'rollout.engine': must be 'auto', 'vllm' or 'hf'",)),
    Case("unknown difficulty", f"{TRIAL} task.difficulty=medium", ("key 'task.difficulty': must be 'easy', 'hard' or 'all'",)),
    Case("unknown model", f"{TRIAL} model.name=tiny-2m", ("key 'model.name': unknown model 'tiny-2m'", "tiny-0.3m, tiny-1m")),
    Case("unknown task", f"{TRIAL} task.name=algebra", ("key 'task.name': unknown task 'algebra'", "allowed: arithmetic")),
    Case("levels the task lacks", f"{TRIAL} task.levels=[9]", ("levels [9] not allowed for task 'arithmetic'",)),
    Case("k above the samples per problem", f"{TRIAL} eval.k=32", ("key 'eval': k = 32", "allowed: k <= samples (20)")),
    Case("unknown hardware profile", f"{TRIAL} profile=gpu-lots", ("key 'profile': unknown hardware profile 'gpu-lots'",
                                                                   "cpu-tiny", "clusters/profiles.yaml")),
    Case("--set without =", f"{TRIAL} Bp", ("--set 'Bp': expected key=value",)),
    Case("budget below one step of a trial", f"{TRIAL} budget=100", ("budget C = 100 rollouts is smaller than one step",)),
    # data files
    Case("JSONL file missing", f"{TRIAL} task.name={{tmp}}/none.jsonl --set model.name={{tmp}}",
         ("key 'task.name'", "none.jsonl: cannot read dataset")),
    Case("JSONL line not JSON", f"{TRIAL} task.name={{tmp}}/d.jsonl --set model.name={{tmp}}",
         ("d.jsonl:2: not valid JSON",), {"d.jsonl": '{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?"\n'}),
    Case("JSONL line without an answer", f"{TRIAL} task.name={{tmp}}/d.jsonl --set model.name={{tmp}}",
         ("d.jsonl:1: missing required key 'answer'",), {"d.jsonl": '{"prompt": "1+1?", "ans": "2"}\n'}),
    Case("a dataset with a tiny base model", f"{TRIAL} task.name=sweeps/data/gsm8k-style-sample.jsonl --set task.levels=[0]",
         ("model.name 'tiny-1m' is a tiny base model", "use a real model for datasets")),
    Case("band too small for Bp", "sweep {tmp}/s.yaml --runs {tmp}/runs",
         ("s.yaml: task.difficulty='hard' on levels [2] leaves", "allowed: at least Bp = 2048 train problems"),
         {"s.yaml": sweep_file("set: {task.difficulty: hard}\n", grid="{n: [4], Bp: [2048]}").replace("2000", "8192")},
         {"ISOSWEEP_MLFLOW_PORT": "0"}),
    # command-line flags and budgets
    Case("budget not a number", "sweep sweeps/smoke.yaml --budget abc --dry-run", ("budget 'abc' is not a number",)),
    Case("negative budget", "sweep sweeps/smoke.yaml --budget=-1e5 --dry-run", ("budget '-1e5' must be a positive whole number",)),
    Case("infinite budget", "sweep sweeps/smoke.yaml --budget inf --dry-run", ("budget 'inf' must be a positive whole number",)),
    Case("study budget on a grid sweep", "sweep sweeps/smoke.yaml --study-budget 4x --dry-run",
         ("is for HPO studies (study: hpo), not grid sweeps",)),
    Case("study budget not a number", "sweep sweeps/jfhpo.yaml --study-budget 6y --dry-run",
         ("sweeps/jfhpo.yaml: key 'study_budget': '6y' is not a number", "e.g. 6x")),
    Case("cluster file missing", "sweep sweeps/smoke.yaml --dry-run --cluster clusters/none.yaml", ("clusters/none.yaml: no such file",)),
    Case("submit without a cluster", "submit sweeps/smoke.yaml", ("submit needs --cluster",)),
    Case("recommend: unknown metric", "recommend --budget 1e5 --metric median --from dashboards --no-log",
         ("--metric 'median': allowed ['mean', 'best', 'worst']",)),
    Case("recommend: unknown sweep", "recommend --budget 1e5 --sweeps nosuch --from dashboards --no-log",
         ("--sweeps 'nosuch': no such sweep under dashboards; there: [",)),
    Case("recommend: no sweep of the task", "recommend --budget 1e5 --task countdown --from dashboards --no-log",
         ("no finished sweep of task countdown; finished sweeps:",)),
    # environment variables
    Case("ISOSWEEP_MLFLOW_PORT not a port", "sweep sweeps/smoke.yaml --budget 2e3 --runs {tmp}/runs",
         ("ISOSWEEP_MLFLOW_PORT='abc': not a port", "from 1 to 65535"), env={"ISOSWEEP_MLFLOW_PORT": "abc"}),
    Case("MLFLOW_TRACKING_URI unreachable", "sweep sweeps/smoke.yaml --budget 2e3 --runs {tmp}/runs",
         ("MLFLOW_TRACKING_URI=http://127.0.0.1:9: no MLflow server answers at http://127.0.0.1:9/health",
          "unset it to use isosweep's local server"),
         env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "ISOSWEEP_MLFLOW_WAIT_S": "1"}),
    Case("ISOSWEEP_MLFLOW_WAIT_S not a wait", "sweep sweeps/smoke.yaml --budget 2e3 --runs {tmp}/runs",
         ("ISOSWEEP_MLFLOW_WAIT_S='soon': not a wait", "seconds from 0 to 86400"),
         env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "ISOSWEEP_MLFLOW_WAIT_S": "soon"}),
]

ELSEWHERE = {
    "profiles file: unknown key or impossible layout": "tests/spec/test_profiles.py::test_bad_profiles_name_file_and_key",
    "cluster YAML Ray refuses": "tests/spec/test_clusters.py::test_ray_rejects_broken_cluster_yaml",
    "HPO study file: bad key or range": "tests/spec/test_hpo.py::test_bad_input_names_the_file_and_the_key",
    "another MLflow server on isosweep's port": "tests/track/test_runs.py::test_a_bad_port_or_a_server_that_is_not_ours_is_a_clear_error",
    "a second driver of one sweep": "tests/run/test_core.py::test_a_second_driver_of_one_sweep_is_refused_and_a_killed_one_leaves_no_stale_lock",
    "a rerun pointed at another runs folder": "tests/run/test_core.py::test_a_rerun_pointed_at_another_runs_folder_is_refused_before_anything_is_written",
    "a damaged line in metrics.jsonl": "tests/trial/test_files.py::test_a_damaged_line_in_the_middle_names_the_file_and_the_line",
    "HPO table file: bad key, default off the grid, a cell that is not a valid trial":
        "tests/experiments/test_hpo_table.py::test_a_bad_table_file_names_the_file_and_the_key",
    "a searcher comparison on a table that fails its signal check":
        "tests/experiments/test_hpo_replay.py::"
        "test_a_table_whose_proxies_do_not_transfer_is_refused_and_force_replays_it_with_the_label",
}
"""Kinds of bad input whose check needs more than a command line (named test of another module)."""


@pytest.mark.parametrize("case", CASES, ids=[c.kind for c in CASES])
def test_bad_input_exits_2_names_what_is_wrong_and_writes_nothing(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    for name, text in case.files.items():
        (tmp_path / name).write_text(text)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    if "MLFLOW_TRACKING_URI" not in case.env:
        # port 0 is refused: a case that reached MLflow would fail loudly, never touch the real server
        monkeypatch.setenv("ISOSWEEP_MLFLOW_PORT", case.env.get("ISOSWEEP_MLFLOW_PORT", "0"))
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in shlex.split(case.command)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("isosweep: configuration error: "), err
    for words in case.says:
        assert words in err, f"{case.kind}: {words!r} not in {err!r}"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(case.files), "something was written"


def guide_table() -> list[tuple[str, str]]:
    """The (kind, test) rows of the bad-input table the user guide shows (the page of GUIDE that holds it)."""
    for page in GUIDE:
        lines = page.read_text().splitlines()
        if TABLE_HEAD in lines:
            table = []
            for line in lines[lines.index(TABLE_HEAD):]:
                if not line.startswith("| "):
                    break
                table.append(line)
            rows = [line.split("|")[1:-1] for line in table if "---" not in line]
            return [(cells[0].strip(), cells[-1].strip().strip("`")) for cells in rows[1:]]
    raise AssertionError(f"no page of {[str(p.relative_to(ROOT)) for p in GUIDE]} shows the table {TABLE_HEAD!r}")


def test_the_guide_table_is_these_cases():
    rows = guide_table()
    here = "tests/faults/test_bad_input.py"
    assert [kind for kind, _ in rows] == [c.kind for c in CASES] + list(ELSEWHERE)
    assert all(test == here for _, test in rows[:len(CASES)])
    assert [test for _, test in rows[len(CASES):]] == list(ELSEWHERE.values())
    for test in ELSEWHERE.values():  # each named test exists
        path, name = test.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.M), test
    assert len(rows) >= 30
