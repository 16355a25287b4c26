"""The learner: the DeepSpeed engine around the Hugging Face policy, one per trainer worker.

("Trainer" in isosweep means the Ray Train job and its workers; the learner is what each of them
updates.)

Every trial trains through DeepSpeed, whether it runs as a Ray Train job with several workers
or in one process (tests, debugging): in one process a world of size 1 is set up on loopback.
ZeRO stage, gradient clipping and precision come from the trial config and its hardware
profile: gloo and fp32 master weights on CPU; NCCL and bf16 on GPU.

DeepSpeed owns the optimizer state (partitioned across workers under ZeRO), so it also writes
and reads that part of a checkpoint (``save_state`` / ``load_state``); the model itself is saved
with ``save_pretrained`` by the trial, so a checkpoint stays loadable by ``from_pretrained``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _world

from isosweep.spec.profiles import deepspeed_overrides, get_profile
from isosweep.spec.trial import TrialConfig, learning_rate, warmup_fraction, width_factor, width_scaled
from isosweep.trial.localhost import LOOPBACK, free_port

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""The variables a launcher (Ray Train, torchrun) gives each worker, and :func:`init_distributed` sets for a world of one."""


def forget_launcher_env() -> None:
    """Drop launcher variables this process has but no process group behind them: inherited from a parent that
    trained in process (a test, a driver), they would make a world of one rendezvous at the parent's old port --
    two trials at once then race for it, and torch's TCP store listens on every interface."""
    if not dist.is_initialized():
        for key in LAUNCHER_ENV:
            os.environ.pop(key, None)


def init_distributed(backend: str) -> tuple[int, int]:
    """Join (or create, as a world of one) the trainer's process group; returns ``(rank, world_size)``.

    A world of one made here keeps its rendezvous in memory (a ``HashStore``, where ``env://`` would start
    torch's TCP store server, which listens on every interface) and gloo on the loopback interface: a trial
    run in process opens no socket beyond this machine.
    """
    alone = False
    if "RANK" not in os.environ:  # not launched by Ray Train or torchrun: a world of one
        if dist.is_initialized():
            # a group this process already has (an in-process vLLM engine makes one): DeepSpeed joins it,
            # but reads the launcher's variables
            os.environ.update(RANK=str(dist.get_rank()), WORLD_SIZE=str(dist.get_world_size()), LOCAL_RANK="0",
                              LOCAL_WORLD_SIZE="1")
        else:
            os.environ.update(MASTER_ADDR=LOOPBACK, MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1",
                              LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
            alone = True
    if backend == "gloo":  # before DeepSpeed sets up its backend: here, or in make_learner if Ray Train made the group
        without_shm_allreduce()
    if not dist.is_initialized():
        if alone:  # DeepSpeed joins a group that exists (as it does an in-process vLLM engine's)
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            import deepspeed

            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)
    _forget_stale_deepspeed_groups()
    return dist.get_rank(), dist.get_world_size()


def without_shm_allreduce() -> None:
    """Keep DeepSpeed on CPU from JIT-compiling its shared-memory allreduce op, which training never uses.

    DeepSpeed's communication backend builds that C++ op (``deepspeed_shm_comm``) the first time a
    process sets it up: 60-90 s with a compiler on a fresh environment (every trial of a sweep's
    first wave waited for it), a failure without one. Only DeepSpeed's inference allreduce calls it;
    a training step's allreduce goes through torch.distributed (gloo here) with or without it.
    DeepSpeed decides from its table of compatible ops, kept in ``deepspeed.ops`` so edits persist.
    """
    import deepspeed.ops  # heavy (torch extensions): only a learner needs it

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def _forget_stale_deepspeed_groups() -> None:
    """Drop DeepSpeed's cached clone of the world group when the world it cloned is gone.

    DeepSpeed clones the world group once per process and keeps it. A process that trains, then
    has its group torn down and made again (an in-process vLLM engine does both), would hand
    DeepSpeed the dead clone on its next engine ("Group ... is not registered").
    """
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is None or groups._WORLD_GROUP is None:
        return
    if groups._WORLD_GROUP not in _world.pg_group_ranks:
        groups._WORLD_GROUP = None


def micro_batches(cfg: TrialConfig, world: int) -> int:
    """Forward/backward passes of one optimizer step on each of ``world`` workers: the worker's
    ``Bp * n / world`` sequences in micro-batches of ``trainer.micro_batch`` (one pass when unset)."""
    share = cfg.Bp * cfg.n // world
    size = cfg.trainer.micro_batch or share
    return -(-share // size)


def zero_settings(cfg: TrialConfig) -> dict:
    """DeepSpeed's ``zero_optimization`` section of a trial: the stage (the profile's where it fixes one)
    and, under ZeRO-3, ``trainer.param_persistence_threshold`` where set."""
    zero = dict(deepspeed_overrides(get_profile(cfg.profile), cfg.trainer.zero_stage)["zero_optimization"])
    if zero["stage"] == 3 and cfg.trainer.param_persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = cfg.trainer.param_persistence_threshold
    return zero


def uses_bf16(cfg: TrialConfig, gpu: bool) -> bool:
    """Whether the trainer (and so the reference model) runs in bf16: on a GPU, as the profile decides."""
    return gpu and deepspeed_overrides(get_profile(cfg.profile), cfg.trainer.zero_stage)["bf16"]["enabled"]


def deepspeed_config(cfg: TrialConfig, gpu: bool, world: int = 1) -> dict:
    """The DeepSpeed config of one trial on ``world`` workers: gradient accumulation over the step's
    micro-batches (:func:`micro_batches`; the loss of each is already weighted, so DeepSpeed's sizes
    are nominal), ZeRO stage, clipping, precision.

    The ZeRO stage and bf16 come from the hardware profile where it fixes them (a GPU profile's
    trainer memory was sized for its stage), else from the trial; bf16 only ever on a GPU.
    """
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": micro_batches(cfg, world),
        "gradient_clipping": cfg.algorithm.grad_clip,
        "zero_optimization": zero_settings(cfg),
        "bf16": {"enabled": uses_bf16(cfg, gpu)},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


def group_rates(cfg: TrialConfig) -> list[float]:
    """The full rate of each of the optimizer's parameter groups, in their order: :func:`learning_rate`, and
    under ``algorithm.width_scaling: hidden`` then that rate without the width factor (the parameters it skips)."""
    full = learning_rate(cfg)
    return [full] if cfg.algorithm.width_scaling == "all" else [full, full / width_factor(cfg)]


def param_groups(policy: torch.nn.Module, cfg: TrialConfig) -> list[dict]:
    """The optimizer's parameter groups at their :func:`group_rates`: every parameter in one, or under
    ``algorithm.width_scaling: hidden`` the block matrices in the first and the rest in the second."""
    members: list[list[torch.nn.Parameter]] = [[] for _ in group_rates(cfg)]
    for name, param in policy.named_parameters():
        members[0 if width_scaled(cfg, name, param.dim()) else 1].append(param)
    if not all(members):
        raise ValueError(f"algorithm.width_scaling {cfg.algorithm.width_scaling!r}: a parameter group of "
                         f"{type(policy).__name__} is empty (its sizes: {[len(m) for m in members]})")
    return [{"params": params, "lr": rate} for params, rate in zip(members, group_rates(cfg))]


def make_learner(policy: torch.nn.Module, cfg: TrialConfig, gpu: bool):
    """Wrap ``policy`` in a DeepSpeed engine with AdamW at the square-root-scaled learning rate, with
    gradient checkpointing where ``trainer.gradient_checkpointing`` asks for it."""
    if not gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    if cfg.trainer.gradient_checkpointing:
        # non-reentrant: the reentrant variant drops the gradients of inputs that need none (the embeddings' output)
        policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    world = dist.get_world_size() if dist.is_initialized() else 1
    optimizer = torch.optim.AdamW(param_groups(policy, cfg), lr=learning_rate(cfg), betas=(0.9, 0.99), weight_decay=0.0)
    engine, *_ = deepspeed.initialize(model=policy, optimizer=optimizer, config=deepspeed_config(cfg, gpu, world))
    return engine


def make_reference(reference: torch.nn.Module, cfg: TrialConfig, gpu: bool, device: torch.device):
    """The frozen reference model on ``device``, stored as the policy is: bf16 where the trainer runs in bf16
    (a float32 reference beside a bf16 policy makes the KL non-zero at step 0), and under ZeRO-3
    partitioned over the workers like the policy (a DeepSpeed engine without an optimizer: a whole copy on
    every GPU would be 2 bytes per parameter on each). Call it on every worker: under ZeRO-3 its forward
    gathers parameters, a collective."""
    reference = reference.eval().requires_grad_(False)
    dtype = torch.bfloat16 if uses_bf16(cfg, gpu) else torch.float32
    zero = zero_settings(cfg)
    if zero["stage"] != 3:
        return reference.to(device=device, dtype=dtype)
    import deepspeed

    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero, "bf16": {"enabled": dtype == torch.bfloat16},
              "steps_per_print": 2**31 - 1}
    engine, *_ = deepspeed.initialize(model=reference, config=config)
    engine.eval()  # DeepSpeed's returns None
    return engine


class GatheredWeights(Mapping):
    """The model's weights, whole, by name, each gathered when it is read (a read-only mapping in
    ``state_dict`` order).

    Under ZeRO-3 every parameter is partitioned over the workers, and reading one is an all-gather: a
    collective that every worker must join, in the same order. So every worker reads every weight, in
    order (:meth:`drain` for the workers that need none of them), one at a time: never the whole model
    at once on a GPU. A read under ZeRO-3 returns a copy on the learner's device; otherwise the
    learner's own tensor (a view into DeepSpeed's flat buffers: copy it to keep it).
    """

    def __init__(self, engine):
        self.engine = engine
        self.module = engine.module
        self.tensors = self.module.state_dict(keep_vars=True)

    def __getitem__(self, name: str) -> torch.Tensor:
        tensor = self.tensors[name]
        if not hasattr(tensor, "ds_id"):  # not a ZeRO-3 parameter: whole on every worker
            return tensor.detach()
        import deepspeed

        with deepspeed.zero.GatheredParameters([tensor]):
            return tensor.detach().clone()

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def shapes(self) -> dict[str, torch.Size]:
        """Every weight's whole shape, read without gathering anything."""
        return {name: getattr(t, "ds_shape", t.shape) for name, t in self.tensors.items()}

    def drain(self) -> None:
        """Read every weight and drop it: a worker's part in the collectives of a read on another worker."""
        for name in self:
            self[name]


def parameter_count(module: torch.nn.Module) -> int:
    """Parameters of ``module``, whole: a ZeRO-3 partitioned parameter counts its full size, not its shard."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters())


def schedule_rate(engine, cfg: TrialConfig, step: int) -> float:
    """Set every parameter group's rate for optimizer step ``step`` (its full rate times the warm-up's
    fraction, :func:`warmup_fraction`) and return the rate of the width-scaled group (:func:`learning_rate`'s)."""
    fraction = warmup_fraction(cfg, step)
    for group, full in zip(engine.optimizer.param_groups, group_rates(cfg), strict=True):
        group["lr"] = full * fraction  # from the config, not the group: a restored state keeps its own keys
    return learning_rate(cfg) * fraction


def gathered_state_dict(engine, keep: bool = True) -> dict[str, torch.Tensor]:
    """Full (unpartitioned) weights of the model as CPU tensors with their own storage; ``{}`` where
    ``keep`` is False. Call it on every worker (under ZeRO-3 each weight is gathered, one at a time:
    :class:`GatheredWeights`); only the workers that keep the weights hold a host copy.

    Under ZeRO the parameters are views into DeepSpeed's flat buffers; serialising a view
    serialises its whole buffer, which made every weight publication ship the buffer once per
    tensor, so the copies are compact.
    """
    weights = GatheredWeights(engine)
    if not keep:
        weights.drain()
        return {}
    return {name: tensor.cpu().clone() for name, tensor in weights.items()}


def save_state(engine, directory: Path) -> None:
    """Optimizer and engine state (every rank writes its partition)."""
    engine.save_checkpoint(str(directory), tag="state", save_latest=False)


def _deepspeed_globals() -> list:
    """The only non-tensor classes in DeepSpeed's ZeRO checkpoints (found with
    ``torch.serialization.get_unsafe_globals_in_checkpoint`` on ZeRO-1 and ZeRO-2 states): plain data."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def load_weights_only(path: str, map_location=None):
    """``torch.load`` of a DeepSpeed state file that runs no code from it: ``weights_only=True`` with
    DeepSpeed's data classes allowed, in place of DeepSpeed's own loader, which would run code found in the file."""
    with torch.serialization.safe_globals(_deepspeed_globals()):
        return torch.load(path, map_location=map_location, weights_only=True)


def load_state(engine, directory: Path) -> None:
    """Restore what ``save_state`` wrote, weights and optimizer state included (loaded weights-only)."""
    engine.checkpoint_engine.load = load_weights_only
    path, _ = engine.load_checkpoint(str(directory), tag="state", load_optimizer_states=True,
                                     load_lr_scheduler_states=False)
    if path is None:
        raise RuntimeError(f"no DeepSpeed state in {directory}")
