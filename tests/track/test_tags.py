"""The MLflow tag names: one constant each in ``isosweep.track.tags``, spelled nowhere else in the package."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from isosweep.track import tags

PACKAGE = Path(__file__).resolve().parents[2] / "platform" / "isosweep"
TAGS_MODULE = PACKAGE / "track" / "tags.py"
NAMES = {name: value for name, value in vars(tags).items() if name.endswith("_TAG")}
"""Every tag name: the module's ``*_TAG`` constants."""
PREFIXES = {name: value for name, value in vars(tags).items() if name.endswith("_PREFIX")}
"""The start of a family of tag names (a trial's ``isosweep.best_<metric>``)."""


def spelled(value: str, prefix: bool = False) -> re.Pattern:
    """``value`` as a whole name inside a string: not a part of a longer name (``isosweep.trial`` in
    ``isosweep.trial.job``, a module) unless ``prefix``."""
    return re.compile(rf"(?<![\w.]){re.escape(value)}" + ("" if prefix else r"(?![\w]|\.\w)"))


PATTERNS = [spelled(v) for v in NAMES.values()] + [spelled(v, prefix=True) for v in PREFIXES.values()]


def tag_literals(source: str) -> list[str]:
    """``line: string`` of each string constant of ``source`` (f-strings' parts included; docstrings, which say
    what a tag means, left out) that spells a tag name."""
    tree = ast.parse(source)
    docstrings = {id(node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    found = [node for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
             and any(p.search(node.value) for p in PATTERNS)]
    return [f"{node.lineno}: {node.value!r}" for node in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def test_the_constants_are_distinct_tag_names():
    assert len(NAMES) >= 40
    assert len(set(NAMES.values())) == len(NAMES), "two constants name one tag"
    assert all(re.fullmatch(r"(isosweep|mlflow)\.[A-Za-z_.]+", v) for v in NAMES.values()), NAMES
    assert tags.best_value_tag("mean_at_4") == "isosweep.best_mean_at_4"


@pytest.mark.parametrize("path", sorted(p for p in PACKAGE.rglob("*.py") if p != TAGS_MODULE),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_tag_names_are_spelled_only_in_the_tags_module(path):
    """A tag written or searched under a literal name elsewhere would drift from the constant (and from the runs
    already logged under it): every module names tags by the constants of ``isosweep.track.tags``."""
    found = tag_literals(path.read_text())
    assert not found, f"{path.relative_to(PACKAGE)} spells tag names; use isosweep.track.tags: {found}"


def test_the_check_catches_a_literal_tag_and_leaves_modules_and_docstrings():
    """Planted: a tag in a dict, in a search filter and as an f-string's head are caught; a module's dotted path
    (``isosweep.trial.job``) and a docstring naming a tag are not."""
    source = ('"""Runs are tagged ``isosweep.sweep_id``."""\n'
              'TAGS = {"isosweep.kind": "sweep"}\n'
              'FILTER = "tags.`isosweep.study` != \'hpo\'"\n'
              'def best(name):\n    """The ``isosweep.best_`` tag."""\n    return f"isosweep.best_{name}"\n'
              'MODULES = ["isosweep.trial.job", "isosweep.cli", "mlflow.entities"]\n'
              'PARENT = {"mlflow.parentRunId": "x"}\n')
    found = tag_literals(source)
    assert [line.split(":")[0] for line in found] == ["2", "3", "6", "8"], found


def test_the_tags_module_imports_nothing_heavy():
    """Plain constants: importing them loads no mlflow (nor anything else of isosweep)."""
    code = "import sys, isosweep.track.tags; print(sorted(m for m in sys.modules if m.startswith(('mlflow', 'ray'))))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(PACKAGE.parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_mlflow_page_names_every_tag():
    """``platform/docs/mlflow.md`` is where a user looks a tag up: each constant's name is on it."""
    page = (PACKAGE.parent / "docs" / "mlflow.md").read_text()
    assert [name for name, value in {**NAMES, **PREFIXES}.items() if f"`{value}" not in page] == []
