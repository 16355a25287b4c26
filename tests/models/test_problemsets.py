"""Easy and hard problem sets from a base model's measured pass rates."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from isosweep.models.problemsets import level_pass_rates, probe_pass_rates, select
from isosweep.rollout.hf import HFEngine
from isosweep.spec.trial import DIFFICULTY_BANDS
from isosweep.tasks import get_task


def row(prompt: str, rate: float) -> dict:
    return {"prompt": prompt, "answer": "1", "numbers": [], "rate": rate}


PROBE = {"train": {"2": [row("a", 0.0), row("b", 0.25), row("c", 0.3), row("d", 0.9), row("e", 1.0)]},
         "eval": {"2": [row("f", 0.5), row("g", 0.125)], "3": []}}


def test_the_bands_split_every_problem_once():
    easy = [p.prompt for p in select(PROBE, "arithmetic", "train", [2], DIFFICULTY_BANDS["easy"])]
    hard = [p.prompt for p in select(PROBE, "arithmetic", "train", [2], DIFFICULTY_BANDS["hard"])]
    assert easy == ["c", "d", "e"]  # 0.3 opens the easy band; a problem always solved is easy, not dropped
    assert hard == ["a", "b"]
    assert select(PROBE, "arithmetic", "train", [3], DIFFICULTY_BANDS["easy"]) == []  # a level not probed
    every = [p.prompt for p in select(PROBE, "arithmetic", "train", [2], DIFFICULTY_BANDS["all"])]
    assert every == ["a", "b", "c", "d", "e"]  # ``all``: every probed problem, whatever its rate


def test_level_pass_rates_average_each_level():
    assert level_pass_rates(PROBE, "eval") == {"2": 0.3125}
    assert level_pass_rates(PROBE, "train") == {"2": 0.49}


def test_a_probe_measures_rates_on_disjoint_train_and_eval_pools(base_model):
    model = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    engine = HFEngine(model, AutoTokenizer.from_pretrained(base_model), max_new_tokens=8, temperature=1.0)
    probe = probe_pass_rates(engine, get_task("arithmetic"), [2], pool=24, samples=4, seed=0)
    train, held_out = probe["train"]["2"], probe["eval"]["2"]
    assert len(train) == len(held_out) == 24
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert all(r["rate"] in (0.0, 0.25, 0.5, 0.75, 1.0) for r in train + held_out)
    assert 0.0 < level_pass_rates(probe)["2"] < 1.0  # the base model is right some of the time, not always
    assert probe == probe_pass_rates(engine, get_task("arithmetic"), [2], pool=24, samples=4, seed=0)  # seeded
