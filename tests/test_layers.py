"""The package's layers: imports only point down, no cycles, no private names across modules.

isosweep is layered, lowest first (a module may import its own layer and the layers below it):

    tasks < algo < hpo < rollout < models < spec < track < trial < report < run < experiments < cli < docs

``hpo`` (search space, stopping rules, searchers, the study ledger) and ``track`` (MLflow) sit below
the layers that use them: ``spec`` builds an HPO study's search space, and a trial is handed its
tracker. The imports are read from the source with ``ast``, so the test needs nothing installed.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "platform" / "isosweep"
LAYERS = ("tasks", "algo", "hpo", "rollout", "models", "spec", "track", "trial", "report", "run", "experiments", "cli",
          "docs")
HEAVY = ("ray", "vllm", "mlflow", "deepspeed", "matplotlib", "datasets")
"""Third-party packages a function may import on first use (seconds to import, or a backend choice)."""
HEAVY_WITH_REASON = ("torch", "transformers")
"""Imported at the top almost everywhere; inside a function only with a reason on the line (a module that Ray
unpickles in processes that never compute, such as a Tune trial's driver and the Train controller)."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int | None:
    """The rank of ``isosweep.<layer>...`` (None for the package itself)."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 else None


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(node: ast.ImportFrom, module: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: str) -> list[tuple[str, str | None, int, bool, str]]:
    """``(imported module, imported name or None, line, inside a function, source line)`` of every import."""
    path = MODULES[module]
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    functions = [(n.lineno, n.end_lineno) for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    type_checking = [(n.lineno, n.end_lineno) for n in ast.walk(tree)
                     if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"]
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        inside = any(a <= node.lineno <= b for a, b in functions)
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, None, node.lineno, inside, lines[node.lineno - 1]))
        elif isinstance(node, ast.ImportFrom):
            target = resolve(node, module, path)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:  # `from isosweep.track import runs`: a module, not a name
                    found.append((sub, None, node.lineno, inside, lines[node.lineno - 1]))
                else:
                    found.append((target, alias.name, node.lineno, inside, lines[node.lineno - 1]))
        if any(a <= node.lineno <= b for a, b in type_checking):
            found[-len(node.names):] = [(m, n, line, inside, "TYPE_CHECKING") for m, n, line, inside, _ in
                                        found[-len(node.names):]]
    return found


def own_imports(module: str) -> list[tuple[str, str | None, int, bool, str]]:
    return [i for i in imports(module) if i[0] == "isosweep" or i[0].startswith("isosweep.")]


def test_the_layers_cover_the_package():
    assert {m.split(".")[1] for m in MODULES if m != "isosweep"} == set(LAYERS)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    rank = layer_of(module)
    up = [f"line {line}: {target}" for target, _, line, _, _ in own_imports(module)
          if rank is not None and layer_of(target) is not None and layer_of(target) > rank]
    assert not up, f"{module} imports from a higher layer: {up}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_from_other_modules(module):
    private = [f"line {line}: {target}.{name}" for target, name, line, _, _ in own_imports(module)
               if name and name.startswith("_") and target != module]
    private += [f"line {line}: {target}" for target, _, line, _, _ in own_imports(module)
                if any(part.startswith("_") and part != "__init__" for part in target.split("."))]
    assert not private, f"{module} imports private names: {private}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_lazy_imports_are_heavy_parts_with_a_reason(module):
    """An import inside a function is for a heavy optional part only (ray, vllm, mlflow, deepspeed, datasets, or a
    module of ours that needs them), and says why on its line; everything else is imported at the top."""
    bad = []
    for target, _, line, inside, text in imports(module):
        if not inside or text == "TYPE_CHECKING":
            continue
        if target.split(".")[0] in HEAVY:
            continue
        if target.split(".")[0] in HEAVY_WITH_REASON and "# reason" in text:
            continue
        if target.startswith("isosweep") and "#" in text:
            continue
        bad.append(f"line {line}: {text.strip()}")
    assert not bad, f"{module} imports inside functions without a reason: {bad}"


def test_what_a_trials_driver_and_train_controller_unpickle_loads_no_torch():
    """A sweep's Tune trial function (``run.core``) and the Train job it builds (``trial.job``) are unpickled in two
    fresh Ray worker processes per trial that only coordinate; only the Train worker imports torch, transformers and
    DeepSpeed (seconds of imports in each process, a trial's fixed cost twice over on a 2-core machine)."""
    code = ("import sys, isosweep.run.core, isosweep.trial.job, isosweep.track.runs; "
            "print(sorted(m for m in ('torch', 'transformers', 'deepspeed', 'vllm') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_no_import_cycles():
    """Module by module, an import inside a function included: a lazy import keeps a heavy part out of the light
    processes, not two modules apart (each would still need the other)."""
    graph = {m: {t for t, _, _, _, text in own_imports(m) if t in MODULES and text != "TYPE_CHECKING"}
             for m in MODULES}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [node, nxt])
                                     if nxt in stack else f"import cycle through {node} -> {nxt}")
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_the_checks_catch_what_they_guard(tmp_path, monkeypatch):
    """The checks above fail on an upward import, a private name and a cycle (planted in a copy)."""
    fake = tmp_path / "isosweep"
    (fake / "tasks").mkdir(parents=True)
    (fake / "run").mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "tasks" / "__init__.py").write_text("")
    (fake / "run" / "__init__.py").write_text("")
    (fake / "tasks" / "a.py").write_text("from isosweep.run.b import thing\n")
    (fake / "run" / "b.py").write_text("from isosweep.tasks.a import _hidden\nthing = 1\n")
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    monkeypatch.setitem(globals(), "MODULES", {module_name(p): p for p in sorted(fake.rglob("*.py"))})
    with pytest.raises(AssertionError, match="higher layer"):
        test_imports_point_down("isosweep.tasks.a")
    with pytest.raises(AssertionError, match="private names"):
        test_no_private_names_from_other_modules("isosweep.run.b")
    with pytest.raises(AssertionError, match="import cycle"):
        test_no_import_cycles()


@pytest.mark.parametrize("planted", ["from isosweep.trial.job import run_torch_trainer", "from . import job",
                                     "from .job import run_torch_trainer"])
def test_a_cycle_inside_one_package_through_a_lazy_import_is_caught(tmp_path, monkeypatch, planted):
    """``trial.job`` imports ``trial.loopback`` inside a function; in a copy of the real package whose ``loopback``
    imports ``job`` back (inside a function too, absolutely or relatively) the check names the cycle."""
    copy = tmp_path / "isosweep"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setitem(globals(), "PACKAGE", copy)
    monkeypatch.setitem(globals(), "MODULES", {module_name(p): p for p in sorted(copy.rglob("*.py"))})
    lazy = {target for target, _, _, inside, _ in own_imports("isosweep.trial.job") if inside}
    assert "isosweep.trial.loopback" in lazy  # what the planted import closes into a cycle
    test_no_import_cycles()  # the copy as it is: no cycle
    loopback = copy / "trial" / "loopback.py"
    loopback.write_text(loopback.read_text() + f"\n\ndef planted():\n    {planted}  # reason: a planted cycle\n")
    with pytest.raises(AssertionError, match="import cycle: isosweep.trial.job -> isosweep.trial.loopback -> "
                                             "isosweep.trial.job$"):
        test_no_import_cycles()
