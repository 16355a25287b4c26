"""Every ``isosweep.<...>`` a docstring names exists: a module, or a name defined in one.

A docstring is read from the source with ``ast`` (module, class, function and attribute docstrings: every
string that stands alone as a statement), and so is what it names: the longest prefix that is a module is
found with ``importlib.machinery.PathFinder.find_spec`` on the package's own folders (no module, not even a
package's ``__init__``, is executed), and each remaining part must be defined at the top of that module (a
function, a class, an assignment, an import) or, after a class, in the class's body. A name inside a Sphinx
role counts the same, with or without its leading ``~``. MLflow tag keys (the ``isosweep.*`` strings of
``isosweep.track.tags``) share the prefix and are not references.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "isosweep"
NAME = re.compile(r"(?<![\w.])isosweep(?:\.[A-Za-z_]\w*)+")


def docstrings(path: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every string in ``path`` that stands alone as a statement."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return sorted((node.lineno, node.value.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                  and isinstance(node.value.value, str))


def named(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every ``isosweep.<...>`` in ``path``'s docstrings."""
    return [(line + text.count("\n", 0, match.start()), match.group())
            for line, text in docstrings(path) for match in NAME.finditer(text)]


def tag_keys(package: Path) -> tuple[set[str], tuple[str, ...]]:
    """The MLflow tag keys of ``track/tags.py``: whole keys, and the prefixes of key families (ending in ``_``)."""
    tree = ast.parse((package / "track" / "tags.py").read_text())
    keys = {node.value.value for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            and node.value.value.startswith("isosweep.")}
    return keys, tuple(key for key in keys if key.endswith("_"))


def find_module(parts: list[str], package: Path) -> tuple[int, ModuleSpec | None]:
    """How many leading ``parts`` name a module under ``package`` (a folder named ``isosweep``), and its spec."""
    spec, found = None, 0
    locations = [str(package.parent)]
    for i in range(1, len(parts) + 1):
        if locations is None:  # a plain module has no submodules
            break
        nxt = PathFinder.find_spec(".".join(parts[:i]), locations)
        if nxt is None:
            break
        spec, found, locations = nxt, i, nxt.submodule_search_locations
    return found, spec


def defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body binds, each with the statement binding it (``if``/``try`` blocks included)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names[leaf.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = node
        elif isinstance(node, (ast.If, ast.Try)):
            for block in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", [])),
                          getattr(node, "finalbody", [])):
                names.update(defined(block))
    return names


def problem(name: str, package: Path = PACKAGE) -> str | None:
    """Why ``name`` does not resolve, or None when it does."""
    parts = name.split(".")
    found, spec = find_module(parts, package)
    if spec is None:
        return f"no module {parts[0]}"
    body = ast.parse(Path(spec.origin).read_text()).body
    for i, part in enumerate(parts[found:], start=found):
        names = defined(body)
        if part not in names:
            where = ".".join(parts[:i])
            if i == found and spec.submodule_search_locations is not None:
                return f"no module {where}.{part}, and the package {where} defines no {part!r}"
            return f"{where} defines no {part!r}"
        node = names[part]
        if isinstance(node, ast.ClassDef):
            body = node.body
        elif i + 1 < len(parts):
            return None  # a function's or a value's attributes: beyond what the source says
    return None


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_dotted_names_in_docstrings_resolve(path: Path):
    keys, families = tag_keys(PACKAGE)
    stale = [f"line {line}: {name}: {why}" for line, name in named(path)
             if name not in keys and not name.startswith(families) and (why := problem(name))]
    assert not stale, f"{path.relative_to(PACKAGE.parent)} names what does not exist: {stale}"


def test_the_resolver_tells_real_names_from_stale_ones():
    assert problem("isosweep") is None
    assert problem("isosweep.report.frontier") is None
    assert problem("isosweep.report.frontier.fit_sigmoid") is None
    assert problem("isosweep.report.frontier.SigmoidFit.predict") is None  # a class member
    assert problem("isosweep.experiments.replay.simulator.Study") is None  # under a package that imports torch
    assert problem("isosweep.tasks.ALPHABET") is None  # a package re-exporting a name
    assert "no module isosweep.grpo" in problem("isosweep.grpo")
    assert problem("isosweep.algo.grpo.nothing") == "isosweep.algo.grpo defines no 'nothing'"
    assert problem("isosweep.hpo.space.Param.nothing") == "isosweep.hpo.space.Param defines no 'nothing'"
    assert {name for _, name in named(Path(__file__))} >= {"isosweep.track.tags"}  # this module's own docstring
    keys, families = tag_keys(PACKAGE)
    assert "isosweep.sweep_id" in keys and "isosweep.best_mean_at_4".startswith(families)


def test_resolving_a_name_runs_none_of_the_package():
    """Not even a package's ``__init__``: ``isosweep.experiments.replay``'s imports torch and BoTorch."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_docstrings as T; "
            "assert T.problem('isosweep.experiments.replay.simulator.Study') is None; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('isosweep', 'torch', 'botorch')))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_the_check_fails_on_a_planted_stale_reference(tmp_path):
    """Docstrings as they were before their modules moved (``isosweep.grpo``, ``isosweep.weight_sync``), in roles
    with and without ``~``, and in a class's and an attribute's docstring."""
    copy = tmp_path / "isosweep"
    (copy / "algo").mkdir(parents=True)
    (copy / "__init__.py").write_text("")
    (copy / "algo" / "__init__.py").write_text("")
    (copy / "algo" / "grpo.py").write_text("def ppo_clip_loss():\n    pass\n")
    (copy / "algo" / "correction.py").write_text(
        '"""Enters :func:`isosweep.grpo.ppo_clip_loss`, not :func:`~isosweep.algo.grpo.ppo_clip_loss`."""\n\n\n'
        'class Engine:\n    """Synced by :class:`~isosweep.weight_sync.NcclWeightSender`."""\n\n\n'
        'CAP = 2.0\n"""See isosweep.algo.grpo.ppo_clip_loss and isosweep.vllm_engine."""\n')
    found = named(copy / "algo" / "correction.py")
    assert found == [(1, "isosweep.grpo.ppo_clip_loss"), (1, "isosweep.algo.grpo.ppo_clip_loss"),
                     (5, "isosweep.weight_sync.NcclWeightSender"), (9, "isosweep.algo.grpo.ppo_clip_loss"),
                     (9, "isosweep.vllm_engine")]
    stale = [name for _, name in found if problem(name, copy)]
    assert stale == ["isosweep.grpo.ppo_clip_loss", "isosweep.weight_sync.NcclWeightSender", "isosweep.vllm_engine"]


DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_docstrings_state_contracts_not_dated_findings(path: Path):
    """What was measured, and when, lives in dashboards/ (FINDINGS.md, a study's NOTES.md); a docstring says what
    the code guarantees, which has no date."""
    dated = [(line, m.group(0)) for line, text in docstrings(path) for m in DATE.finditer(text)]
    assert not dated, f"{path}: dated text in docstrings (move it to dashboards/): {dated}"
