"""Warming a base model up to a stage (the width ladder's recipe), and the family's cache keys."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from isosweep.models import warmup


def test_the_family_keeps_its_cache_directories():
    # Adding a field to the recipe must not move a family model's directory (studies name it); a deliberate
    # change bumps WARMUP_VERSION (2: built under pinned numerics), which moves every one of them.
    names = [warmup.base_model_dir(size, "arithmetic", 0).name for size in ("tiny-0.3m", "tiny-1m", "tiny-5m")]
    assert names == ["tiny-0.3m-arithmetic-s0-dd895402d7e6", "tiny-1m-arithmetic-s0-e4001edad488",
                     "tiny-5m-arithmetic-s0-af1a2909d311"]
    assert warmup.recipe_for("tiny-w64", "arithmetic").stage_pass is not None
    assert warmup.recipe_for("tiny-1m", "arithmetic").stage_pass is None
    with pytest.raises(ValueError, match="no warm-up recipe for task 'countdown' and size 'tiny-w64'"):
        warmup.recipe_for("tiny-w64", "countdown")


SMALL = dataclasses.replace(warmup.LADDER_RECIPES["arithmetic"], steps=40, stage_every=20, stage_problems=16,
                            batch=32, probe_pool=16, probe_samples=2)


def test_a_staged_warm_up_stops_at_the_first_check_that_reaches_the_stage(tmp_path):
    lines: list[str] = []
    report = warmup.build_base_model("tiny-w64", "arithmetic", 0, tmp_path, log=lines.append,
                                     recipe=dataclasses.replace(SMALL, stage_pass=0.0))
    assert report["stage"] == {"steps": 20, "pass@1": report["stage"]["pass@1"], "target": 0.0, "level": 2,
                               "problems": 16, "checked_every": 20}
    assert sum("stage pass@1" in line for line in lines) == 1
    assert json.loads((tmp_path / warmup.REPORT_FILE).read_text())["stage"]["steps"] == 20


def test_a_stage_never_reached_is_an_error_naming_it(tmp_path):
    with pytest.raises(RuntimeError, match=r"did not reach the stage \(level-2 pass@1 1.01\) within 20 steps"):
        warmup.build_base_model("tiny-w64", "arithmetic", 0, tmp_path, log=lambda _: None,
                                recipe=dataclasses.replace(SMALL, steps=20, stage_pass=1.01))
    assert not (tmp_path / warmup.REPORT_FILE).exists()


def test_a_check_that_overshoots_the_stage_steps_back_and_lands_where_a_plain_run_to_that_step_does(
        tmp_path, monkeypatch):
    # Learning the task "clicks" (tiny-w128: 0.376 -> 0.517 in 10 steps). The measurements are scripted here,
    # in check order, so the click happens on cue; the training and the rewind are real.
    script = iter([0.1, 0.2, 0.9, 0.3, 0.42])  # steps 10, 20, 30 (overshoot: back to 20), then 21, 22
    monkeypatch.setattr(warmup, "stage_pass_rate", lambda *args: next(script))
    lines: list[str] = []
    recipe = dataclasses.replace(SMALL, stage_pass=0.4, stage_every=10, stage_tolerance=0.05)
    rewound = warmup.build_base_model("tiny-w64", "arithmetic", 0, tmp_path / "a", log=lines.append, recipe=recipe)
    assert report_stage(rewound) == (22, 0.42, 1)
    assert any("overshoots the stage by more than 0.05: back to step 20" in line for line in lines)

    monkeypatch.setattr(warmup, "stage_pass_rate", lambda *args: 0.42)
    plain = warmup.build_base_model("tiny-w64", "arithmetic", 0, tmp_path / "b", log=lambda _: None,
                                    recipe=dataclasses.replace(recipe, stage_every=22))
    assert report_stage(plain) == (22, 0.42, 22)
    a, b = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


PLAIN = dataclasses.replace(warmup.RECIPES["arithmetic"], steps=30, batch=32, probe_pool=16, probe_samples=2)


def test_a_pinned_build_is_the_same_bits_whatever_kernels_the_cpu_offers(tmp_path, monkeypatch):
    # The warm-up is chaotic (unpinned, tiny-1m's level-2 pass@1 was 0.315 with this CPU's AVX-512 kernels and
    # 0.591 with its AVX2 ones), so a base model is built under pinned numerics in a fresh interpreter. A second
    # build whose parent asks for AVX2 kernels (unpinned they give other bits than this CPU's AVX-512 ones after 30
    # steps), an MKL held to AVX2 and one thread, as another machine might, must give the same weights, probe and
    # report fingerprint.
    lines: list[str] = []
    first = warmup.build_pinned("tiny-0.3m", "arithmetic", 0, tmp_path / "a", log=lines.append, recipe=PLAIN)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    second = warmup.build_pinned("tiny-0.3m", "arithmetic", 0, tmp_path / "b", log=lambda _: None, recipe=PLAIN)
    assert first["numerics"]["cpu_capability"] == second["numerics"]["cpu_capability"] == "DEFAULT"
    assert first["numerics"]["threads"] == 2 and first["numerics"]["MKL_CBWR"] == "COMPATIBLE,STRICT"
    assert first["weights_sha256"] == second["weights_sha256"]
    a, b = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)
    assert (tmp_path / "a" / warmup.PROBE_FILE).read_text() == (tmp_path / "b" / warmup.PROBE_FILE).read_text()
    assert any(line.startswith("[warm-up tiny-0.3m/arithmetic] step 1/30") for line in lines)


def test_a_failed_pinned_build_says_why(tmp_path):
    with pytest.raises(RuntimeError, match=r"(?s)building base model tiny-0.3m on nosuchtask .* failed, exit 1:.*"
                                           r"nosuchtask"):
        warmup.build_pinned("tiny-0.3m", "nosuchtask", 0, tmp_path / "a", log=lambda _: None, recipe=PLAIN)


def report_stage(report: dict) -> tuple:
    return report["stage"]["steps"], report["stage"]["pass@1"], report["stage"]["checked_every"]


def test_the_default_base_model_is_the_pinned_build_the_readme_names(base_model):
    # The pinned warm-up gives these bits on any x86-64 CPU with this torch (a failure on another machine means
    # the pinning missed a kernel that CPU chooses differently: the studies' base model would differ there).
    report = json.loads((base_model / warmup.REPORT_FILE).read_text())
    assert report["numerics"]["cpu_capability"] == "DEFAULT" and report["warmup_version"] == "2"
    assert report["weights_sha256"].startswith("68d3b32749ad") and report["eval_pass@1"]["2"] == 0.3403
    out = subprocess.run([sys.executable, "-m", "isosweep.cli", "models", "build", "--sizes", "tiny-1m"],
                         capture_output=True, text=True, check=True).stdout
    assert "weights 68d3b32749ad" in out and str(base_model) in out
