"""GPU memory of a trial before it starts: per trainer rank (DeepSpeed ZeRO) and per rollout GPU (vLLM).

A sweep's grid changes Bp * n per step, so memory is a property of each grid point: ``isosweep sweep
--dry-run`` prints these estimates per point, and a point that does not fit its profile's GPUs stops the
sweep (dry run, ``isosweep submit`` and ``run_sweep``) with a ``ConfigError`` naming it and what to change.

Trainer rank, bf16 with fp32 master weights and Adam (bytes per parameter, ``N`` ranks): 2 weights, 2 bf16
gradients, 4 master weights, 8 Adam moments, and the 4-byte fp32 gradient partition DeepSpeed's optimizer
step reads -- its estimators count it (``18 = 2 grads + 4 fp32 grads + 4 master + 8 Adam`` over ranks), so
model states here equal ``estimate_zero2_model_states_mem_needs`` / ``estimate_zero3_model_states_mem_needs``
(no offload) rather than the 16 bytes/parameter of the usual rule. ZeRO-1 shards the optimizer bytes, ZeRO-2
also the gradients, ZeRO-3 everything plus a gather buffer of 4 bytes per parameter of the largest layer (the
embedding). Then the activations of one micro-batch, the bf16 logits and their gradient, the fp32 chunks of
the log-prob computation, the reference model (bf16) and a fixed allowance for the CUDA context.

Rollout GPU: vLLM takes ``gpu_memory_utilization`` of it; the weights (fp8 linear layers at 1 byte, the rest
bf16, split over tensor parallelism) and a fixed reserve come first, the KV cache gets the rest.

These are estimates from shapes, not measurements: ``make gpu-check`` compares them with a real peak.
Model architectures come without weights: the Qwen2.5 family is written down here (:data:`QWEN25`), a local
path's ``config.json`` is read, another hub name's config is fetched on first use.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from isosweep.models.sizes import CHAR_VOCAB, SIZES
from isosweep.spec.profiles import deepspeed_overrides, get_profile, vllm_engine_args
from isosweep.spec.trial import TrialConfig, rollout_engine
from isosweep.spec.yamlio import ConfigError

GiB = 2**30

OVERHEAD = 2 * GiB
"""Per trainer rank, besides tensors: the CUDA context (~0.5 GiB), NCCL buffers and allocator fragmentation."""
VLLM_RESERVE = 3 * GiB
"""Per rollout GPU, inside vLLM's share but not KV cache: CUDA context, CUDA graphs, the profiling run's
activations and the sampler's logits."""
VLLM_DEFAULT_UTILIZATION = 0.9
"""vLLM's ``gpu_memory_utilization`` when the profile sets none."""
LOGPROB_COPIES = 5
"""fp32 ``[chunk, vocab]`` tensors alive at once in one log-prob/entropy chunk, forward or backward
(``isosweep.algo.grpo._chunk_stats``: the upcast, the tempered logits, ``logsumexp``'s exponentials, the
softmax and its product with the logits; the backward's gradients of as many). ``tests/trial/test_step.py``
measures the growth per chunk position on CPU and checks it stays above two copies."""
PACKING_BYTES = GiB
"""vLLM's packed NCCL broadcast sends the weights in buffers of about this size."""

QWEN25: dict[str, dict[str, int | bool]] = {
    "0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, tie_word_embeddings=True, vocab_size=151_936),
    "1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, tie_word_embeddings=True, vocab_size=151_936),
    "3B": dict(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
               intermediate_size=11008, tie_word_embeddings=True, vocab_size=151_936),
    "7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, tie_word_embeddings=False, vocab_size=152_064),
    "14B": dict(hidden_size=5120, num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8,
                intermediate_size=13824, tie_word_embeddings=False, vocab_size=152_064),
    "32B": dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
                intermediate_size=27648, tie_word_embeddings=False, vocab_size=152_064),
}
"""Architectures of Qwen2.5 base and ``-Instruct`` models (their hub ``config.json``): 151,936 embedding rows up to
3B, 152,064 from 7B (the same 151,665-token tokenizer, padded further)."""


def model_config(name: str):
    """The Hugging Face config of ``model.name``, without weights: a Qwen2.5 hub name (``Qwen/Qwen2.5-7B``,
    ``-Instruct`` too) from :data:`QWEN25`, a tiny size, a local path's ``config.json``, else the hub's
    ``config.json`` (downloaded, a few kB)."""
    from transformers import AutoConfig, Qwen2Config  # reason: seconds to import, only when a plan is made

    size = name.removeprefix("Qwen/Qwen2.5-").removesuffix("-Instruct")
    if name.startswith("Qwen/Qwen2.5-") and size in QWEN25:
        return Qwen2Config(**QWEN25[size])
    if name in SIZES:
        from isosweep.models.family import qwen2_config  # transformers

        return qwen2_config(name, CHAR_VOCAB, 0, 1)
    return AutoConfig.from_pretrained(name)


@dataclass(frozen=True)
class ModelShape:
    """What the memory of a decoder-only model depends on, counted on a meta-device model."""

    params: int
    """Parameters (tied embeddings counted once)."""
    largest_layer: int
    """Parameters of the largest module (its own, not its children's): ZeRO-3 gathers one at a time."""
    linear: int
    """Weights of the decoder blocks' linear layers: what vLLM's fp8 quantizes (not embeddings, head, norms)."""
    hidden: int
    """Model width."""
    layers: int
    """Decoder blocks."""
    kv_heads: int
    """Key/value heads (grouped-query attention)."""
    head_dim: int
    """Width of one attention head."""
    intermediate: int
    """Width of the gated MLP."""
    vocab: int
    """Rows of the embedding and the output head: the logits' last dimension."""


def model_shape(config) -> ModelShape:
    """Count the parameters of ``config``'s causal LM on the meta device (no memory, no weights)."""
    return _counted(type(config), config.to_json_string())


@functools.lru_cache(maxsize=32)
def _counted(kind: type, config_json: str) -> ModelShape:
    import torch  # reason: seconds to import, only when a plan is made
    from transformers import AutoModelForCausalLM  # reason: as torch

    config = kind.from_dict(json.loads(config_json))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    heads = config.num_attention_heads
    return ModelShape(
        params=sum(p.numel() for p in model.parameters()),
        largest_layer=max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()),
        linear=linear, hidden=config.hidden_size, layers=config.num_hidden_layers,
        kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        intermediate=config.intermediate_size, vocab=config.vocab_size)


def _share(nbytes: int, ranks: int) -> int:
    return -(-nbytes // ranks)


def model_states(params: int, largest_layer: int, *, world: int, zero_stage: int, bf16: bool) -> tuple[int, int, int]:
    """``(weights, gradients, optimizer)`` bytes on one of ``world`` ranks at a ZeRO stage.

    bf16: weights 2 bytes/param (/ world at ZeRO-3, plus a ``4 * largest_layer`` gather buffer); gradients 2
    bf16 (/ world from ZeRO-2) plus the 4-byte fp32 partition of the optimizer step (/ world from ZeRO-1; at
    ZeRO-3 the gradient partition is fp32 itself, 4 / world in all); optimizer 4 master + 8 Adam (/ world
    from ZeRO-1). fp32: 4 + 4 + 12 with the same sharding and no extra copies.
    """
    w_ranks = world if zero_stage == 3 else 1
    g_ranks = world if zero_stage >= 2 else 1
    o_ranks = world if zero_stage >= 1 else 1
    gather = 4 * largest_layer if zero_stage == 3 else 0
    if not bf16:
        return _share(4 * params, w_ranks) + gather, _share(4 * params, g_ranks), _share(12 * params, o_ranks)
    gradients = (_share(4 * params, world) if zero_stage == 3
                 else _share(2 * params, g_ranks) + _share(4 * params, o_ranks))
    return _share(2 * params, w_ranks) + gather, gradients, _share(12 * params, o_ranks)


def layer_activation_bytes(shape: ModelShape, tokens: int, bf16: bool) -> int:
    """Bytes one decoder layer keeps for its backward pass over ``tokens`` tokens (``micro_batch * seq``).

    Per token: each RMSNorm an fp32 copy of its input (4 h bytes, two norms); attention the q/k/v input (h),
    q, k, v (h + 2 kv_heads head_dim) and its output (h); the gated MLP its input (h), gate, up, SiLU(gate)
    and the down projection's input (4 intermediate), at 2 bytes each in bf16 (flash/SDPA attention: no
    ``seq x seq`` scores are kept).
    """
    act = 2 if bf16 else 4
    kv = shape.kv_heads * shape.head_dim
    per_token = 2 * 4 * shape.hidden + act * (4 * shape.hidden + 2 * kv + 4 * shape.intermediate)
    return tokens * per_token


def activation_bytes(shape: ModelShape, *, micro_batch: int, seq_len: int, gradient_checkpointing: bool,
                     bf16: bool) -> int:
    """Activation bytes of one forward/backward of ``micro_batch`` sequences of ``seq_len`` tokens.

    Without checkpointing every layer's set (:func:`layer_activation_bytes`) is kept; with it, each layer's
    input (``hidden`` per token) and one layer's set recomputed in the backward pass. Either way one more
    layer's set as the backward's working memory, and the final norm's fp32 input and the head's input.
    """
    tokens = micro_batch * seq_len
    act = 2 if bf16 else 4
    layer = layer_activation_bytes(shape, tokens, bf16)
    final = tokens * shape.hidden * (4 + act)
    if gradient_checkpointing:
        return shape.layers * tokens * shape.hidden * act + 2 * layer + final
    return (shape.layers + 1) * layer + final


def logits_bytes(vocab: int, *, chunk: int, tokens: int, bf16: bool) -> int:
    """The output head's logits of one log-prob chunk ``[chunk, vocab]`` (bf16 on a GPU) and their gradient: 2
    copies. The whole ``[micro_batch, seq, vocab]`` logits never exist: the head runs chunk by chunk
    (``isosweep.algo.grpo.chunked_token_stats``; ``tokens`` caps ``chunk``)."""
    return 2 * min(chunk, tokens) * vocab * (2 if bf16 else 4)


def logprob_chunk_bytes(vocab: int, *, chunk: int, tokens: int) -> int:
    """:data:`LOGPROB_COPIES` fp32 ``[chunk, vocab]`` tensors of one log-prob chunk (``tokens`` caps ``chunk``)."""
    return LOGPROB_COPIES * min(chunk, tokens) * vocab * 4


@dataclass(frozen=True)
class TrainerMemory:
    """Bytes on one trainer rank (GPU) at its peak."""

    weights: int
    """Policy weights (ZeRO-3: this rank's partition and the gather buffer)."""
    gradients: int
    """Gradients, bf16 and the fp32 partition of the optimizer step."""
    optimizer: int
    """fp32 master weights and Adam moments."""
    activations: int
    """Saved activations of one micro-batch (:func:`activation_bytes`)."""
    logits: int
    """The head's logits of one log-prob chunk and their gradient (:func:`logits_bytes`)."""
    logprob_chunk: int
    """fp32 tensors of one log-prob/entropy chunk."""
    reference: int
    """The reference model's bf16 weights (partitioned like the policy's under ZeRO-3)."""
    overhead: int
    """CUDA context, NCCL buffers, allocator fragmentation (:data:`OVERHEAD`)."""
    publish: int = 0
    """Publishing the weights after the step, while no activations are alive: one parameter at a time is gathered
    (ZeRO-3) and cast to bf16, and vLLM packs what it sends in buffers of :data:`PACKING_BYTES`
    (``isosweep.trial.learner.GatheredWeights``)."""

    @property
    def states(self) -> int:
        """Model states: weights, gradients and optimizer."""
        return self.weights + self.gradients + self.optimizer

    @property
    def pass_peak(self) -> int:
        """What one forward/backward adds: activations, logits and a log-prob chunk."""
        return self.activations + self.logits + self.logprob_chunk

    @property
    def total(self) -> int:
        """Peak bytes: what stays (states, reference, overhead) plus the larger of a pass and a publication."""
        return self.states + self.reference + self.overhead + max(self.pass_peak, self.publish)


def trainer_memory(model_config, *, micro_batch: int, seq_len: int, world: int, zero_stage: int, bf16: bool,
                   gradient_checkpointing: bool, logprob_chunk: int, reference: bool = True) -> TrainerMemory:
    """Peak memory of one of ``world`` trainer ranks training ``micro_batch`` sequences of ``seq_len`` tokens
    per forward/backward (``model_config``: a Hugging Face config, see :func:`model_config`)."""
    shape = model_shape(model_config)
    weights, gradients, optimizer = model_states(shape.params, shape.largest_layer, world=world,
                                                 zero_stage=zero_stage, bf16=bf16)
    dtype = 2 if bf16 else 4
    ref = _share(dtype * shape.params, world if zero_stage == 3 else 1) if reference else 0
    return TrainerMemory(
        weights=weights, gradients=gradients, optimizer=optimizer,
        activations=activation_bytes(shape, micro_batch=micro_batch, seq_len=seq_len,
                                     gradient_checkpointing=gradient_checkpointing, bf16=bf16),
        logits=logits_bytes(shape.vocab, chunk=logprob_chunk, tokens=micro_batch * seq_len, bf16=bf16),
        logprob_chunk=logprob_chunk_bytes(shape.vocab, chunk=logprob_chunk, tokens=micro_batch * seq_len),
        reference=ref, overhead=OVERHEAD, publish=PACKING_BYTES + 2 * shape.largest_layer * (zero_stage == 3))


@dataclass(frozen=True)
class RolloutMemory:
    """One rollout GPU of a vLLM engine: what its share holds, and how many tokens its KV cache fits."""

    budget: int
    """``gpu_memory_utilization`` x the GPU's bytes."""
    weights: int
    """This GPU's slice of the weights."""
    reserve: int
    """:data:`VLLM_RESERVE`."""
    kv_bytes_per_token: int
    """K and V of one token over all layers, this GPU's KV heads, bf16."""
    seq_len: int
    """Tokens of one padded sequence (prompt + ``rollout.max_new_tokens``)."""

    @property
    def kv_cache(self) -> int:
        """Bytes left for the KV cache (negative: the weights alone overflow the share)."""
        return self.budget - self.weights - self.reserve

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds."""
        return max(self.kv_cache, 0) // self.kv_bytes_per_token

    @property
    def sequences(self) -> int:
        """Sequences of ``seq_len`` tokens the KV cache holds at once."""
        return self.kv_tokens // self.seq_len


def rollout_memory(model_config, *, gpu_bytes: int, utilization: float, tensor_parallel: int, fp8: bool,
                   seq_len: int) -> RolloutMemory:
    """One of ``tensor_parallel`` GPUs of a vLLM engine: fp8 quantizes the blocks' linear weights (1 byte),
    embeddings, head and norms stay bf16; KV bytes per token ``2 * layers * kv_heads/TP * head_dim * 2``."""
    shape = model_shape(model_config)
    weight_bytes = (shape.linear * 1 + (shape.params - shape.linear) * 2) if fp8 else 2 * shape.params
    kv_heads = _share(shape.kv_heads, tensor_parallel)  # fewer KV heads than GPUs: vLLM replicates them
    return RolloutMemory(budget=int(utilization * gpu_bytes), weights=_share(weight_bytes, tensor_parallel),
                         reserve=VLLM_RESERVE, kv_bytes_per_token=2 * shape.layers * kv_heads * shape.head_dim * 2,
                         seq_len=seq_len)


@dataclass(frozen=True)
class TrialMemory:
    """The memory plan of one grid point on its GPU profile."""

    key: str
    """The grid point (``n8-Bp64``) or, in an HPO study, the model size."""
    profile: str
    gpu_bytes: int | None
    """Memory of one GPU (the profile's ``gpu_memory_gib``); None: unknown, nothing is refused."""
    micro_batch: int
    """Sequences per forward/backward on one rank (``trainer.micro_batch``, capped by the share)."""
    share: int
    """Sequences one rank trains per step: ``Bp * n / num_workers``."""
    seq_len: int
    """Tokens of one padded sequence."""
    zero_stage: int
    """The stage DeepSpeed gets (the profile's, else the trial's)."""
    checkpointing: bool
    """``trainer.gradient_checkpointing``."""
    trainer: TrainerMemory
    rollout: RolloutMemory | None
    """None when the rollouts are not served by vLLM."""
    fitting_micro_batch: int | None
    """Largest power-of-two micro-batch (up to the share) whose trainer rank fits; None if none does."""

    def problems(self, source: str) -> list[str]:
        """What does not fit, one message each, naming the grid point and what to change."""
        out = []
        gib = self.gpu_bytes / GiB if self.gpu_bytes else 0.0
        if self.gpu_bytes and self.trainer.total > self.gpu_bytes:
            t = self.trainer
            fix = (f"set trainer.micro_batch to {self.fitting_micro_batch} or less"
                   if self.fitting_micro_batch else "no trainer.micro_batch fits")
            out.append(
                f"{source}: grid point {self.key}: a trainer rank needs {t.total / GiB:.1f} GiB of the {gib:.0f} GiB "
                f"GPUs of profile {self.profile} (model states {t.states / GiB:.1f}, activations "
                f"{t.activations / GiB:.1f}, logits {t.logits / GiB:.1f} GiB at trainer.micro_batch {self.micro_batch} "
                f"sequences of {self.seq_len} tokens, ZeRO-{self.zero_stage}); {fix}, or set "
                f"trainer.gradient_checkpointing: true, a higher ZeRO stage (trainer.zero_stage or the profile's "
                f"deepspeed.zero_stage), or a profile with more trainer GPUs")
        r = self.rollout
        if self.gpu_bytes and r is not None and r.sequences < 1:
            out.append(
                f"{source}: grid point {self.key}: a rollout GPU's vLLM share ({r.budget / GiB:.1f} GiB) holds weights "
                f"of {r.weights / GiB:.1f} GiB and a {VLLM_RESERVE / GiB:.0f} GiB reserve, leaving KV cache for "
                f"{r.kv_tokens} tokens, less than one sequence of {self.seq_len}; raise vllm.gpu_memory_utilization, "
                f"use rollout.precision fp8, or a profile with a larger vllm.tensor_parallel_size")
        return out


def plan_trial(key: str, cfg: TrialConfig, prompt_tokens: int) -> TrialMemory | None:
    """The memory plan of trial ``cfg`` (None on a CPU profile): sequences padded to ``prompt_tokens +
    rollout.max_new_tokens``, the ZeRO stage and bf16 as DeepSpeed will get them."""
    profile = get_profile(cfg.profile)
    if profile.accelerator == "cpu":
        return None
    config = model_config(cfg.model.name)
    ds = deepspeed_overrides(profile, cfg.trainer.zero_stage)
    stage, bf16 = ds["zero_optimization"]["stage"], ds["bf16"]["enabled"]
    share = cfg.Bp * cfg.n // cfg.trainer.num_workers
    seq_len = prompt_tokens + cfg.rollout.max_new_tokens
    gpu = int(profile.gpu_memory_gib * GiB) if profile.gpu_memory_gib else None

    def trainer(micro_batch: int) -> TrainerMemory:
        return trainer_memory(config, micro_batch=micro_batch, seq_len=seq_len, world=cfg.trainer.num_workers,
                              zero_stage=stage, bf16=bf16, gradient_checkpointing=cfg.trainer.gradient_checkpointing,
                              logprob_chunk=cfg.trainer.logprob_chunk)

    micro_batch = min(cfg.trainer.micro_batch or share, share)
    fitting = [2**i for i in range(share.bit_length()) if gpu and 2**i <= share and trainer(2**i).total <= gpu]
    rollout = None
    if rollout_engine(cfg) == "vllm" and gpu:
        engine = vllm_engine_args(profile, cfg.rollout.precision)
        rollout = rollout_memory(config, gpu_bytes=gpu, tensor_parallel=profile.vllm.tensor_parallel_size,
                                 utilization=profile.vllm.gpu_memory_utilization or VLLM_DEFAULT_UTILIZATION,
                                 fp8="quantization" in engine, seq_len=seq_len)
    return TrialMemory(key=key, profile=cfg.profile, gpu_bytes=gpu, micro_batch=micro_batch, share=share,
                       seq_len=seq_len, zero_stage=stage, checkpointing=cfg.trainer.gradient_checkpointing,
                       trainer=trainer(micro_batch), rollout=rollout, fitting_micro_batch=max(fitting, default=None))


def plan_trials(points: list[tuple[str, TrialConfig]], prompt_tokens: int) -> list[TrialMemory]:
    """:func:`plan_trial` of each ``(key, cfg)`` on a GPU profile (CPU profiles are left out)."""
    return [m for key, cfg in points if (m := plan_trial(key, cfg, prompt_tokens)) is not None]


def memory_table(plans: list[TrialMemory], prompt_tokens: int) -> list[str]:
    """The dry run's memory lines: one per grid point, GiB per trainer rank and per rollout GPU."""
    if not plans:
        return ["memory plan: skipped (CPU profiles: no GPU memory to plan)"]
    profiles = ", ".join(sorted({f"{m.profile}: {m.gpu_bytes / GiB:.0f} GiB" if m.gpu_bytes else
                                 f"{m.profile}: no gpu_memory_gib, not checked" for m in plans}))
    new_tokens = plans[0].seq_len - prompt_tokens
    k = max(14, *(len(m.key) + 1 for m in plans))
    lines = [f"memory per GPU in GiB ({profiles}; sequences of {prompt_tokens} prompt + {new_tokens} new tokens; "
             f"{OVERHEAD / GiB:.0f} GiB CUDA context and allocator counted per trainer rank)",
             f"{'':{k + 20}} | {'trainer rank':<48}| rollout GPU",
             f"{'trial':<{k}}{'mb/share':>10}{'ckpt':>5}{'ZeRO':>5} | {'states':>6}{'ref':>6}{'act':>7}{'logits':>7}"
             f"{'chunk':>6}{'total':>7}{'free':>7}  | {'weights':>7}{'KV':>7}{'KV tokens':>11}{'seqs':>7}"]
    for m in plans:
        t, r = m.trainer, m.rollout
        free = f"{(m.gpu_bytes - t.total) / GiB:7.1f}" if m.gpu_bytes else f"{'?':>7}"
        roll = (f"{r.weights / GiB:7.1f}{r.kv_cache / GiB:7.1f}{r.kv_tokens:>11,}{r.sequences:>7,}" if r
                else f"{'-':>7}{'-':>7}{'-':>11}{'-':>7}")
        lines.append(f"{m.key:<{k}}{f'{m.micro_batch}/{m.share}':>10}{'yes' if m.checkpointing else 'no':>5}"
                     f"{m.zero_stage:>5} | {t.states / GiB:6.1f}{t.reference / GiB:6.1f}{t.activations / GiB:7.1f}"
                     f"{t.logits / GiB:7.1f}{t.logprob_chunk / GiB:6.1f}{t.total / GiB:7.1f}{free}  | {roll}")
    known = [m for m in plans if m.gpu_bytes]
    if known:
        tight = min(known, key=lambda m: m.gpu_bytes - m.trainer.total)
        lines.append(f"tightest trainer rank: {tight.key}, {(tight.gpu_bytes - tight.trainer.total) / GiB:.1f} GiB "
                     f"free of {tight.gpu_bytes / GiB:.0f} ({tight.trainer.total / tight.gpu_bytes:.0%} used)")
    return lines


def refuse_unfit(plans: list[TrialMemory], source: str | Path) -> None:
    """Raise a :class:`ConfigError` listing every grid point that does not fit its GPUs."""
    problems = [p for m in plans for p in m.problems(str(source))]
    if problems:
        raise ConfigError("\n".join(problems))
