"""One micro-batched optimizer step: the same step whatever the micro-batch, memory bounded by the chunk."""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from isosweep.rollout.base import Rollouts
from isosweep.spec.trial import load_trial
from isosweep.trial.learner import (
    GatheredWeights,
    deepspeed_config,
    init_distributed,
    make_learner,
    make_reference,
    micro_batches,
    parameter_count,
)
from isosweep.trial.loop import load_policy, pack
from isosweep.trial.step import micro_slices, policy_update, token_stats

EASY = Path(__file__).parents[2] / "sweeps" / "trials" / "easy.yaml"


def _batch(seed: int, rows: int = 12, vocab: int = 17, pad_id: int = 0) -> tuple[dict, torch.Tensor]:
    """A packed batch of ``rows`` prompt + completion rows of random lengths and rollout log-probs a little off the
    trainer's (so TIS/AIS weights differ from 1), and one advantage per row."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(2, 6))] for _ in range(rows)]
    completions = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 7))] for _ in range(rows)]
    logprobs = [[-rng.uniform(0.5, 3.0) for _ in c] for c in completions]
    rollouts = Rollouts(prompts, completions, logprobs, ["x"] * rows, 0)
    advantages = torch.tensor([rng.gauss(0, 1) for _ in range(rows)])
    return pack(rollouts, pad_id), advantages


def _learner(base_model, cfg):
    policy = load_policy(base_model)
    reference = make_reference(copy.deepcopy(policy), cfg, gpu=False, device=torch.device("cpu"))
    return make_learner(policy, cfg, gpu=False), reference


@pytest.fixture(scope="module")
def world_of_one():
    init_distributed("gloo")


@pytest.mark.parametrize("correction", ["none", "tis", "ais"])
def test_a_micro_batched_step_is_the_whole_batch_step(base_model, world_of_one, correction):
    """Loss, statistics, gradient norm and the weights after one optimizer step are those of the whole batch in one
    pass (to float32 rounding), for micro-batches that divide the batch and ones that do not."""
    batch, advantages = _batch(seed=3)
    results = {}
    for micro in (None, 1, 5, 12):
        cfg = load_trial(EASY, ["budget=1200", "Bp=3", "n=4", f"algorithm.correction={correction}",
                                "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01", "trainer.logprob_chunk=7",
                                *([f"trainer.micro_batch={micro}"] if micro else [])])
        learner, reference = _learner(base_model, cfg)
        assert learner.gradient_accumulation_steps() == micro_batches(cfg, 1) == len(micro_slices(12, micro))
        stats = policy_update(learner, reference, batch, advantages, cfg)
        results[micro] = stats, {k: v.clone() for k, v in GatheredWeights(learner).items()}
    whole, whole_weights = results[None]
    assert whole.micro_batches == 1 and whole.kl == 0.0  # the reference is the policy before its first step
    assert whole.grad_norm > 0
    for micro, (stats, weights) in results.items():
        assert stats.micro_batches == len(micro_slices(12, micro))
        for key, value in whole.metrics().items():
            assert stats.metrics()[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (micro, key)
        assert stats.grad_norm == pytest.approx(whole.grad_norm, rel=1e-5)
        for name, tensor in whole_weights.items():
            torch.testing.assert_close(weights[name], tensor, atol=1e-7, rtol=1e-5, msg=f"{micro} {name}")
        assert any(not torch.equal(weights[name], t) for name, t in GatheredWeights(_learner(
            base_model, load_trial(EASY, ["budget=1200"]))[0]).items())  # the step moved the weights


def test_wider_agreed_micro_batches_change_nothing(base_model, world_of_one):
    """Workers under ZeRO-3 run micro-batches of the widths all of them agree on (padding beyond a worker's
    longest row): the step is the same."""
    batch, advantages = _batch(seed=5, rows=8)
    cfg = load_trial(EASY, ["budget=1200", "Bp=2", "n=4", "trainer.micro_batch=4", "algorithm.correction=ais"])
    own = policy_update(*_learner(base_model, cfg), batch, advantages, cfg)
    width = batch["ids"].shape[1]
    wide = policy_update(*_learner(base_model, cfg), batch, advantages, cfg, widths=[width + 3, width + 9])
    for key, value in own.metrics().items():
        assert wide.metrics()[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key


def test_deepspeed_accumulates_over_the_steps_micro_batches():
    cfg = load_trial(EASY, ["budget=4096", "Bp=16", "n=8", "trainer.num_workers=2", "trainer.micro_batch=24"])
    assert micro_batches(cfg, world=2) == 3  # 64 sequences a worker, in 24 + 24 + 16
    assert deepspeed_config(cfg, gpu=False, world=2)["gradient_accumulation_steps"] == 3
    assert micro_batches(load_trial(EASY, ["budget=4096", "Bp=16", "n=8"]), world=1) == 1


def test_zero3_reference_is_partitioned_and_the_policy_counts_whole(base_model, world_of_one):
    """Under ZeRO-3 the reference is partitioned like the policy (no whole copy per worker), its log-probs are the
    policy's before any step, and the parameter count (for ``system/trainer_flops``) is the whole model's."""
    cfg = load_trial(EASY, ["budget=1200", "trainer.zero_stage=3", "trainer.param_persistence_threshold=0"])
    policy = load_policy(base_model)
    whole = sum(p.numel() for p in policy.parameters())
    reference = make_reference(copy.deepcopy(policy), cfg, gpu=False, device=torch.device("cpu"))
    learner = make_learner(policy, cfg, gpu=False)
    assert all(p.numel() == 0 for p in learner.module.parameters())  # partitioned, even on one worker
    assert all(p.numel() == 0 for p in reference.module.parameters())
    assert parameter_count(learner.module) == parameter_count(reference.module) == whole
    assert sum(p.numel() for p in learner.module.parameters()) == 0  # what trainer_flops counted before
    batch, _ = _batch(seed=1, rows=4)
    with torch.no_grad():
        ours, _ = token_stats(learner, batch["ids"], batch["attention"], 1.0, 5)
        theirs, _ = token_stats(reference, batch["ids"], batch["attention"], 1.0, 5)
    torch.testing.assert_close(ours, theirs)
    shapes = GatheredWeights(learner).shapes()
    gathered = dict(GatheredWeights(learner).items())
    assert {k: tuple(v.shape) for k, v in gathered.items()} == {k: tuple(s) for k, s in shapes.items()}
    assert {k: tuple(v.shape) for k, v in load_policy(base_model).state_dict().items()} == \
        {k: tuple(v.shape) for k, v in gathered.items()}


def test_a_bf16_trainer_gets_a_bf16_reference(base_model):
    """A float32 reference beside a bf16 policy gives a non-zero KL at step 0: the reference is stored as the
    trainer is (bf16 on a GPU profile; float32 on CPU)."""
    cfg = load_trial(EASY, ["budget=1200", "trainer.zero_stage=1"])
    model = load_policy(base_model)
    assert next(make_reference(copy.deepcopy(model), cfg, gpu=False, device=torch.device("cpu"))
                .parameters()).dtype == torch.float32
    gpu_cfg = cfg.model_copy(update={"profile": "h200-node"})
    from isosweep.trial.learner import uses_bf16

    assert uses_bf16(gpu_cfg, gpu=True) and not uses_bf16(gpu_cfg, gpu=False) and not uses_bf16(cfg, gpu=True)


PEAK = """
import ctypes, gc, json, sys, torch
from transformers import Qwen2Config, AutoModelForCausalLM
from isosweep.trial.step import token_stats


def status_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])


batch, chunk = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
config = Qwen2Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=32, tie_word_embeddings=True)
model = AutoModelForCausalLM.from_config(config)
ids = torch.randint(0, 151936, (batch, 64))
attention = torch.ones_like(ids)
gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap back to the system, so what the computation takes shows in RSS
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak RSS (VmHWM) starts again from the RSS now: the model's build is not counted
before = status_kb("VmRSS")
logp, entropy = token_stats(model, ids, attention, 1.0, chunk)
(logp.sum() + entropy.sum()).backward()
print(json.dumps({"extra_mb": (status_kb("VmHWM") - before) / 1024}))
"""


@pytest.mark.slow
def test_log_prob_memory_grows_with_the_chunk_not_with_the_batch(tmp_path):
    """At Qwen2.5's 151,936-token vocabulary, in a fresh process per setting (its peak RSS reset before the
    computation, Linux's /proc/self/clear_refs): the peak memory of the log-probs and
    entropies (forward and backward) of 64 sequences is about that of 4 at the same chunk and a small part of one
    float32 copy of the 64 sequences' logits (the whole-logits computation held several); a larger chunk costs
    at least two float32 ``[chunk, vocab]`` tensors more."""
    script = tmp_path / "peak.py"
    script.write_text(PEAK)

    def extra(batch: int, chunk: int) -> float:
        out = subprocess.run([sys.executable, str(script), str(batch), str(chunk)], capture_output=True, text=True,
                             check=True, timeout=300)
        return json.loads(out.stdout.strip().splitlines()[-1])["extra_mb"]

    def copy_mb(positions: int) -> float:
        return positions * 151936 * 4 / 2**20

    whole_logits = copy_mb(64 * 63)  # one float32 copy of the 64 sequences' logits: 2.3 GB
    small, large, wide = extra(4, 64), extra(64, 64), extra(64, 512)
    assert large < 0.25 * whole_logits, (small, large, whole_logits)
    assert abs(large - small) < 0.1 * whole_logits, (small, large)  # allocator noise, not the batch
    assert wide - large > 2 * copy_mb(512 - 64), (large, wide)
