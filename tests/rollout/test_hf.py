"""The HF rollout engine: post-temperature log-probs that the trainer recomputes, seeded sampling, versions."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from isosweep.algo.grpo import token_logprobs
from isosweep.models.family import qwen2_config
from isosweep.models.tokenizer import char_tokenizer
from isosweep.rollout.hf import HFEngine
from isosweep.trial.loop import pack


@pytest.fixture(scope="module")
def engine():
    tok = char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config("tiny-0.3m", len(tok), tok.pad_token_id, tok.eos_token_id))
    return HFEngine(model, tok, max_new_tokens=6, temperature=0.7)


PROMPTS = ["1+2=", "34+56=", "3,5,7>22:"]  # different lengths exercise left padding


def test_logprobs_match_a_full_forward_recompute(engine):
    """What the trainer recomputes from scratch equals what the sampler reported, token by token."""
    rollouts = engine.generate(PROMPTS, n=4, seed=1)
    batch = pack(rollouts, engine.tokenizer.pad_token_id)
    with torch.no_grad():
        logits = engine.model(input_ids=batch["ids"], attention_mask=batch["attention"]).logits[:, :-1]
    recomputed = token_logprobs(logits, batch["ids"][:, 1:], engine.temperature)
    mask = batch["mask"].bool()
    assert mask.sum() == rollouts.num_tokens
    # fp32 on both sides: only summation order differs (KV cache vs full pass)
    assert torch.allclose(recomputed[mask], batch["rollout_logp"][mask], atol=1e-4)


def test_a_temperature_for_one_call_samples_as_an_engine_built_at_it(engine):
    """``generate(temperature=T)`` (how a trial evaluates at ``eval.temperature``) draws what an engine built at T
    draws from the same seed, reports T's post-temperature log-probs, and leaves the engine's own T alone."""
    at_half = HFEngine(engine.model, engine.tokenizer, max_new_tokens=6, temperature=0.5)
    a, b = engine.generate(PROMPTS, n=4, seed=3, temperature=0.5), at_half.generate(PROMPTS, n=4, seed=3)
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    own = engine.generate(PROMPTS, n=4, seed=3)
    assert engine.temperature == 0.7 and own.logprobs != a.logprobs
    assert own.completion_ids == engine.generate(PROMPTS, n=4, seed=3, temperature=None).completion_ids


def test_sampling_is_seeded_and_shaped(engine):
    a = engine.generate(PROMPTS, n=3, seed=5)
    b = engine.generate(PROMPTS, n=3, seed=5)
    c = engine.generate(PROMPTS, n=3, seed=6)
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert a.completion_ids != c.completion_ids
    assert len(a.texts) == len(a.completion_ids) == len(PROMPTS) * 3
    eos = engine.tokenizer.eos_token_id
    for prompt_ids, ids, logp, text in zip(a.prompt_ids, a.completion_ids, a.logprobs, a.texts):
        assert len(ids) == len(logp) and 1 <= len(ids) <= engine.max_new_tokens
        assert eos not in ids[:-1]  # nothing is sampled after <eos>
        assert all(lp <= 0 for lp in logp)
        assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
    assert [p for p in a.prompt_ids[::3]] == [engine.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def test_update_weights_sets_version_and_weights(engine):
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.update_weights(state, version=7)
    assert engine.policy_version == 7
    assert engine.generate(PROMPTS[:1], n=1, seed=0).policy_version == 7
    with pytest.raises(RuntimeError):
        engine.update_weights({"nope": torch.zeros(1)}, version=8)
