"""Warming a base model up to a stage (the width ladder's recipe), and the family's cache keys."""

from __future__ import annotations

import dataclasses
import json

import pytest

from isosweep.models import warmup


def test_the_family_keeps_its_cache_directories():
    # The stage fields joined the recipe after these models were cached (and studies were run on them):
    # adding a field must not move a family model's directory. A deliberate change bumps WARMUP_VERSION.
    names = [warmup.base_model_dir(size, "arithmetic", 0).name for size in ("tiny-0.3m", "tiny-1m", "tiny-5m")]
    assert names == ["tiny-0.3m-arithmetic-s0-22e9328cc92f", "tiny-1m-arithmetic-s0-37c0d0280c31",
                     "tiny-5m-arithmetic-s0-dbbe2d73c39f"]
    assert warmup.recipe_for("tiny-w64", "arithmetic").stage_pass is not None
    assert warmup.recipe_for("tiny-1m", "arithmetic").stage_pass is None
    with pytest.raises(ValueError, match="no warm-up recipe for task 'countdown' and size 'tiny-w64'"):
        warmup.recipe_for("tiny-w64", "countdown")


SMALL = dataclasses.replace(warmup.LADDER_RECIPES["arithmetic"], steps=40, stage_every=20, stage_problems=16,
                            probe_pool=16, probe_samples=2)


def test_a_staged_warm_up_stops_at_the_first_check_that_reaches_the_stage(tmp_path):
    lines: list[str] = []
    report = warmup.build_base_model("tiny-w64", "arithmetic", 0, tmp_path, log=lines.append,
                                     recipe=dataclasses.replace(SMALL, stage_pass=0.0))
    assert report["stage"] == {"steps": 20, "pass@1": report["stage"]["pass@1"], "target": 0.0, "level": 2,
                               "problems": 16}
    assert sum("stage pass@1" in line for line in lines) == 1
    assert json.loads((tmp_path / warmup.REPORT_FILE).read_text())["stage"]["steps"] == 20


def test_a_stage_never_reached_is_an_error_naming_it(tmp_path):
    with pytest.raises(RuntimeError, match=r"did not reach the stage \(level-2 pass@1 1.01\) within 20 steps"):
        warmup.build_base_model("tiny-w64", "arithmetic", 0, tmp_path, log=lambda _: None,
                                recipe=dataclasses.replace(SMALL, steps=20, stage_pass=1.01))
    assert not (tmp_path / warmup.REPORT_FILE).exists()
