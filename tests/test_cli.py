"""The ``isosweep`` command: one loader for every study file, and answers that need no trial (``--dry-run``,
a bad file) without importing torch, Ray or MLflow; a help that explains itself; and the Makefile's targets (help,
variables they need, clean). Bad input, kind by kind: tests/faults/test_bad_input.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from isosweep import cli
from isosweep.cli import build_parser, main

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


EVERYDAY = ["sweep", "ui", "recommend", "report", "trial", "submit", "frontier"]
RESEARCH = ["models", "ais-study", "calibrate", "codes-pilot", "tabular-truth", "validate-stats", "adaptive-replay", "bench", "hpo-bench", "hpo-table"]


def help_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    return capsys.readouterr().out


def test_help_lists_the_everyday_commands_first_then_the_research_tools_one_line_each(capsys):
    out = help_of(["--help"], capsys)
    everyday, research = out.index("everyday commands:"), out.index("research tools")
    listed = [line.split()[0] for line in out[everyday:].splitlines()[1:] if line.startswith("  ") and line.split()]
    assert listed[:len(EVERYDAY)] == EVERYDAY and listed[len(EVERYDAY):len(EVERYDAY) + len(RESEARCH)] == RESEARCH
    assert everyday < research < out.index("examples:") and "usage: isosweep [-h] [--version] <command>" in out
    for name in EVERYDAY + RESEARCH:  # one line each, with words after the name
        (line,) = [line for line in out.splitlines() if line.startswith(f"  {name} ")]
        assert len(line.split()) > 3
    assert "``" not in out


def test_every_command_and_option_explains_itself_without_markup(capsys):
    with pytest.raises(SystemExit):
        main(["nosuch"])
    choices = re.search(r"choose from (.*)\)", capsys.readouterr().err).group(1)
    assert sorted(re.findall(r"'([a-z-]+)'", choices)) == sorted(EVERYDAY + RESEARCH)
    for argv in [[name] for name in EVERYDAY + RESEARCH] + [["models", "build"]]:
        text = help_of([*argv, "--help"], capsys)
        assert "``" not in text and f"usage: isosweep {' '.join(argv)}" in text, argv
        lines = text.splitlines()
        for i, line in enumerate(lines):  # an option's help on its own line, or on the next, indented deeper
            if line.startswith("  -") and not re.search(r"\S {2,}\S", line.strip()):
                assert lines[i + 1].startswith(" " * 8) and lines[i + 1].strip(), (argv, line)


def test_version_is_the_package_s_or_else_the_source_tree_s(capsys, monkeypatch):
    pyproject = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert help_of(["--version"], capsys).strip() == f"isosweep {cli.version()}"

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", missing)  # run from the source tree, PYTHONPATH=platform
    assert cli.version() == pyproject


@pytest.mark.parametrize("argv", [
    ["sweep", "sweeps/smoke.yaml", "--dashboards", "dashboards", "--no-dashboards"],
    ["submit", "sweeps/smoke.yaml", "--cluster", "clusters/aws-h200.yaml", "--address", "http://127.0.0.1:8265"],
    ["frontier", "smoke", "--runs", "runs/sweeps", "--out", "elsewhere"],
])
def test_options_that_exclude_each_other_are_refused_together(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_a_sweep_writes_into_dashboards_only_when_told():
    parser = build_parser()
    assert parser.parse_args(["sweep", "sweeps/smoke.yaml"]).dashboards is None
    assert parser.parse_args(["sweep", "sweeps/smoke.yaml", "--dashboards", "dashboards"]).dashboards == "dashboards"
    assert "--dashboards" not in make("-n", "sweep").stdout
    assert "--dashboards dashboards" in make("-n", "sweep", "DASHBOARDS=dashboards").stdout


# --- the Makefile: the other half of the command line -----------------------------------------------------

def make(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("BUDGET", "SWEEP_ID", "CLUSTER", "ADDRESS", "DASHBOARDS",
                                                            "ALL", "MAKEFLAGS")}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def test_make_alone_lists_every_target_with_one_line():
    done = make()
    assert done.returncode == 0, done.stderr
    phony = re.search(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert set(phony) <= set(lines) and {"gpu-check", "gpu-wheels", "test"} <= set(lines)
    assert all(len(line.split()) > 2 for line in lines.values())
    assert list(lines).index("sweep") < list(lines).index("ais-study")


@pytest.mark.parametrize("target, says", [
    ("frontier", "make frontier: set SWEEP_ID"),
    ("submit", "make submit: set CLUSTER"),
    ("recommend", "make recommend: set BUDGET"),
    ("cluster-up", "make cluster-up: set CLUSTER"),
])
def test_a_target_without_the_variable_it_needs_says_which_before_installing_anything(target, says):
    done = make(target)
    assert done.returncode == 2 and done.stdout.startswith(says), done.stdout + done.stderr
    assert "pip install" not in done.stdout


def test_make_clean_keeps_the_base_models_unless_asked():
    kept = make("-n", "clean").stdout
    assert "keeping .mlflow/" in kept and "except the base models in .cache/isosweep" in kept
    assert "rm -rf .cache\n" not in kept and "! -name isosweep" in kept
    assert "rm -rf .cache\n" in make("-n", "clean", "ALL=1").stdout
