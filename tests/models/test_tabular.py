"""The tabular control: a planted table that the trial loop's own sampling, log-probs and GRPO loss train exactly as
the independent simulation (``isosweep.experiments.tabular_truth``) says."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from isosweep.algo.grpo import group_advantages, grpo_loss
from isosweep.experiments import tabular_truth as truth
from isosweep.models.problemsets import probe_pass_rates
from isosweep.models.tabular import DIGIT_POSITIONS, TabularConfig, TabularPolicy
from isosweep.models.tokenizer import char_tokenizer
from isosweep.rollout.hf import HFEngine
from isosweep.tasks import get_task
from isosweep.trial.loop import pack
from isosweep.trial.step import token_stats

TASK = get_task("codes")
CODES = [f.code for f in TASK.families]
EPSILONS = [f.epsilon for f in TASK.families]


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


def planted(tokenizer) -> TabularPolicy:
    config = TabularConfig(families=len(CODES), vocab_size=len(tokenizer),
                           digit_ids=tokenizer.convert_tokens_to_ids(list("0123456789")),
                           marker_id=tokenizer.convert_tokens_to_ids(">"), eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id)
    model = TabularPolicy(config)
    model.plant(CODES, EPSILONS)
    return model


def setup() -> truth.TabularSetup:
    return truth.TabularSetup(codes=[[int(d) for d in c] for c in CODES], eps=EPSILONS, train=list(range(48)),
                              eval_weights=np.ones(48))


def test_the_planted_table_passes_each_family_at_its_epsilon(tokenizer):
    model = planted(tokenizer)
    assert torch.allclose(model.pass_rates(CODES), torch.tensor(EPSILONS, dtype=torch.float64), rtol=1e-5)
    theta, phi = truth.planted_params(setup())
    assert np.allclose(truth.pass_rates(setup(), theta, phi), EPSILONS)


def test_samples_are_three_digits_then_eos_and_their_logprobs_are_the_trainers(tokenizer):
    model = planted(tokenizer)
    engine = HFEngine(model, tokenizer, max_new_tokens=8, temperature=1.0)
    prompts = [f"{f:02d}:{i:03d}>" for f, i in ((0, 5), (4, 917), (47, 0))]
    rollouts = engine.generate(prompts, 32, seed=3)
    digits = set(tokenizer.convert_tokens_to_ids(list("0123456789")))
    for ids in rollouts.completion_ids:
        assert len(ids) == DIGIT_POSITIONS + 1 and set(ids[:-1]) <= digits and ids[-1] == tokenizer.eos_token_id
    # what the trainer computes for the same sequences is what the sampler drew with: the step is on-policy
    batch = pack(rollouts, tokenizer.pad_token_id)
    logp, _ = token_stats(model, batch["ids"], batch["attention"], 1.0, 1024)
    assert torch.allclose(logp * batch["mask"], batch["rollout_logp"], atol=1e-6)
    # the end of the completion is certain (log-prob 0); a digit's is the softmax of its table row
    ends = batch["mask"].sum(dim=1).long() - 1
    assert torch.all(batch["rollout_logp"][torch.arange(len(ends)), batch["mask"].argmax(dim=1) + ends] == 0)


def test_the_probe_recovers_the_planted_rates(tokenizer):
    # 128 samples per problem, as the codes recipe probes: each family's mean probed rate is within 4.5 binomial
    # standard errors of its epsilon, and the probed rates against the planted ones have slope 1 +- 0.05
    engine = HFEngine(planted(tokenizer), tokenizer, max_new_tokens=8, temperature=1.0)
    probe = probe_pass_rates(engine, TASK, [1], pool=480, samples=128, seed=0)
    by_family: dict[int, list[float]] = {}
    for row in probe["train"]["1"] + probe["eval"]["1"]:
        by_family.setdefault(int(row["prompt"][:2]), []).append(row["rate"])
        assert row["samples"] == 128
    planted_rate = np.array(EPSILONS)
    probed = np.array([np.mean(by_family[f]) for f in range(48)])
    draws = np.array([128 * len(by_family[f]) for f in range(48)])
    z = (probed - planted_rate) / np.sqrt(planted_rate * (1 - planted_rate) / draws)
    assert np.abs(z).max() < 4.5
    assert abs(np.polyfit(planted_rate, probed, 1)[0] - 1) < 0.05


def test_a_saved_table_loads_back_through_the_auto_class(tokenizer, tmp_path):
    model = planted(tokenizer)
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight) * 0.1)
    model.save_pretrained(tmp_path, safe_serialization=True)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, use_safetensors=True)
    assert isinstance(loaded, TabularPolicy)
    assert torch.allclose(loaded.pass_rates(CODES), model.pass_rates(CODES))
    ids = torch.tensor([tokenizer("12:345>901", add_special_tokens=False)["input_ids"]])
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_a_prompt_that_is_not_a_codes_prompt_is_refused(tokenizer):
    model = planted(tokenizer)
    for text in ("12+34=", "99:000>", "12:345"):
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with pytest.raises(ValueError, match="reads codes prompts"):
            model(input_ids=ids)


@pytest.mark.parametrize("scale", [True, False])
def test_the_trial_losss_gradient_is_the_simulations(tokenizer, scale):
    # the same samples through the platform's sampler, advantages, token log-probs and GRPO loss, and through the
    # simulation's formula: the table's gradient is the same (theta per family and position, phi shared)
    model = planted(tokenizer)
    with torch.no_grad():  # away from the planted start, so that phi and every row matter
        model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(0)))
    families, n = [4, 11, 11, 30, 47, 0], 8
    engine = HFEngine(model, tokenizer, max_new_tokens=8, temperature=1.0)
    rollouts = engine.generate([f"{f:02d}:{100 + i:03d}>" for i, f in enumerate(families)], n, seed=1)
    rewards = torch.tensor([float(text == CODES[families[i // n]]) for i, text in enumerate(rollouts.texts)])
    advantages, _ = group_advantages(rewards.view(len(families), n), scale)
    batch = pack(rollouts, tokenizer.pad_token_id)
    model.train()
    logp, _ = token_stats(model, batch["ids"], batch["attention"], 1.0, 1024)
    loss, _ = grpo_loss(logp, batch["rollout_logp"], advantages.reshape(-1), batch["mask"], 0.2, 0.28)
    loss.backward()
    grad = model.lm_head.weight.grad
    digit_ids = model.config.digit_ids

    weight = model.lm_head.weight.detach().double()[digit_ids]  # (10, width)
    theta = weight[:, :48 * 3].T.reshape(48, 3, 10).numpy()
    phi = weight[:, 48 * 3:48 * 3 + 3].T.numpy()
    fams = np.array(families)
    probs = np.exp(truth.log_softmax(theta[fams] + phi))[None]
    digits = np.array([[int(c) for c in text] for text in rollouts.texts]).reshape(1, len(families), n, 3)
    adv = truth.group_advantages(rewards.view(1, len(families), n).double().numpy(), scale)
    g_theta, g_phi = truth.policy_gradient(probs, fams[None], digits, adv, 48)
    platform_theta = grad[digit_ids][:, :48 * 3].T.reshape(48, 3, 10).double().numpy()
    platform_phi = grad[digit_ids][:, 48 * 3:48 * 3 + 3].T.double().numpy()
    assert np.abs(g_theta[0]).max() > 1e-3
    assert np.allclose(platform_theta, g_theta[0], atol=1e-6)
    assert np.allclose(platform_phi, g_phi[0], atol=1e-6)
    # no other entry of the table moves: impossible tokens and the certain end get no gradient
    others = [i for i in range(grad.shape[0]) if i not in digit_ids]
    assert float(grad[others].abs().max()) == 0.0
    assert float(grad[:, 48 * 3 + 3].abs().max()) == 0.0
    assert math.isfinite(float(loss.detach()))
