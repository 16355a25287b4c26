"""Easy and hard problem sets from a base model's measured pass rates."""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest
import torch
from scipy import stats
from transformers import AutoModelForCausalLM, AutoTokenizer

from isosweep.models import problemsets
from isosweep.models.problemsets import level_pass_rates, probe_pass_rates, rate_prior, select, zero_signal
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


def test_the_rate_prior_recovers_a_beta_behind_noisy_probes():
    # rates p ~ Beta(1.9, 7.9), each probed with 8 samples: the method of moments, with the binomial noise taken
    # out, finds the Beta's mean and concentration back (within 10% over 20,000 problems)
    rng = np.random.default_rng(0)
    p = rng.beta(1.9, 7.9, size=20_000)
    a, b = rate_prior(list(rng.binomial(8, p) / 8), samples=8)
    assert abs(a / (a + b) - 1.9 / 9.8) < 0.01
    assert abs((a + b) / 9.8 - 1) < 0.1
    assert rate_prior([0.5, 0.5], samples=1)[0] > 0  # degenerate input still gives a proper prior


@pytest.mark.parametrize(("k", "m", "n"), [(0, 8, 4), (1, 8, 16), (3, 128, 8), (120, 128, 2)])
def test_zero_signal_is_the_posterior_expectation(k, m, n):
    # against a numerical integral of ((1 - p)^n + p^n) over the Beta(a + k, b + m - k) posterior
    a, b = 1.9, 7.9
    grid = np.linspace(0, 1, 200_001)[1:-1]
    density = stats.beta.pdf(grid, a + k, b + m - k)
    reference = np.trapezoid(((1 - grid) ** n + grid**n) * density, grid)
    expected, sd = zero_signal([(k, m)], n, (a, b))
    assert expected == pytest.approx(reference, abs=1e-6)
    assert sd == pytest.approx(math.sqrt(expected * (1 - expected)))


def test_zero_signal_predicts_a_batch_selected_on_its_own_probe():
    # problems drawn from a Beta, probed with 8 samples, the hard band (rate < 0.3) kept -- a selection on the probe
    # itself -- then groups of n = 8 sampled: the observed fraction of all-equal groups is what zero_signal
    # predicts from the probes (the plug-in (1 - k/m)^n + (k/m)^n would be far off), within 4 sd over 4,000 groups
    rng = np.random.default_rng(1)
    p = rng.beta(1.9, 7.9, size=40_000)
    k = rng.binomial(8, p)
    prior = rate_prior(list(k / 8), samples=8)
    chosen = np.flatnonzero(k / 8 < 0.3)[:4_000]
    groups = rng.binomial(8, p[chosen])
    observed = np.mean((groups == 0) | (groups == 8))
    expected, sd = zero_signal([(int(k[i]), 8) for i in chosen], 8, prior)
    assert abs(observed - expected) < 4 * sd
    plug_in = np.mean([(1 - k[i] / 8) ** 8 + (k[i] / 8) ** 8 for i in chosen])
    assert abs(plug_in - observed) > 10 * sd


def test_docstring_examples_hold():
    assert doctest.testmod(problemsets).failed == 0
