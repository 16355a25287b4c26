"""The ``isosweep`` command: one loader for every study file, and answers that need no trial (``--dry-run``,
a bad file) without importing torch, Ray or MLflow. Bad input, kind by kind: tests/faults/test_bad_input.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    assert "proxy check: 3 configurations at tiny-5m, 1,024 rollouts" in out and "at most 50% of the study budget" in out


def test_answers_without_a_trial_import_no_heavy_library():
    code = ("import sys; from isosweep.cli import main; "
            "assert main(['sweep', 'sweeps/jfhpo.yaml', '--dry-run']) == 0; "
            "assert main(['sweep', 'sweeps/smoke.yaml', '--budget', '1']) == 2; "
            "print(sorted(m for m in ('torch', 'ray', 'mlflow', 'deepspeed', 'vllm') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
