"""Trainer-to-engine weight sync over NCCL, for GPU clusters where the trainer and the rollout
engines share no memory.

Why: :class:`isosweep.rollout.vllm.VLLMEngine`'s default path stages the weights as a file in
``/dev/shm`` (and ``RolloutPool`` ships them through Ray's object store first), which needs the
trainer and the engines on one node and copies everything through host memory. Here the trainer's
GPU broadcasts straight to the engines' GPUs, on the same node or across nodes, with vLLM 0.32's own
weight-transfer machinery (``vllm.distributed.weight_transfer``): nothing below re-implements it.

How the pieces meet:

- The engines are Ray actors started with ``weight_sync="nccl"``
  (:func:`isosweep.rollout.vllm.spawn_rollout_actor`): each vLLM worker then holds an
  ``NCCLWeightTransferEngine`` (``WeightTransferConfig(backend="nccl")``).
- :class:`NcclWeightSender`, built on the trainer's rank 0 with its CUDA device current, is vLLM's
  ``NCCLTrainerWeightTransferEngine`` with two adapters: :class:`StateDictSource` (vLLM's
  ``WeightSource`` over a state dict) and :class:`RolloutActorsClient` (vLLM's
  ``VLLMWeightSyncClient`` over the actors).
- The transfer group is a ``StatelessProcessGroup`` + ``PyNcclCommunicator``, separate from the
  trainer's own ``torch.distributed`` group. Rank 0 is the sender (the trainer's rank 0, on its GPU);
  engine ``i``'s workers follow at ranks ``rank_offsets(workers)[i] + worker rank``, so
  ``world_size = 1 + sum(workers)``. vLLM's sender puts every worker at offset 1, which is right for
  one engine; with several independent engines the client gives each its own offset. Rank 0 hosts
  the rendezvous store at ``master_address:master_port``, which every engine node must reach.

Order of calls:

1. ``NcclWeightSender(actors)``: ask each actor for ``transfer_workers()`` and ``skipped_weights()``;
   then, at the same time, every actor's ``init_weight_transfer(init_info)`` (its workers join the
   group) and this process joining as rank 0. Once per group.
2. ``send(state_dict, version)``, once per optimizer step: ``start_weight_update`` on every actor;
   then, concurrently, every actor's ``receive_weights(update_info)`` (names, dtypes and shapes of
   everything that is coming, in order) and this process broadcasting the tensors in that order;
   then ``finish_weight_update`` (layerwise reload finalized, FP8 requantized, prefix cache dropped)
   and ``set_policy_version(version)``.

What travels: over NCCL, only weight bytes (every tensor of the state dict, cast to bf16 on the
trainer's GPU, packed into chunks of about 1 GiB as vLLM's sender does by default); over Ray,
the control calls and the metadata. A tied ``lm_head.weight`` is left out, as on the ``/dev/shm``
path, and an FP8 engine quantizes the bf16 weights it receives, as it does on that path on a GPU.

This path is exercised only on a machine with at least two GPUs and vLLM
(``tests/test_gpu.py::test_multi_gpu_weight_sync``); on a CPU the unit tests cover the metadata and
the rank layout.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from vllm.distributed.weight_transfer import ParamMeta, WeightSource, WeightTransferTrainerFactory
from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

if TYPE_CHECKING:
    from ray.actor import ActorHandle


def rank_offsets(workers: Sequence[int]) -> list[int]:
    """Rank of the first worker of each engine in the transfer group, the sender being rank 0:
    ``[1, 1 + workers[0], 1 + workers[0] + workers[1], ...]``."""
    return list(accumulate(workers, initial=1))[:-1]


class StateDictSource(WeightSource):
    """vLLM's ``WeightSource`` over a state dict: every tensor but ``skip``, in the dict's order,
    as a contiguous bf16 tensor on ``device``, cast as it is sent (the GPU holds vLLM's packing
    chunks, never a bf16 copy of the whole model). Set ``state_dict`` before each send.

    The state dict may be lazy (:class:`isosweep.trial.learner.GatheredWeights`: each tensor gathered
    from its ZeRO-3 partitions when read, on the trainer's GPU): the metadata then comes from its
    ``shapes()``, read without gathering, and iterating reads every tensor once, in order, skipped ones
    too, so the sender joins the same gathers as the trainer workers that only drain them.
    """

    def __init__(self, device: torch.device | str, skip: Sequence[str] = ()):
        self.device = torch.device(device)
        self.skip = frozenset(skip)
        self.state_dict: Mapping[str, Tensor] = {}

    def metadata(self) -> list[ParamMeta]:
        shapes = self.state_dict.shapes() if hasattr(self.state_dict, "shapes") else \
            {name: t.shape for name, t in self.state_dict.items()}
        return [ParamMeta(name, torch.bfloat16, tuple(shape)) for name, shape in shapes.items()
                if name not in self.skip]

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        for name, t in self.state_dict.items():  # every tensor read: a read may be a collective
            if name not in self.skip:
                yield name, t.detach().to(self.device, torch.bfloat16).contiguous()


class RolloutActorsClient:
    """vLLM's ``VLLMWeightSyncClient`` over :class:`~isosweep.rollout.vllm.VLLMEngine` actors: each
    call goes to every actor and waits for all of them."""

    def __init__(self, actors: Sequence[ActorHandle], offsets: Sequence[int]):
        self.actors = list(actors)
        self.offsets = list(offsets)

    def call(self, method: str, *args: Any) -> None:
        """``actor.method(*args)`` on every actor."""
        import ray

        ray.get([getattr(actor, method).remote(*args) for actor in self.actors])

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        import ray

        ray.get([actor.init_weight_transfer.remote({**init_info, "rank_offset": offset})
                 for actor, offset in zip(self.actors, self.offsets)])

    def start_weight_update(self) -> None:
        self.call("start_weight_update")

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.call("receive_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        # vLLM's sender passes no version; NcclWeightSender.send records ours right after.
        self.call("finish_weight_update")


class NcclWeightSender:
    """Rank 0 of the NCCL group shared with ``actors`` (started with ``weight_sync="nccl"``);
    joins it on construction, so call it on the trainer's rank 0 with its CUDA device current.

    ``master_address`` is where the engines reach this process (default: this node's IP, as vLLM
    finds it) and ``master_port`` a free port there (default: one vLLM picks).
    """

    def __init__(self, actors: Sequence[ActorHandle], master_address: str | None = None,
                 master_port: int | None = None):
        import ray
        from vllm.utils.network_utils import get_ip, get_open_port

        workers = ray.get([actor.transfer_workers.remote() for actor in actors])
        skipped = {tuple(names) for names in ray.get([actor.skipped_weights.remote() for actor in actors])}
        if len(skipped) != 1:
            raise ValueError(f"rollout actors disagree on the weights they skip: {sorted(skipped)}")
        self.client = RolloutActorsClient(actors, rank_offsets(workers))
        self.source = StateDictSource(torch.device("cuda", torch.cuda.current_device()), skipped.pop())
        self.transfer = WeightTransferTrainerFactory.trainer_init(
            init_info=NCCLTrainerInitInfo(
                master_address=master_address or get_ip(),
                master_port=master_port or get_open_port(),
                world_size=1 + sum(workers),
                rank=0,
            ),
            client=self.client,
            source=self.source,
        )

    def send(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        """Broadcast every tensor of ``state_dict`` (any device and float dtype; sent as bf16) to
        every engine and record ``version`` there; returns once all engines serve the new weights."""
        self.source.state_dict = state_dict
        # vLLM's packed broadcast reads the tensors on its own streams, which do not wait for the
        # work that produced them on ours (the optimizer step, a gather).
        torch.cuda.current_stream(self.source.device).synchronize()
        try:
            self.transfer.send_weights()
        finally:
            self.source.state_dict = {}  # no reference to the trainer's weights between steps
        self.client.call("set_policy_version", version)

    def close(self) -> None:
        """Leave the group on every engine, then on this process."""
        self.client.call("shutdown_weight_transfer")
        self.transfer.shutdown()
