"""The vLLM rollout engine against the fp32 trainer: post-temperature log-probs that agree to bf16
noise, seeded sampling, the HFEngine layout, in-place weight updates, FP8 rounding, the Ray actor.

Engines take ~10 s to start on a CPU, so each precision's engine is started once for the module.
"""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from isosweep.algo.grpo import token_logprobs
from isosweep.models.warmup import ensure_base_model
from isosweep.rollout.base import Rollouts
from isosweep.rollout.fp8 import fp8_state_dict
from isosweep.rollout.vllm import (
    CPU_MAX_MODEL_LEN,
    VLLMEngine,
    engine_env,
    llm_kwargs,
    spawn_rollout_actor,
    vllm_available,
)
from isosweep.tasks import get_task
from isosweep.trial.loop import pack

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]' or '.[gpu]')")

pytestmark = pytest.mark.vllm

TEMPERATURE = 0.8  # not 1, so raw and post-temperature log-probs differ
MAX_NEW_TOKENS = 8
N = 4

SEEDS = range(4)
"""Mismatch figures pool these generate seeds over MISMATCH_PROMPTS: 4 x 64 prompts x 4 samples, ~3700 tokens."""

# |vLLM logp - fp32 trainer logp| per completion token, tiny-1m arithmetic base, temperature 0.8.
# The statistic is the mean (what the trainer logs as mismatch/logp_abs_diff_mean and what AIS's
# alpha_mis reads): "FP8 weights move the rollout policy further from the trainer" is a claim about
# the average distance. Most per-token errors are tiny and quantised (bf16 logits), so the median of
# either engine is a few 1e-4 and its fp8/bf16 ratio swung from 0.3 to 10 between seeds; the mean is
# carried by a few rare tokens, so it is pooled over 64 prompts (a batch of 256 costs about what a
# batch of 64 does) rather than the 16 that the other tests sample.
#
# Measured on 2026-12-01 (2-core CPU, vLLM 0.32 bf16 vs the fp32 trainer) over 75 runs of this test's
# figures: 3 base models (warm-up seeds 0, 1, 2, standing in for the seed-0 model built on other machines:
# it is built on first use, and this machine's already gave a bf16 median |dlogp| of 0.0008 where the
# 2026-11-29 notes had 0.0003) x 25 draws of the 64 prompts and of the 4 generate seeds:
#   bf16 engine, mean |dlogp|                          0.0025-0.0048
#   fp8 engine to the trainer on FP8-rounded weights   0.0022-0.0053
#   fp8 / bf16 engine, ratio of means                  1.47-3.71 (5% quantile 1.62; medians per model 1.9-2.9)
#   fp8 engine, to the trainer / to FP8-rounded        1.53-3.87 (5% quantile 1.78), on the same tokens
# With the 16 prompts of the other tests the fp8 / bf16 ratio of means reached down to 1.20 and the
# paired ratio to 1.39 (90 runs), under the bounds of 1.3 and 1.5 asserted before; the medians' ratio
# was 0.77 on this machine's seed-0 base model itself, which failed the old median bound every run.
BF16_TOLERANCE = 0.016
"""Upper bound on an engine's mean |dlogp| against the fp32 trainer on the weights it serves: "matches to bf16
noise" (measured at most 0.0048 for the bf16 engine and 0.0053 for the fp8 one with the 64 prompts, 0.0070
and 0.0096 with 16 prompts and after weight updates)."""
FP8_MEAN_RATIO = 1.2
"""Lower bound on fp8 / bf16 engine mean |dlogp| to the trainer (measured 1.47-3.71; 1 without rounding)."""
FP8_PAIRED_RATIO = 1.2
"""Lower bound, on the fp8 engine's own tokens, on its mean |dlogp| to the trainer over its mean |dlogp|
to the trainer on FP8-rounded weights (measured 1.53-3.87)."""


@pytest.fixture(scope="module")
def model_path() -> str:
    return str(ensure_base_model("tiny-1m", "arithmetic", 0))


@pytest.fixture(scope="module")
def trainer(model_path: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    """16 arithmetic prompts of 1- to 3-digit operands (several prompt lengths)."""
    task = get_task("arithmetic")
    return [p.prompt for level, count in [(1, 5), (2, 6), (3, 5)] for p in task.problems("train", level, count, seed=0)]


@pytest.fixture(scope="module")
def mismatch_prompts() -> list[str]:
    """64 arithmetic prompts of 1- to 3-digit operands, for the pooled mismatch figures."""
    task = get_task("arithmetic")
    return [p.prompt for level, count in [(1, 20), (2, 24), (3, 20)] for p in task.problems("train", level, count, seed=0)]


def start(model_path: str, precision: str) -> VLLMEngine:
    started = time.perf_counter()
    engine = VLLMEngine(model_path, MAX_NEW_TOKENS, TEMPERATURE, precision=precision, gpu=False)
    print(f"\n{precision} engine start: {time.perf_counter() - started:.1f} s")
    return engine


@pytest.fixture(scope="module")
def bf16_engine(model_path: str) -> VLLMEngine:
    return start(model_path, "bf16")


@pytest.fixture(scope="module")
def fp8_engine(model_path: str) -> VLLMEngine:
    return start(model_path, "fp8")


def logp_error(model: torch.nn.Module, rollouts: Rollouts, temperature: float = TEMPERATURE) -> torch.Tensor:
    """``(completion tokens,)``: |rollout log-prob - the model's recomputed post-``temperature`` log-prob|."""
    batch = pack(rollouts, pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=batch["ids"], attention_mask=batch["attention"]).logits[:, :-1].float()
    recomputed = token_logprobs(logits, batch["ids"][:, 1:], temperature)
    mask = batch["mask"].bool()
    assert int(mask.sum()) == rollouts.num_tokens
    return (recomputed[mask] - batch["rollout_logp"][mask]).abs()


def perturbed(state: dict[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """Every float tensor plus ``scale * its std`` of Gaussian noise (the tied embedding too)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: t + scale * t.std() * torch.randn(t.shape, generator=gen) if t.numel() > 1 else t.clone()
            for name, t in state.items()}


@pytest.fixture(scope="module")
def bf16_error(bf16_engine: VLLMEngine, trainer: torch.nn.Module, mismatch_prompts: list[str]) -> torch.Tensor:
    return torch.cat([logp_error(trainer, bf16_engine.generate(mismatch_prompts, N, seed=seed)) for seed in SEEDS])


def test_engine_arguments() -> None:
    assert vllm_available()
    cpu = llm_kwargs("m", "fp8", seed=3, gpu=False, max_position_embeddings=64, overrides=None)
    assert cpu["logprobs_mode"] == "processed_logprobs" and cpu["dtype"] == "bfloat16" and cpu["seed"] == 3
    assert cpu["max_model_len"] == 64 and cpu["enforce_eager"] and "quantization" not in cpu
    assert llm_kwargs("m", "bf16", 0, False, 32_768, None)["max_model_len"] == CPU_MAX_MODEL_LEN
    gpu = llm_kwargs("m", "fp8", 0, gpu=True, max_position_embeddings=64,
                     overrides={"tensor_parallel_size": 2, "gpu_memory_utilization": 0.3})
    assert gpu["quantization"] == "fp8_per_channel" and "max_model_len" not in gpu
    assert gpu["tensor_parallel_size"] == 2 and gpu["gpu_memory_utilization"] == 0.3
    assert "quantization" not in llm_kwargs("m", "bf16", 0, True, None, None)
    assert engine_env(gpu=True) == {}


def test_engine_env_keeps_the_users_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    env = engine_env(gpu=False)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1" and env["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_logprobs_match_the_fp32_trainer(bf16_error: torch.Tensor) -> None:
    mean, worst = float(bf16_error.mean()), float(bf16_error.max())
    print(f"\nbf16 vLLM vs fp32 trainer: mean |dlogp| {mean:.4f}, max {worst:.4f} over {bf16_error.numel()} tokens")
    assert mean < BF16_TOLERANCE


def test_a_temperature_for_one_call_is_the_one_sampled_at(bf16_engine: VLLMEngine, trainer: torch.nn.Module,
                                                          prompts: list[str]) -> None:
    """``generate(temperature=T)`` (a trial's evaluation at ``eval.temperature``) samples at T: its log-probs are
    the trainer's at T, not at the engine's own temperature, which the next call uses again."""
    hot = bf16_engine.generate(prompts, N, seed=2, temperature=1.5)
    assert logp_error(trainer, hot, 1.5).mean() < BF16_TOLERANCE < logp_error(trainer, hot).mean()
    assert logp_error(trainer, bf16_engine.generate(prompts, N, seed=2)).mean() < BF16_TOLERANCE


def test_sampling_is_seeded_and_shaped(bf16_engine: VLLMEngine, prompts: list[str]) -> None:
    a = bf16_engine.generate(prompts, N, seed=5)
    b = bf16_engine.generate(prompts, N, seed=5)
    c = bf16_engine.generate(prompts, N, seed=6)
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs and a.texts == b.texts
    assert a.completion_ids != c.completion_ids
    tok = bf16_engine.tokenizer
    assert len(a.prompt_ids) == len(a.completion_ids) == len(a.texts) == len(prompts) * N
    assert a.prompt_ids[::N] == tok(prompts, add_special_tokens=False)["input_ids"]
    assert all(a.prompt_ids[i] == a.prompt_ids[i - i % N] for i in range(len(a.prompt_ids)))
    eos = tok.eos_token_id
    finished = 0
    for ids, logp, text in zip(a.completion_ids, a.logprobs, a.texts):
        assert len(ids) == len(logp) and 1 <= len(ids) <= MAX_NEW_TOKENS
        assert eos not in ids[:-1]
        assert all(lp <= 0 for lp in logp)
        assert text == tok.decode(ids, skip_special_tokens=True)
        finished += ids[-1] == eos
    assert finished > 0  # the base model does end its answers


def test_update_weights(bf16_engine: VLLMEngine, trainer: torch.nn.Module, prompts: list[str]) -> None:
    """Reloading the same weights changes nothing; perturbed weights (the tied embedding included) are
    served exactly as the trainer computes them; every batch carries the version it was sampled with."""
    state = {name: t.clone() for name, t in trainer.state_dict().items()}
    before = bf16_engine.generate(prompts, N, seed=1)
    bf16_engine.update_weights(state, version=1)
    same = bf16_engine.generate(prompts, N, seed=1)
    assert same.policy_version == 1
    assert same.completion_ids == before.completion_ids and same.logprobs == before.logprobs

    noisy = AutoModelForCausalLM.from_config(trainer.config).eval()
    noisy.load_state_dict(perturbed(state, 0.2, seed=0))
    bf16_engine.update_weights(noisy.state_dict(), version=2)
    try:
        after = bf16_engine.generate(prompts, N, seed=1)
        assert after.policy_version == 2
        # Over 90 runs (3 base models x 30 perturbation and generate seeds) the engine's mean |dlogp| was
        # 0.049-0.47 to the old trainer and 0.0017-0.0096 to the perturbed one; 0.0018-0.0072 after the
        # embedding-only update. Weights that did not arrive would leave the first under the tolerance.
        moved = (logp_error(trainer, after).mean(), logp_error(noisy, after).mean())
        print(f"\nperturbed weights: mean |dlogp| vs old trainer {moved[0]:.4f}, vs perturbed trainer {moved[1]:.4f}")
        assert moved[1] < BF16_TOLERANCE < moved[0]
        embed_only = dict(state, **{"model.embed_tokens.weight": noisy.state_dict()["model.embed_tokens.weight"]})
        noisy.load_state_dict(embed_only)
        bf16_engine.update_weights(embed_only, version=3)
        assert logp_error(noisy, bf16_engine.generate(prompts, N, seed=1)).mean() < BF16_TOLERANCE
    finally:
        bf16_engine.update_weights(state, version=0)


def test_fp8_engine_serves_fp8_rounded_weights(
    fp8_engine: VLLMEngine, bf16_engine: VLLMEngine, trainer: torch.nn.Module, mismatch_prompts: list[str],
    bf16_error: torch.Tensor,
) -> None:
    """The FP8 engine serves exactly the FP8-rounded weights: given them, the bf16 engine samples the same
    tokens with the same log-probs. That puts it further from the trainer than the bf16 engine, and the
    extra distance is the FP8 weight error: scored by the trainer on FP8-rounded weights, its samples
    match to bf16 noise.

    The first check is exact, so any change to what the engine rounds fails it. The ratios (see
    FP8_MEAN_RATIO) are what the rounding does to rollouts; with this machine's seed-0 base model, the
    engine's rounding replaced and the test run again: rounding off gave ratios 1.00 and 0.43, rounding
    the embeddings too 4.33 and 1.20, one scale per tensor 3.25 and 0.76 (each fails a bound), rounding
    the attention weights alone 2.53 and 1.82 (only the exact check fails).
    """
    state = fp8_state_dict({name: t.to(torch.bfloat16) for name, t in trainer.state_dict().items()})
    rounded = AutoModelForCausalLM.from_config(trainer.config).eval()
    rounded.load_state_dict({name: t.float() for name, t in state.items()})
    batches = [fp8_engine.generate(mismatch_prompts, N, seed=seed) for seed in SEEDS]
    assert all(r.policy_version == 0 for r in batches)
    bf16_engine.update_weights(state, version=5)
    try:
        served = bf16_engine.generate(mismatch_prompts, N, seed=SEEDS[0])
    finally:
        bf16_engine.update_weights(trainer.state_dict(), version=0)
    assert served.completion_ids == batches[0].completion_ids and served.logprobs == batches[0].logprobs

    fp8_error = torch.cat([logp_error(trainer, r) for r in batches])
    to_rounded = torch.cat([logp_error(rounded, r) for r in batches])  # the same tokens, paired with fp8_error
    ratio, paired = fp8_error.mean() / bf16_error.mean(), fp8_error.mean() / to_rounded.mean()
    print(f"\nmean |dlogp| to the fp32 trainer: fp8 vLLM {fp8_error.mean():.4f} over {fp8_error.numel()} tokens, "
          f"bf16 vLLM {bf16_error.mean():.4f} over {bf16_error.numel()}; fp8 vLLM to the trainer on fp8-rounded "
          f"weights {to_rounded.mean():.4f}; ratios fp8/bf16 {ratio:.2f}, to trainer/to rounded {paired:.2f}")
    assert ratio > FP8_MEAN_RATIO
    assert paired > FP8_PAIRED_RATIO
    assert to_rounded.mean() < BF16_TOLERANCE
    fp8_engine.update_weights(trainer.state_dict(), version=4)
    again = fp8_engine.generate(mismatch_prompts, N, seed=SEEDS[0])
    assert again.policy_version == 4 and again.logprobs == batches[0].logprobs  # updates are rounded too


@pytest.mark.slow
def test_ray_actor_inside_a_placement_group(model_path: str) -> None:
    """A trial runs inside a placement group; the rollout actor it spawns must still start."""
    ray = pytest.importorskip("ray")
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=1)
    def trial(path: str) -> tuple[Rollouts, Rollouts]:
        actor = spawn_rollout_actor(path, MAX_NEW_TOKENS, TEMPERATURE, gpu=False, num_cpus=1)
        state = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()
        first = ray.get(actor.generate.remote(["1+2=", "34+5="], 2, 0))
        ray.get(actor.update_weights.remote(state, 9))
        return first, ray.get(actor.generate.remote(["1+2=", "34+5="], 2, 0))

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        group = placement_group([{"CPU": 1}])
        ray.get(group.ready(), timeout=60)
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_capture_child_tasks=True)
        first, second = ray.get(trial.options(scheduling_strategy=strategy).remote(model_path), timeout=240)
        remove_placement_group(group)
    finally:
        ray.shutdown()
    assert first.policy_version == 0 and second.policy_version == 9
    assert len(first.completion_ids) == 4 and first.logprobs == second.logprobs


@pytest.mark.slow
def test_rollout_actors_run_in_a_placement_group_of_their_own_that_release_removes(model_path: str) -> None:
    """A trial's rollout actors take their bundles of a placement group packed as the profile says (so Ray enforces
    the packing); the group outlives the worker that made it, so releasing the trial's actors removes it too."""
    import time

    ray = pytest.importorskip("ray")
    from isosweep.rollout.placement import actor_names, release
    from isosweep.rollout.pool import RolloutPool

    def groups() -> list[dict]:
        return [g for g in ray.util.placement_group_table().values()
                if g["name"].startswith("rollout-trial1-") and g["state"] != "REMOVED"]

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        pool = RolloutPool.spawn(actor_names("trial1", "launch1", 1), model_path, MAX_NEW_TOKENS, TEMPERATURE, "bf16",
                                 0, cpus=0.9, gpus=0.0, strategy="STRICT_PACK")
        assert len(pool.generate(["1+2="], 2, seed=0).texts) == 2
        [group] = groups()
        for _ in range(50):  # the raylet reports resources a little late
            free = ray.available_resources()
            if free.get("CPU", 0) == pytest.approx(2 - 0.9):
                break
            time.sleep(0.1)
        assert free.get("CPU", 0) == pytest.approx(2 - 0.9)  # the group's 0.9, not another 0.9 beside it
        assert free.get(f"CPU_group_{group['placement_group_id']}", 0) == pytest.approx(0)  # the actor holds the bundle
        assert release("trial1") == 1
        assert groups() == []
    finally:
        ray.shutdown()
