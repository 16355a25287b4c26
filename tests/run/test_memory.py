"""The memory plan: parameter counts on meta-device models, DeepSpeed's model-state estimators, activations,
logits and log-prob chunks against hand formulas, and the refusal of a grid point that does not fit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from transformers import Qwen2Config

from isosweep.cli import main
from isosweep.run.memory import (
    GiB,
    LOGPROB_COPIES,
    OVERHEAD,
    VLLM_RESERVE,
    model_config,
    model_shape,
    model_states,
    plan_trial,
    rollout_memory,
    trainer_memory,
)
from isosweep.run.plan import check_memory, study_memory
from isosweep.run.submit import submit
from isosweep.spec.grid import load_sweep
from isosweep.spec.study import load_study
from isosweep.spec.yamlio import ConfigError

ROOT = Path(__file__).resolve().parents[2]
H200_SWEEPS = [ROOT / "sweeps" / "qwen25-gsm8k-h200.yaml", ROOT / "sweeps" / "jfhpo-qwen25-h200.yaml"]
PUBLISHED = {"0.5B": 0.49e9, "1.5B": 1.54e9, "7B": 7.6e9, "32B": 32.8e9}
"""Parameter counts of the Qwen2.5 model cards."""

TINY = Qwen2Config(vocab_size=100, hidden_size=16, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, tie_word_embeddings=False)
"""A config small enough to count by hand: head_dim 4, KV width 8."""


def tiny_params() -> tuple[int, int]:
    """(parameters, largest layer) of :data:`TINY`, by hand: embedding and head 100 x 16 each; per layer q (16x16
    + 16), k and v (8x16 + 8 each), o (16x16), gate/up/down (3 x 16 x 40), two norms; a final norm."""
    h, i, kv, v = 16, 40, 8, 100
    layer = (h * h + h) + 2 * (kv * h + kv) + h * h + 3 * h * i + 2 * h
    return 2 * v * h + 2 * layer + h, v * h


@pytest.mark.parametrize("size", PUBLISHED)
def test_parameter_counts_match_the_published_sizes(size):
    assert model_shape(model_config(f"Qwen/Qwen2.5-{size}")).params == pytest.approx(PUBLISHED[size], rel=0.03)


def test_parameter_counts_match_the_hpo_studys_ladder_exactly():
    for name, params in load_study(H200_SWEEPS[1]).spec.sizes.items():
        assert model_shape(model_config(name)).params == params
    assert model_config("Qwen/Qwen2.5-7B-Instruct").to_dict() == model_config("Qwen/Qwen2.5-7B").to_dict()


def test_a_tiny_config_is_counted_by_hand():
    shape = model_shape(TINY)
    assert (shape.params, shape.largest_layer) == tiny_params()
    assert shape.linear == 2 * (16 * 16 * 2 + 2 * 8 * 16 + 3 * 16 * 40)
    assert (shape.kv_heads, shape.head_dim) == (2, 4)


@pytest.mark.parametrize("size", ["0.5B", "1.5B", "7B", "32B"])
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_model_states_equal_deepspeeds_estimators(size, world):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    shape = model_shape(model_config(f"Qwen/Qwen2.5-{size}"))
    P, L = shape.params, shape.largest_layer

    def states(stage: int, n: int = world) -> int:
        return sum(model_states(P, L, world=n, zero_stage=stage, bf16=True))

    zero2 = estimate_zero2_model_states_mem_needs(P, world, cpu_offload=False)[1]
    zero3 = estimate_zero3_model_states_mem_needs(P, L, world, cpu_offload=False)[1]
    assert states(2) == zero2
    assert states(3) == zero3
    # no ZeRO (0) and ZeRO-1 shard nothing on one rank: DeepSpeed's ZeRO-2 estimate for one GPU
    single = estimate_zero2_model_states_mem_needs(P, 1, cpu_offload=False)[1]
    assert states(0, 1) == states(1, 1) == single
    # ZeRO-1 keeps the bf16 weights and gradients whole, shards the 16 bytes of the optimizer step
    assert states(1) == 4 * P + 16 * P // world
    assert states(0) == 20 * P
    assert states(0) >= states(1) >= states(2) >= states(3) - 4 * L


def test_model_states_by_hand_on_a_tiny_config():
    P, L = tiny_params()
    assert model_states(P, L, world=2, zero_stage=3, bf16=True) == (2 * P // 2 + 4 * L, 4 * P // 2, 12 * P // 2)
    assert model_states(P, L, world=2, zero_stage=2, bf16=True) == (2 * P, 2 * P // 2 + 4 * P // 2, 12 * P // 2)
    assert model_states(P, L, world=2, zero_stage=1, bf16=True) == (2 * P, 2 * P + 4 * P // 2, 12 * P // 2)
    assert model_states(P, L, world=2, zero_stage=0, bf16=False) == (4 * P, 4 * P, 12 * P)


def plan(config=TINY, **overrides):
    args = dict(micro_batch=4, seq_len=10, world=2, zero_stage=3, bf16=True, gradient_checkpointing=False,
                logprob_chunk=8)
    return trainer_memory(config, **{**args, **overrides})


def test_activations_by_hand_on_a_tiny_config():
    tokens, h, i, kv, layers = 4 * 10, 16, 40, 8, 2
    layer = tokens * (2 * 4 * h + 2 * (4 * h + 2 * kv + 4 * i))
    final = tokens * h * (4 + 2)
    assert plan().activations == (layers + 1) * layer + final
    assert plan(gradient_checkpointing=True).activations == layers * tokens * h * 2 + 2 * layer + final
    assert plan().logits == 2 * 8 * 100 * 2  # one chunk's bf16 logits and their gradient
    assert plan(logprob_chunk=1000).logits == 2 * tokens * 100 * 2  # a chunk larger than the micro-batch
    assert plan().logprob_chunk == LOGPROB_COPIES * 8 * 100 * 4
    assert plan().reference == 2 * tiny_params()[0] // 2 and plan(zero_stage=2).reference == 2 * tiny_params()[0]
    assert plan(reference=False).reference == 0 and plan().overhead == OVERHEAD


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activations_grow_linearly_with_the_micro_batch_and_shrink_with_checkpointing(checkpointing):
    config = model_config("Qwen/Qwen2.5-1.5B")
    acts = [plan(config, micro_batch=mb, seq_len=768, gradient_checkpointing=checkpointing).activations
            for mb in (1, 2, 4, 8)]
    assert acts[1] == 2 * acts[0] and acts[2] == 4 * acts[0] and acts[3] == 8 * acts[0]
    without = plan(config, micro_batch=8, seq_len=768).activations
    assert plan(config, micro_batch=8, seq_len=768, gradient_checkpointing=True).activations < without / 4


def test_logits_and_the_chunk_grow_with_logprob_chunk_only():
    """The head runs chunk by chunk: no term grows with the micro-batch's tokens times the vocabulary."""
    config = model_config("Qwen/Qwen2.5-1.5B")
    small = plan(config, micro_batch=4, seq_len=768, logprob_chunk=1024)
    big = plan(config, micro_batch=16, seq_len=768, logprob_chunk=1024)
    assert big.logits == small.logits == 2 * 1024 * 151_936 * 2
    assert plan(config, micro_batch=4, seq_len=768, logprob_chunk=2048).logits == 2 * small.logits
    assert big.logprob_chunk == small.logprob_chunk == LOGPROB_COPIES * 1024 * 151_936 * 4
    assert plan(config, micro_batch=4, seq_len=768, logprob_chunk=2048).logprob_chunk == 2 * small.logprob_chunk
    assert small.total == small.states + small.reference + small.overhead + max(small.pass_peak, small.publish)


def test_rollout_kv_cache_in_tokens_and_sequences():
    config = model_config("Qwen/Qwen2.5-7B")
    shape = model_shape(config)
    r = rollout_memory(config, gpu_bytes=139 * GiB, utilization=0.85, tensor_parallel=1, fp8=True, seq_len=768)
    assert r.weights == shape.linear + 2 * (shape.params - shape.linear)
    assert r.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert r.kv_cache == int(0.85 * 139 * GiB) - r.weights - VLLM_RESERVE
    assert r.sequences == r.kv_cache // r.kv_bytes_per_token // 768 > 1000
    bf16_tp2 = rollout_memory(config, gpu_bytes=139 * GiB, utilization=0.85, tensor_parallel=2, fp8=False, seq_len=768)
    assert bf16_tp2.weights == shape.params and bf16_tp2.kv_bytes_per_token == r.kv_bytes_per_token // 2
    tiny_gpu = rollout_memory(model_config("Qwen/Qwen2.5-32B"), gpu_bytes=36 * GiB, utilization=0.9,
                              tensor_parallel=1, fp8=True, seq_len=768)
    assert tiny_gpu.sequences == 0 and tiny_gpu.kv_tokens == 0
    cfg = load_sweep(H200_SWEEPS[0]).trials[0].cfg
    starved = replace(plan_trial("n4-Bp64", cfg, 256), rollout=tiny_gpu)
    assert "grid point n4-Bp64: a rollout GPU's vLLM share" in starved.problems("x")[0]


@pytest.mark.parametrize("path", H200_SWEEPS, ids=[p.name for p in H200_SWEEPS])
def test_the_shipped_h200_sweeps_fit_every_grid_point(path):
    study = load_study(path)
    plans = study_memory(study)
    assert plans and all(m.gpu_bytes == 139 * GiB for m in plans)
    for m in plans:
        assert m.trainer.total < 0.9 * m.gpu_bytes, m.key
        assert m.rollout is not None and m.rollout.sequences > 100, m.key
        assert not m.problems(str(path))
    check_memory(study)


def oversized(tmp_path: Path) -> Path:
    """The 1.5B sweep on Qwen2.5-7B at Bp = 256, n = 32, each rank's whole share in one pass."""
    text = (ROOT / "sweeps" / "qwen25-gsm8k-h200.yaml").read_text()
    text = text.replace("trial: trials/qwen25-gsm8k.yaml", f"trial: {ROOT / 'sweeps/trials/qwen25-gsm8k.yaml'}")
    text = text.replace("  trainer.micro_batch: 16", "  trainer.micro_batch: null\n  model.name: Qwen/Qwen2.5-7B")
    text = text.replace("n: [4, 8, 16, 32]", "n: [32]").replace("Bp: [64, 256]", "Bp: [256]")
    path = tmp_path / "qwen25-7b-whole.yaml"
    path.write_text(text)
    return path


def test_an_oversized_grid_point_is_refused_naming_it_and_the_micro_batch(tmp_path):
    sweep = load_sweep(oversized(tmp_path))
    assert sweep.trials[0].cfg.trainer.micro_batch is None
    with pytest.raises(ConfigError, match=r"grid point n32-Bp256: a trainer rank needs .*trainer\.micro_batch to \d+"):
        check_memory(sweep)
    m = plan_trial("n32-Bp256", sweep.trials[0].cfg, 256)
    assert m.micro_batch == m.share == 256 * 32 // 4
    assert "gradient_checkpointing" in m.problems("x")[0]
    fixed = plan_trial("x", sweep.trials[0].cfg.model_copy(update={"trainer": sweep.trials[0].cfg.trainer.model_copy(
        update={"micro_batch": m.fitting_micro_batch})}), 256)
    assert fixed.trainer.total <= fixed.gpu_bytes and not fixed.problems("x")


def test_submit_refuses_an_oversized_sweep_before_any_upload(tmp_path):
    with pytest.raises(ConfigError, match="grid point n32-Bp256"):
        submit("http://127.0.0.1:9", str(oversized(tmp_path)), retry_s=0)  # nothing listens there


def test_the_dry_run_prints_the_table_and_refuses_an_oversized_sweep(tmp_path, capsys):
    assert main(["sweep", str(H200_SWEEPS[0]), "--dry-run"]) in (0, None)
    out = capsys.readouterr().out
    assert "memory per GPU in GiB (h200-node: 139 GiB" in out and "tightest trainer rank" in out
    rows = [line for line in out.splitlines() if line.startswith("n") and "| " in line]
    assert len(rows) == len(load_sweep(H200_SWEEPS[0]).trials)
    assert main(["sweep", str(oversized(tmp_path)), "--dry-run"]) == 2
    captured = capsys.readouterr()
    assert "memory per GPU" in captured.out and "grid point n32-Bp256" in captured.out + captured.err


def test_cpu_profiles_are_skipped_in_one_line():
    sweep = load_sweep(ROOT / "sweeps" / "smoke.yaml")
    assert study_memory(sweep) == []
    from isosweep.run.plan import plan as dry_run

    assert "memory plan: skipped (CPU profiles" in dry_run(sweep)
