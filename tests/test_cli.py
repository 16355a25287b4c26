"""The ``isosweep`` command: one loader for every study file, errors with exit status 2, and answers
that need no trial (``--dry-run``, a bad file) without importing torch, Ray or MLflow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from isosweep.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_a_grid_dry_run_prints_the_plan(capsys):
    assert main(["sweep", str(ROOT / "sweeps" / "smoke.yaml"), "--budget", "2e3", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "n4-Bp8" in out and "n8-Bp8" in out


def test_an_hpo_dry_run_is_recognised_by_its_study_key(capsys):
    assert main(["sweep", str(ROOT / "sweeps" / "jfhpo.yaml"), "--dry-run", "--study-budget", "4x"]) == 0
    out = capsys.readouterr().out
    assert "jfhpo search over" in out and "4.00 full-fidelity trials" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["sweep", "no-such-file.yaml"], "no-such-file.yaml: no such file"),
    (["sweep", "sweeps/smoke.yaml", "--study-budget", "4x"], "is for HPO studies (study: hpo), not grid sweeps"),
    (["sweep", "sweeps/smoke.yaml", "--budget", "abc"], "budget 'abc' is not a number"),
    (["trial", "sweeps/trials/easy.yaml", "--set", "budget=100", "--out", "/nonexistent/x"],
     "budget C = 100 rollouts is smaller than one step"),
    (["submit", "sweeps/smoke.yaml"], "submit needs --cluster"),
])
def test_bad_input_exits_2_and_says_why(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("isosweep: configuration error: ") and message in err


def test_answers_without_a_trial_import_no_heavy_library():
    code = ("import sys; from isosweep.cli import main; "
            "assert main(['sweep', 'sweeps/jfhpo.yaml', '--dry-run']) == 0; "
            "assert main(['sweep', 'sweeps/smoke.yaml', '--budget', '1']) == 2; "
            "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'deepspeed', 'vllm') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
