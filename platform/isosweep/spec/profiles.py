"""Hardware profiles: the Ray resources of one trial, read from ``clusters/profiles.yaml``.

A profile fixes the *shape* of a trial on a node type: the trainer's share of CPUs/GPUs (split
evenly across its Ray Train workers), each rollout actor's share, the driver's share, and the
collective backend (gloo on CPU, NCCL on GPU). The trial config chooses how many trainer workers
and rollout actors share it.

A profile also says how the trial uses that hardware, so that the choices sized together stay
together: the DeepSpeed settings its trainer memory was planned for (ZeRO stage, bf16), the vLLM
engine arguments of its rollout actors (FP8 weights, tensor-parallel size, GPU memory share), how
many nodes one trial spans, and the Ray placement-group bundles that keep its trainer workers and
its rollout actors packed (``placement_bundles``). Every addition has a default, so a profile
written before them (``cpu-tiny``) reads as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from isosweep.spec.yamlio import ConfigError, Section, read_yaml, validate

PROFILES_FILE = Path(os.environ.get("ISOSWEEP_PROFILES", Path(__file__).resolve().parents[3] / "clusters" / "profiles.yaml"))

_EPS = 1e-9  # resource sums are floats (0.1 CPU drivers); compare with a little slack


class Resources(Section):
    """Ray resources (logical, fractions allowed)."""

    CPU: float = Field(0.0, ge=0)
    """Logical CPUs."""
    GPU: float = Field(0.0, ge=0)
    """GPUs (a whole number per trainer worker on GPU profiles)."""


class DeepSpeedSettings(Section):
    """What the profile's trainer memory budget assumes of DeepSpeed."""

    zero_stage: Literal[0, 1, 2, 3] | None = None
    """ZeRO stage the trainer share was sized for; ``None`` keeps the trial's ``trainer.zero_stage``.
    A set stage wins over the trial's: a model that only fits the trainer GPUs with its optimizer
    state partitioned (ZeRO-3) does not fit them with a smaller stage."""
    bf16: bool | None = None
    """bf16 weights and activations (fp32 master weights in the optimizer); ``None``: on GPU profiles
    only, as the trainer does today (CPU trains in fp32)."""


class VllmSettings(Section):
    """Engine arguments of every rollout actor (``vllm.LLM``) under this profile."""

    precision: Literal["bf16", "fp8"] | None = None
    """Rollout weights the profile was sized for; ``None`` leaves it to the trial's
    ``rollout.precision``. On GPU ``fp8`` becomes vLLM's online ``fp8_per_channel`` quantization
    (see ``isosweep.rollout.vllm.llm_kwargs``)."""
    tensor_parallel_size: int = Field(1, gt=0)
    """GPUs of one engine; must equal ``rollout.GPU`` on GPU profiles (an actor's GPUs are its engine's)."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """Share of each GPU vLLM may take (weights + KV cache); ``None``: vLLM's default."""


class Profile(Section):
    """Resources and layout of one trial on one node type."""

    accelerator: Literal["cpu", "gpu"]
    """``cpu``: gloo, bf16/fp32 on CPU; ``gpu``: NCCL, bf16 trainer, vLLM on CUDA."""
    node: Resources
    """What one node of this type has (a trial must fit in it unless it spans nodes)."""
    driver: Resources = Resources(CPU=0.1)
    """The trial's driver process (a Ray Tune function when a sweep runs it)."""
    trainer: Resources
    """All trainer workers together; each gets an equal share."""
    rollout: Resources
    """Each rollout actor."""
    backend: Literal["gloo", "nccl"]
    """torch.distributed backend of the trainer workers."""
    weight_sync: Literal["shm", "nccl"] = "shm"
    """How rank 0 publishes weights to the rollout actors: through shared memory / Ray's object
    store (one node), or an NCCL broadcast from the trainer's GPU to the engines' GPUs."""
    nodes: int = Field(1, gt=0)
    """Nodes one trial spans. 1: every bundle on one node (``STRICT_PACK``), weights move over
    NVLink or shared memory; more: trainer and rollout may sit on different nodes (``PACK``)."""
    node_types: tuple[str, ...] = ()
    """Machine types ``node`` describes (``p5en.48xlarge``, ``a3-ultragpu-8g``); where several, ``node``
    is what all of them have at least, so a trial sized for it fits each. Cluster YAMLs that offer
    one of these types must declare at least these resources (``tests/spec/test_clusters.py``)."""
    gpu_memory_gib: float | None = Field(None, gt=0)
    """Memory of one GPU in GiB as CUDA reports it (H200: ~139); the dry run's memory plan checks every grid
    point against it (None: estimates only, nothing refused)."""
    deepspeed: DeepSpeedSettings = DeepSpeedSettings()
    """DeepSpeed settings the trainer share was sized for."""
    vllm: VllmSettings = VllmSettings()
    """vLLM engine arguments of the rollout actors."""

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        if self.accelerator == "gpu":
            if self.rollout.GPU != self.vllm.tensor_parallel_size:
                raise ValueError(f"rollout.GPU ({self.rollout.GPU:g}) must equal vllm.tensor_parallel_size "
                                 f"({self.vllm.tensor_parallel_size}): one actor's GPUs are its engine's tensor-parallel group")
            if self.weight_sync == "shm" and self.nodes > 1:
                raise ValueError("weight_sync 'shm' needs the trial on one node; allowed with nodes > 1: nccl")
        else:
            if self.trainer.GPU or self.rollout.GPU or self.driver.GPU:
                raise ValueError("accelerator 'cpu' asks for no GPUs; allowed: trainer.GPU = rollout.GPU = driver.GPU = 0")
            if self.deepspeed.zero_stage == 3:
                raise ValueError("deepspeed.zero_stage 3 needs GPUs; allowed with accelerator 'cpu': 0, 1, 2")
            if self.vllm.tensor_parallel_size != 1:
                raise ValueError("vllm.tensor_parallel_size > 1 needs GPUs; allowed with accelerator 'cpu': 1")
        return self


def load_profiles(path: str | Path = PROFILES_FILE) -> dict[str, Profile]:
    """Every profile in ``path``, validated (errors name the file and the key)."""
    raw = read_yaml(path)
    return {name: validate(Profile, body or {}, f"{path}: profile {name!r}") for name, body in raw.items()}


def get_profile(name: str, path: str | Path = PROFILES_FILE) -> Profile:
    profiles = load_profiles(path)
    if name not in profiles:
        raise ConfigError(f"unknown hardware profile {name!r}; allowed: {', '.join(profiles)} (from {path})")
    return profiles[name]


def trial_resources(profile: Profile, workers: int, actors: int) -> dict[str, float]:
    """Total Ray resources of one trial: driver + trainer + ``actors`` rollout actors."""
    return {
        "CPU": profile.driver.CPU + profile.trainer.CPU + actors * profile.rollout.CPU,
        "GPU": profile.driver.GPU + profile.trainer.GPU + actors * profile.rollout.GPU,
    }


def _bundle(resources: Resources, share: float = 1.0) -> dict[str, float]:
    """A placement-group bundle: Ray rejects all-zero bundles and zero entries say nothing, so drop them."""
    return {k: v * share for k, v in resources.model_dump().items() if v > 0}


def placement_bundles(profile: Profile, workers: int, actors: int) -> tuple[list[dict[str, float]], str]:
    """The Ray placement group of one trial: ``(bundles, strategy)``.

    Bundles in order: the driver first (Ray Tune runs the trial's function in bundle 0), then one
    per trainer worker (``trainer / workers`` each, as Ray Train asks for them), then one per rollout
    actor. On one node the strategy is ``STRICT_PACK``: everything shares the node, so weight
    publication stays on NVLink or shared memory. Across nodes it is ``PACK``: Ray places each bundle
    on one node and fills as few nodes as it can; the rollout bundles (whole tensor-parallel groups,
    the largest) go first, so they fill a node together and the trainer workers pack onto the next
    (``pack_nodes`` shows that layout). ``check_layout`` runs first, so a layout that cannot fit
    ``profile.nodes`` nodes never reaches Ray as a placement group that waits forever.
    """
    check_layout(profile, workers, actors)
    bundles = [_bundle(profile.driver)] if _bundle(profile.driver) else []
    bundles += [_bundle(profile.trainer, 1.0 / workers) for _ in range(workers)]
    bundles += [_bundle(profile.rollout) for _ in range(actors)]
    return bundles, ("STRICT_PACK" if profile.nodes == 1 else "PACK")


def pack_nodes(profile: Profile, workers: int, actors: int) -> list[list[str]]:
    """Which parts of a trial land on which of its ``profile.nodes`` nodes, or a ``ConfigError``.

    First-fit decreasing by GPUs then CPUs (the order in which Ray's ``PACK`` fills nodes, near
    enough): returns one list of part names per node (``driver``, ``trainer[i]``, ``rollout[j]``).
    Used to check a layout before a cluster sees it, and by tests to show that trainer workers and
    rollout actors end up packed.
    """
    if workers <= 0 or actors <= 0:
        raise ConfigError(f"a trial needs at least one trainer worker and one rollout actor (got {workers} and {actors})")
    parts = [("driver", _bundle(profile.driver))] if _bundle(profile.driver) else []
    parts += [(f"trainer[{i}]", _bundle(profile.trainer, 1.0 / workers)) for i in range(workers)]
    parts += [(f"rollout[{j}]", _bundle(profile.rollout)) for j in range(actors)]
    parts.sort(key=lambda p: (-p[1].get("GPU", 0.0), -p[1].get("CPU", 0.0)))  # stable: trainer before rollout on ties
    capacity = _bundle(profile.node)
    free = [dict(capacity) for _ in range(profile.nodes)]
    layout: list[list[str]] = [[] for _ in range(profile.nodes)]
    for name, need in parts:
        for i, left in enumerate(free):
            if all(left.get(k, 0.0) + _EPS >= v for k, v in need.items()):
                for k, v in need.items():
                    left[k] = left.get(k, 0.0) - v
                layout[i].append(name)
                break
        else:
            total = trial_resources(profile, workers, actors)
            raise ConfigError(
                f"{workers} trainer worker(s) and {actors} rollout actor(s) do not fit {profile.nodes} node(s) of "
                f"{capacity}: {name} needs {need}; the trial needs {total} in all")
    return layout


def check_layout(profile: Profile, workers: int, actors: int) -> None:
    """Raise a ``ConfigError`` unless ``workers`` trainer workers and ``actors`` rollout actors make a
    trial this profile can run: each worker drives whole GPUs (DeepSpeed runs one process per GPU;
    a fraction would share a device with another worker), and the parts fit ``profile.nodes`` nodes."""
    if profile.accelerator == "gpu":
        per_worker = profile.trainer.GPU / workers if workers > 0 else 0.0
        if per_worker < 1 or abs(per_worker - round(per_worker)) > _EPS:
            raise ConfigError(f"trainer.GPU ({profile.trainer.GPU:g}) split across {workers} trainer worker(s) gives "
                              f"{per_worker:g} GPU each; allowed: a whole number of GPUs per worker "
                              f"(num_workers dividing {profile.trainer.GPU:g})")
    pack_nodes(profile, workers, actors)


def deepspeed_overrides(profile: Profile, zero_stage: int) -> dict[str, Any]:
    """The part of the DeepSpeed config a profile decides, to merge into ``learner.deepspeed_config``.

    ``zero_stage`` is the trial's ``trainer.zero_stage``, used unless the profile fixes one.
    """
    stage = profile.deepspeed.zero_stage if profile.deepspeed.zero_stage is not None else zero_stage
    bf16 = profile.deepspeed.bf16 if profile.deepspeed.bf16 is not None else profile.accelerator == "gpu"
    return {"zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16}}


def vllm_engine_args(profile: Profile, precision: Literal["bf16", "fp8"] | None = None) -> dict[str, Any]:
    """Arguments of ``vllm.LLM`` a profile decides: the ``overrides`` of ``isosweep.rollout.vllm.llm_kwargs``.

    ``precision`` is the trial's ``rollout.precision``; ``None`` takes the profile's
    (``vllm.precision``, else bf16). On GPU, fp8 is vLLM's ``quantization="fp8_per_channel"``: vLLM's
    plain ``"fp8"`` only reads FP8 checkpoints, and online per-channel quantization of the bf16
    weights is what ``isosweep.rollout.fp8`` reproduces on CPU. A tensor-parallel engine runs its workers as
    processes of its actor. A CPU profile returns nothing: ``llm_kwargs`` already sets what the CPU build needs.
    """
    if profile.accelerator == "cpu":
        return {}
    args: dict[str, Any] = {"tensor_parallel_size": profile.vllm.tensor_parallel_size}
    if profile.vllm.tensor_parallel_size > 1:
        # the actor runs in a bundle of the trial's placement group holding all its GPUs; left to choose, vLLM
        # would see that group and start its Ray executor, which wants a bundle per GPU of its own
        args["distributed_executor_backend"] = "mp"
    if (precision or profile.vllm.precision or "bf16") == "fp8":
        args["quantization"] = "fp8_per_channel"
    if profile.vllm.gpu_memory_utilization is not None:
        args["gpu_memory_utilization"] = profile.vllm.gpu_memory_utilization
    return args
