"""The NCCL weight sync's CPU-checkable contract: what the sender announces is what it sends, every
engine worker gets its own rank, the actor calls are the ones vLLM's sender makes, and the option
is refused where it cannot work. The broadcast itself needs two GPUs (tests/test_gpu.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from isosweep.rollout.pool import RolloutPool
from isosweep.rollout.vllm import VLLMEngine, llm_kwargs

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[cpu]' or '.[gpu]')")

from vllm.config import WeightTransferConfig
from vllm.distributed.weight_transfer import ParamMeta

from isosweep.rollout.weight_sync import (
    RolloutActorsClient,
    StateDictSource,
    rank_offsets,
)

pytestmark = pytest.mark.vllm


def state_dict() -> dict[str, torch.Tensor]:
    """A tied-embedding-like state dict in several dtypes, one tensor non-contiguous."""
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(23, 8, generator=gen)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=gen, dtype=torch.float64).t(),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(8, generator=gen).half(),
        "model.norm.weight": torch.ones(8, dtype=torch.bfloat16),
        "lm_head.weight": embed,
    }


def test_source_announces_what_it_sends_in_order():
    state = state_dict()
    source = StateDictSource("cpu", skip=["lm_head.weight"])
    source.state_dict = state
    sent = [name for name in state if name != "lm_head.weight"]
    assert source.metadata() == [ParamMeta(name, torch.bfloat16, tuple(state[name].shape)) for name in sent]
    for _ in range(2):  # vLLM replays the source every round
        pairs = list(source)
        assert [name for name, _ in pairs] == sent
        for (name, tensor), meta in zip(pairs, source.metadata()):
            # NCCL sends numel elements from data_ptr(): dtype, shape and layout must match the announcement
            assert tensor.dtype == meta.dtype and tuple(tensor.shape) == meta.shape and tensor.is_contiguous()
            assert torch.equal(tensor, state[name].to(torch.bfloat16))


@given(st.lists(st.integers(1, 8), min_size=1, max_size=6))
def test_rank_offsets_give_every_worker_its_own_rank_after_the_sender(workers):
    ranks = [rank for offset, count in zip(rank_offsets(workers), workers) for rank in range(offset, offset + count)]
    assert ranks == list(range(1, 1 + sum(workers)))


class FakeActor:
    """Records ``actor.method.remote(*args)`` calls; ``ray.get`` is patched to pass results through."""

    def __init__(self, calls: list):
        self.calls = calls

    def __getattr__(self, method: str):
        return SimpleNamespace(remote=lambda *args: self.calls.append((method, args)))


def test_client_maps_vllms_calls_onto_the_actors(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    calls: list[list] = [[], []]
    client = RolloutActorsClient([FakeActor(calls[0]), FakeActor(calls[1])], rank_offsets([2, 1]))
    init = {"master_address": "10.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 4, "packed": True}
    update = {"names": ["a"], "dtype_names": ["bfloat16"], "shapes": [[2]]}
    client.init_weight_transfer_engine(init)
    client.start_weight_update()
    client.update_weights(update)
    client.finish_weight_update()
    for actor_calls, offset in zip(calls, [1, 3]):
        assert actor_calls == [("init_weight_transfer", ({**init, "rank_offset": offset},)),
                               ("start_weight_update", ()), ("receive_weights", (update,)),
                               ("finish_weight_update", ())]


def test_nccl_is_configured_on_gpus_only():
    gpu = llm_kwargs("m", "bf16", 0, gpu=True, max_position_embeddings=64, overrides=None, weight_sync="nccl")
    assert WeightTransferConfig(**gpu["weight_transfer_config"]).backend == "nccl"
    assert "weight_transfer_config" not in llm_kwargs("m", "bf16", 0, True, 64, None)
    # both refused before the model path is read
    with pytest.raises(ValueError, match="GPU"):
        VLLMEngine("/nonexistent", 8, 1.0, gpu=False, weight_sync="nccl")
    with pytest.raises(ValueError, match="weight_sync"):
        VLLMEngine("/nonexistent", 8, 1.0, gpu=False, weight_sync="rdma")


def test_pool_publishes_through_its_sender():
    sent = []
    state = state_dict()
    pool = RolloutPool([], SimpleNamespace(send=lambda *args: sent.append(args)))
    pool.update_weights(state, version=5)
    assert sent == [(state, 5)] and pool.policy_version == 5


class _Lazy(dict):
    """A state dict whose tensors are gathered when read (as ``GatheredWeights`` under ZeRO-3): it records reads."""

    def __init__(self, tensors):
        super().__init__(tensors)
        self.reads: list[str] = []

    def __getitem__(self, name):
        self.reads.append(name)
        return super().__getitem__(name)

    def items(self):
        return ((name, self[name]) for name in self)

    def shapes(self):
        return {name: super(_Lazy, self).__getitem__(name).shape for name in self}


def test_a_lazy_source_is_announced_without_gathering_and_read_whole_in_order():
    """Under ZeRO-3 reading a weight is a collective the other trainer workers join by reading every weight in
    order: the sender announces shapes without reading anything, then reads every weight once, in order, the
    skipped ones too, and sends all but those."""
    tensors = state_dict()
    lazy = _Lazy(tensors)
    source = StateDictSource("cpu", skip=["model.norm.weight"])
    source.state_dict = lazy
    meta = source.metadata()
    assert lazy.reads == []
    assert [m.name for m in meta] == [n for n in tensors if n != "model.norm.weight"]
    assert [tuple(m.shape) for m in meta] == [tuple(t.shape) for n, t in tensors.items() if n != "model.norm.weight"]
    sent = list(source)
    assert lazy.reads == list(tensors)
    assert [name for name, _ in sent] == [m.name for m in meta]
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for _, t in sent)
