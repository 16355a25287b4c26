"""A vLLM rollout engine behind the ``RolloutEngine`` interface of :mod:`isosweep.rollout`.

``VLLMEngine`` is a drop-in for ``HFEngine``: same ``generate(prompts, n, seed)`` and
``update_weights(state_dict, version)``, same ``Rollouts`` layout (sample ``i * n + j`` is the
j-th of prompt i, completions end with ``<eos>`` when they finished), and log-probs of the
*processed* sampling distribution (``logprobs_mode="processed_logprobs"``: after temperature;
top-k and top-p are off), which is what the trainer recomputes with ``token_logprobs``.

Weights reach the engine in one of two ways (``weight_sync``):
- ``"shm"`` (default): ``update_weights`` writes a safetensors file to shared memory and every worker
  reloads it in place through :class:`WeightSync`, a vLLM worker extension that also refreshes a
  tied LM head (vLLM's reload leaves it stale on a CPU). The workers must see the caller's
  ``/dev/shm``: a one-node path, and the only one on a CPU.
- ``"nccl"`` (GPUs only): the engine is started with vLLM's weight-transfer engine
  (``weight_transfer_config={"backend": "nccl"}``) and the trainer broadcasts its GPU tensors to the
  workers with :class:`isosweep.rollout.weight_sync.NcclWeightSender`, which drives the actor-side calls
  ``init_weight_transfer``, ``start_weight_update``, ``receive_weights``, ``finish_weight_update``
  and ``set_policy_version``. The ``"shm"`` path keeps working on such an engine.

Precision (``precision="fp8"``):
- on a GPU, vLLM's online ``fp8_per_channel`` quantization (FP8 weights with one scale per output
  channel, FP8 activations with one scale per token) is applied at load and at every reload;
- on a CPU, where vLLM has no FP8 kernels, the weights are rounded through the same per-channel FP8
  grid (:func:`isosweep.rollout.fp8.fp8_state_dict`) and served in bf16, from version 0 on: the rollout
  policy then differs from the trainer's by the FP8 weight error only; activations stay bf16.

Integer precisions (``int8`` ... ``int2``, a ladder of larger rollout errors for correction studies): the
weights are rounded to that many bits per output channel (:func:`isosweep.rollout.fp8.int_roundtrip`)
and served in bf16, on a GPU too; weight-only emulation, needing ``weight_sync="shm"``.

``spawn_rollout_actor`` runs the engine as a Ray actor, in a bundle of a placement group or outside any.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import torch
from safetensors.torch import save_file
from torch import Tensor
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from isosweep.rollout import vllm_available  # noqa: F401  (re-exported: "is the vllm engine usable here?")
from isosweep.rollout.base import Rollouts, WeightSyncMode
from isosweep.rollout.fp8 import INT_BITS, rounded_state_dict
from isosweep.rollout.placement import ACTOR_NAMESPACE

if TYPE_CHECKING:
    from ray.actor import ActorHandle

Precision = Literal["bf16", "fp8", "int8", "int6", "int4", "int3", "int2"]

CPU_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process: starts in about half the time
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default sizes the cache from the machine's memory
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # the default pins every engine to core 0
}
"""Environment vLLM reads on a CPU; a variable the user already set keeps its value."""
CPU_MAX_MODEL_LEN = 512
"""Cap on the context length on a CPU, which keeps vLLM's profiling batch small."""
SHM = "/dev/shm"
"""Where weight files are staged for the engine's loader: memory, not disk."""


def engine_env(gpu: bool) -> dict[str, str]:
    """The environment variables a (CPU) engine needs, the caller's own settings winning."""
    return {} if gpu else {key: os.environ.get(key, value) for key, value in CPU_ENV.items()}


def prompt_seed(seed: int, index: int) -> int:
    """Seed of prompt ``index``'s request; vLLM gives its j-th sample ``prompt_seed + j``.

    Hashed rather than ``seed + index`` so that the samples of neighbouring prompts, and of
    neighbouring ``generate`` seeds, never share a random stream.
    """
    return random.Random(f"{seed}:prompt:{index}").getrandbits(48)


class WeightSync:
    """Methods mixed into every vLLM worker (``worker_extension_cls``), called with ``collective_rpc``."""

    def load_weights_from(self, weights_path: str) -> None:
        """Reload the model in place from the safetensors files in ``weights_path``.

        With tied embeddings the checkpoint has no ``lm_head.weight``: the reload refills the shared
        matrix through ``embed_tokens`` but does not reprocess the head, and on a CPU the head
        multiplies by a packed copy made at load time, which would keep the old embedding.
        """
        self.reload_weights(weights_path=weights_path)
        head = getattr(self.get_model(), "lm_head", None)
        method = getattr(head, "quant_method", None)  # absent on pipeline stages without the head
        if getattr(self.model_config.hf_text_config, "tie_word_embeddings", False) and method is not None:
            method.process_weights_after_loading(head)


def llm_kwargs(
    model_path: str,
    precision: Precision,
    seed: int,
    gpu: bool,
    max_position_embeddings: int | None,
    overrides: Mapping[str, Any] | None,
    weight_sync: WeightSyncMode = "shm",
) -> dict[str, Any]:
    """Arguments of ``vllm.LLM`` for one engine; ``overrides`` (e.g. ``tensor_parallel_size``,
    ``gpu_memory_utilization``, ``max_model_len``) replace or extend them."""
    kwargs: dict[str, Any] = {
        "model": model_path,
        "dtype": "bfloat16",
        "load_format": "safetensors",  # never a pickled pytorch_model.bin
        "seed": seed,
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": f"{WeightSync.__module__}.{WeightSync.__qualname__}",
    }
    if gpu:
        if precision == "fp8":
            # vLLM 0.32's "fp8" only reads FP8 checkpoints; online quantization of bf16 weights is
            # the per-channel shorthand, whose weight grid fp8.fp8_roundtrip reproduces.
            kwargs["quantization"] = "fp8_per_channel"
        if weight_sync == "nccl":
            # Every worker gets vLLM's NCCLWeightTransferEngine, which joins the trainer's group later.
            kwargs["weight_transfer_config"] = {"backend": "nccl"}
    else:
        kwargs["enforce_eager"] = True
        kwargs["max_model_len"] = min(max_position_embeddings or CPU_MAX_MODEL_LEN, CPU_MAX_MODEL_LEN)
    kwargs.update(overrides or {})
    return kwargs


def staging_root(nbytes: int) -> str | None:
    """``/dev/shm`` when it exists with room to spare (Ray's object store lives there too), else the temp dir."""
    if os.path.isdir(SHM) and shutil.disk_usage(SHM).free > 2 * nbytes:
        return SHM
    return None


class VLLMEngine:
    """Rollout engine on a vLLM ``LLM`` in this process, holding its own copy of the weights.

    On a CPU the engine core runs inside this process, which brings two side effects of vLLM's:
    it seeds the global ``random``/``numpy``/``torch`` generators with ``seed``, and it replaces
    ``torch.set_num_threads`` by a no-op (the thread count stays as it was).
    """

    def __init__(
        self,
        model_path: str,
        max_new_tokens: int,
        temperature: float,
        precision: Precision = "bf16",
        seed: int = 0,
        gpu: bool | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
        weight_sync: WeightSyncMode = "shm",
    ):
        """Start the engine (seconds to minutes). ``gpu=None`` means ``torch.cuda.is_available()``;
        ``weight_sync="nccl"`` (GPUs only) readies the workers for :mod:`isosweep.rollout.weight_sync`."""
        if precision not in get_args(Precision):
            raise ValueError(f"precision must be one of {', '.join(get_args(Precision))}, got {precision!r}")
        if precision in INT_BITS and weight_sync == "nccl":
            raise ValueError(f"precision {precision!r} is emulated by rounding the weights sent through shared "
                             f"memory; it needs weight_sync 'shm'")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if weight_sync not in ("shm", "nccl"):
            raise ValueError(f"weight_sync must be 'shm' or 'nccl', got {weight_sync!r}")
        self.model_path = model_path
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.precision = precision
        self.gpu = torch.cuda.is_available() if gpu is None else gpu
        if weight_sync == "nccl" and not self.gpu:
            raise ValueError("weight_sync='nccl' needs GPU workers (NCCL); use 'shm' on a CPU")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        config = AutoConfig.from_pretrained(model_path)
        self.tied_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        os.environ.update(engine_env(self.gpu))

        from vllm import LLM

        self.llm = LLM(**llm_kwargs(model_path, precision, seed, self.gpu,
                                    getattr(config, "max_position_embeddings", None), engine_kwargs, weight_sync))
        self.policy_version = 0
        if self.rounds_weights:
            base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16, use_safetensors=True)
            self.update_weights(base.state_dict(), version=0)

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int, at_precision: bool = True) -> None:
        """Load the trainer's weights, cast to bf16, and record their version.

        On a CPU in fp8 the bf16 weights are then rounded through FP8, as vLLM's online FP8
        quantizes the bf16 weights it loads on a GPU.

        The weights travel as one safetensors file in shared memory, read by every worker's
        :meth:`WeightSync.load_weights_from`; with tied embeddings ``lm_head.weight`` is left out
        (vLLM's loader skips it and the head shares ``embed_tokens``).
        """
        skipped = self.skipped_weights()
        state = {name: tensor.detach().to("cpu", torch.bfloat16)
                 for name, tensor in state_dict.items() if name not in skipped}
        if self.rounds_weights and at_precision:  # at_precision=False: an evaluation of the bf16 weights
            state = rounded_state_dict(state, self.precision)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        with tempfile.TemporaryDirectory(prefix="isosweep-weights-", dir=staging_root(nbytes)) as directory:
            save_file({name: t.contiguous() for name, t in state.items()}, str(Path(directory) / "model.safetensors"))
            self.llm.collective_rpc("load_weights_from", kwargs={"weights_path": directory})
        # Cached prompt KV blocks were computed by the old weights.
        self.llm.reset_prefix_cache()
        self.policy_version = version

    @property
    def rounds_weights(self) -> bool:
        """Whether this engine rounds the weights it serves itself: FP8 on a CPU (no FP8 kernels) and the
        integer precisions everywhere (vLLM has no online int-k quantization of bf16 weights)."""
        return (self.precision == "fp8" and not self.gpu) or self.precision in INT_BITS

    def skipped_weights(self) -> list[str]:
        """State-dict names the engine does not load: ``lm_head.weight`` with tied embeddings (the head
        shares ``embed_tokens``; vLLM's loader rejects the alias when it arrives without it)."""
        return ["lm_head.weight"] if self.tied_embeddings else []

    # The calls below serve weight_sync="nccl"; isosweep.rollout.weight_sync.NcclWeightSender makes them, in
    # this order, while the trainer joins the same NCCL group and broadcasts.

    def transfer_workers(self) -> int:
        """How many vLLM workers (tensor x pipeline parallel) join the transfer group."""
        return self.llm.llm_engine.vllm_config.parallel_config.world_size_across_dp

    def init_weight_transfer(self, init_info: Mapping[str, Any]) -> None:
        """Join the trainer's NCCL group (vLLM's ``NCCLWeightTransferInitInfo`` fields: ``master_address``,
        ``master_port``, ``rank_offset``, ``world_size`` and the packing parameters); blocks until the
        sender joins too."""
        self.llm.init_weight_transfer_engine({"init_info": dict(init_info)})

    def start_weight_update(self) -> None:
        """Prepare every worker's model for a layerwise reload."""
        self.llm.start_weight_update()

    def receive_weights(self, update_info: Mapping[str, Any]) -> None:
        """Receive the broadcast announced by ``update_info`` (``names``, ``dtype_names``, ``shapes``, in
        the order they are sent) and load it; returns once every tensor has arrived."""
        self.llm.update_weights({"update_info": dict(update_info)})

    def finish_weight_update(self) -> None:
        """Finish the reload (FP8 weights are requantized here) and drop the prefix cache."""
        self.llm.finish_weight_update()
        # Cached prompt KV blocks were computed by the old weights.
        self.llm.reset_prefix_cache()

    def set_policy_version(self, version: int) -> None:
        """Record the version of the weights that ``finish_weight_update`` put in place."""
        self.policy_version = version

    def shutdown_weight_transfer(self) -> None:
        """Leave the trainer's NCCL group; the engine keeps serving."""
        self.llm.shutdown_weight_transfer_engine()

    def generate(self, prompts: Sequence[str], n: int, seed: int, temperature: float | None = None) -> Rollouts:
        """Sample ``n`` completions for each prompt at ``temperature`` (None: the engine's); deterministic for a
        given ``seed`` and weights."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        encoded = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        params = [
            SamplingParams(n=n, temperature=self.temperature if temperature is None else temperature, top_k=0, top_p=1.0, max_tokens=self.max_new_tokens,
                           logprobs=0, seed=prompt_seed(seed, index), detokenize=False)
            for index in range(len(encoded))
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in encoded], params, use_tqdm=False)
        prompt_ids: list[list[int]] = []
        completion_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        for ids, output in zip(encoded, outputs):
            for sample in sorted(output.outputs, key=lambda s: s.index):
                tokens = list(sample.token_ids)
                prompt_ids.append(list(ids))
                completion_ids.append(tokens)
                # logprobs=0 returns exactly the sampled token at each step
                logprobs.append([step[token].logprob for step, token in zip(sample.logprobs, tokens)])
        eos = self.tokenizer.eos_token_id
        texts = self.tokenizer.batch_decode(
            [ids[:-1] if ids and ids[-1] == eos else ids for ids in completion_ids],
            skip_special_tokens=True,
        )
        return Rollouts(prompt_ids, completion_ids, logprobs, texts, self.policy_version)



def spawn_rollout_actor(model_path: str, max_new_tokens: int, temperature: float, *, num_cpus: float = 1.0,
                        num_gpus: float = 0.0, name: str | None = None, gpu: bool | None = None,
                        placement: tuple[Any, int] | None = None, **engine: Any) -> ActorHandle:
    """A Ray actor running :class:`VLLMEngine` (``engine``: its other arguments, ``precision``, ``seed``,
    ``engine_kwargs``, ``weight_sync``); call ``actor.generate.remote(...)`` and
    ``actor.update_weights.remote(...)``. ``gpu=None`` means ``num_gpus > 0``; ``name`` makes it
    a named actor that other trainer workers find with ``ray.get_actor(name)``; ``weight_sync="nccl"``
    readies it for :class:`isosweep.rollout.weight_sync.NcclWeightSender`.

    ``placement``: ``(placement_group, bundle_index)``, the bundle the actor runs in (its resources must
    be the bundle's). Without it the actor is scheduled outside any placement group the caller runs in (a
    Tune trial's): an actor captured into a group without a bundle of its own fails or hangs. Tasks the
    actor starts are not captured into the group (vLLM's tensor-parallel workers are processes of the
    actor, ``distributed_executor_backend="mp"``: see ``profiles.vllm_engine_args``).
    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    on_gpu = num_gpus > 0 if gpu is None else gpu
    actor_class = ray.remote(VLLMEngine).options(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=None if placement is None else placement[0],
            placement_group_bundle_index=-1 if placement is None else placement[1],
            placement_group_capture_child_tasks=False),
        runtime_env={"env_vars": engine_env(on_gpu)},
        name=name,
        namespace=ACTOR_NAMESPACE if name else None,
    )
    return actor_class.remote(model_path, max_new_tokens, temperature, gpu=on_gpu, **engine)
