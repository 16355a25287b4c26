"""The HF rollout engine: post-temperature log-probs that the trainer recomputes, seeded sampling, versions."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from isosweep.algo.grpo import token_logprobs
from isosweep.models.family import qwen2_config
from isosweep.models.tokenizer import char_tokenizer
from isosweep.rollout.hf import HFEngine, sample_tokens
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


@torch.no_grad()
def full_batch_sampling(model, prompt_ids, max_new_tokens, temperature, eos_id, pad_id, generator):
    """The reference: every row read and stepped on its own to the end (no shared prompts, no dropped rows)."""
    batch, width = len(prompt_ids), max(len(p) for p in prompt_ids)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    for row, prompt in enumerate(prompt_ids):
        ids[row, width - len(prompt):], attention[row, width - len(prompt):] = torch.tensor(prompt), 1
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long)
    logprobs, lengths = torch.zeros((batch, max_new_tokens)), torch.zeros(batch, dtype=torch.long)
    done = torch.zeros(batch, dtype=torch.bool)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
    next_pos = positions[:, -1:] + 1
    for t in range(max_new_tokens):
        step_logp = torch.log_softmax(out.logits[:, -1, :].float() / temperature, dim=-1)
        token = torch.multinomial(step_logp.exp(), 1, generator=generator).squeeze(-1)
        live = ~done
        tokens[live, t], logprobs[live, t] = token[live], step_logp[live].gather(-1, token[live, None]).squeeze(-1)
        lengths += live.long()
        done |= token == eos_id
        if bool(done.all()):
            break
        attention = torch.cat([attention, live.long()[:, None]], dim=-1)
        feed = torch.where(live, token, torch.full_like(token, pad_id))[:, None]
        out = model(input_ids=feed, attention_mask=attention, position_ids=next_pos,
                    past_key_values=out.past_key_values, use_cache=True)
        next_pos = next_pos + 1
    return tokens, logprobs, lengths


@pytest.mark.parametrize("compact_below", [0.0, 0.75, 1.0])
@pytest.mark.parametrize("n", [1, 3])
def test_shared_prompts_and_dropped_rows_sample_what_the_full_batch_does(engine, n, compact_below):
    """Reading each prompt once for its ``n`` rows and dropping finished rows saves work only: from the same
    generator state the sampler draws the tokens (and log-probs) of the plain full-batch loop, prompts of
    different lengths and repeated runs included."""
    tok = engine.tokenizer
    prompts = ["1+2=", "1+2=", "34+56=", "3,5,7>22:", "34+56="] * 3
    rows = [ids for ids in tok(prompts, add_special_tokens=False)["input_ids"] for _ in range(n)]
    for seed in range(3):
        want = full_batch_sampling(engine.model, rows, 6, 0.7, tok.eos_token_id, tok.pad_token_id,
                                   torch.Generator().manual_seed(seed))
        got = sample_tokens(engine.model, rows, 6, 0.7, tok.eos_token_id, tok.pad_token_id,
                            torch.Generator().manual_seed(seed), compact_below=compact_below)
        assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
        assert torch.allclose(got[1], want[1], atol=1e-5)
        assert len(set(want[2].tolist())) > 1  # rows finish at different steps: some are dropped mid-way
