"""Hardware profiles (``clusters/profiles.yaml``): resources, placement, DeepSpeed and vLLM settings, bad input."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from isosweep.spec.profiles import (
    Profile,
    check_layout,
    deepspeed_overrides,
    get_profile,
    load_profiles,
    pack_nodes,
    placement_bundles,
    trial_resources,
    vllm_engine_args,
)
from isosweep.spec.yamlio import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "clusters" / "profiles.yaml"
SHAPES = {
    # profile -> (trainer workers, rollout actors) it is sized for; a CPU profile not listed: (1, 1)
    "cpu-tiny": (1, 1),
    "h200-node": (4, 4),
    "h200-multinode": (8, 4),
}
PROFILE_NAMES = list(yaml.safe_load(PROFILES.read_text()))


def shape(name: str) -> tuple[int, int]:
    return SHAPES.get(name, (1, 1))


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())



def test_cpu_tiny_is_unchanged():
    tiny = get_profile("cpu-tiny")
    assert tiny.model_dump(include={"accelerator", "node", "driver", "trainer", "rollout", "backend", "weight_sync"}) == {
        "accelerator": "cpu", "node": {"CPU": 2, "GPU": 0}, "driver": {"CPU": 0.1, "GPU": 0},
        "trainer": {"CPU": 0.9, "GPU": 0}, "rollout": {"CPU": 0.9, "GPU": 0}, "backend": "gloo", "weight_sync": "shm"}
    assert tiny.nodes == 1 and tiny.node_types == ()
    assert trial_resources(tiny, workers=1, actors=1) == pytest.approx({"CPU": 1.9, "GPU": 0.0})
    assert placement_bundles(tiny, 1, 1) == ([{"CPU": 0.1}, {"CPU": 0.9}, {"CPU": 0.9}], "STRICT_PACK")
    assert placement_bundles(tiny, 2, 1)[0][1:3] == [{"CPU": 0.45}, {"CPU": 0.45}]
    assert deepspeed_overrides(tiny, zero_stage=2) == {"zero_optimization": {"stage": 2}, "bf16": {"enabled": False}}
    assert vllm_engine_args(tiny, "fp8") == {}  # the CPU engine's arguments stay llm_kwargs' own


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_profile_fits_its_nodes(name: str):
    """Each bundle fits one node, and the trial fits ``nodes`` nodes: the first-fit layout exists."""
    profile = get_profile(name)
    workers, actors = shape(name)
    bundles, strategy = placement_bundles(profile, workers, actors)
    assert strategy == ("STRICT_PACK" if profile.nodes == 1 else "PACK")
    assert len(bundles) == 1 + workers + actors
    for bundle in bundles:
        assert all(bundle.get(k, 0) <= getattr(profile.node, k) for k in ("CPU", "GPU")), (name, bundle)
    total = trial_resources(profile, workers, actors)
    assert sum(b.get("CPU", 0) for b in bundles) == pytest.approx(total["CPU"])
    assert sum(b.get("GPU", 0) for b in bundles) == pytest.approx(total["GPU"])
    assert total["CPU"] <= profile.nodes * profile.node.CPU and total["GPU"] <= profile.nodes * profile.node.GPU
    layout = pack_nodes(profile, workers, actors)
    assert len(layout) == profile.nodes and all(layout), f"{name}: a node of the trial is empty: {layout}"


def test_every_gpu_profile_has_a_shape():
    gpu = {name for name, p in load_profiles().items() if p.accelerator == "gpu"}
    assert gpu <= set(SHAPES), "give a new GPU profile the (workers, actors) it is sized for in SHAPES"


def test_h200_node_maps_to_deepspeed_and_vllm():
    profile = get_profile("h200-node")
    bundles, strategy = placement_bundles(profile, workers=4, actors=4)
    assert strategy == "STRICT_PACK"
    assert bundles == [{"CPU": 1}] + [{"CPU": 16, "GPU": 1}] * 4 + [{"CPU": 16, "GPU": 1}] * 4
    assert trial_resources(profile, 4, 4)["GPU"] == 8  # the whole node: 4 trainer + 4 rollout GPUs
    # ZeRO-3 and bf16, whatever stage the trial config carries by default.
    assert deepspeed_overrides(profile, zero_stage=1) == {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    args = vllm_engine_args(profile)
    assert args == {"tensor_parallel_size": 1, "quantization": "fp8_per_channel", "gpu_memory_utilization": 0.85}
    assert "quantization" not in vllm_engine_args(profile, precision="bf16")  # a bf16-rollout trial stays bf16
    assert profile.backend == "nccl" and profile.weight_sync == "nccl"


def test_gpu_profiles_declare_their_gpu_memory():
    """The H200 profiles carry the memory the dry run's plan checks against; a CPU profile has none."""
    profiles = load_profiles()
    assert profiles["h200-node"].gpu_memory_gib == profiles["h200-multinode"].gpu_memory_gib == 139
    assert profiles["cpu-tiny"].gpu_memory_gib is None
    assert all(p.gpu_memory_gib for p in profiles.values() if p.accelerator == "gpu")


def test_engine_args_are_what_llm_kwargs_takes():
    from isosweep.rollout.vllm import llm_kwargs

    profile = get_profile("h200-multinode")
    kwargs = llm_kwargs("m", "fp8", 0, gpu=True, max_position_embeddings=None, overrides=vllm_engine_args(profile, "fp8"))
    assert kwargs["quantization"] == "fp8_per_channel" and kwargs["tensor_parallel_size"] == 2


def test_h200_multinode_packs_trainer_and_rollout_on_their_own_nodes():
    profile = get_profile("h200-multinode")
    bundles, strategy = placement_bundles(profile, workers=8, actors=4)
    assert strategy == "PACK" and profile.nodes == 2
    assert [b for b in bundles if b.get("GPU") == 2] == [{"CPU": 24, "GPU": 2}] * 4  # whole TP groups: one bundle each
    layout = pack_nodes(profile, 8, 4)
    kinds = [{part.split("[")[0] for part in node if part != "driver"} for node in layout]
    assert sorted(map(sorted, kinds)) == [["rollout"], ["trainer"]], layout
    assert vllm_engine_args(profile)["tensor_parallel_size"] == profile.rollout.GPU == 2
    assert deepspeed_overrides(profile, 1)["zero_optimization"]["stage"] == 3


def test_layouts_that_cannot_run_are_rejected():
    node = get_profile("h200-node")
    with pytest.raises(ConfigError, match=r"do not fit 1 node\(s\)"):
        placement_bundles(node, workers=4, actors=5)  # 9 GPUs on an 8-GPU node
    with pytest.raises(ConfigError, match="whole number of GPUs per worker"):
        check_layout(node, workers=3, actors=4)  # 4/3 GPU per DeepSpeed process
    multi = get_profile("h200-multinode")
    with pytest.raises(ConfigError, match=r"do not fit 2 node\(s\)"):
        pack_nodes(multi, workers=8, actors=5)
    with pytest.raises(ConfigError, match="at least one"):
        pack_nodes(multi, workers=8, actors=0)


BAD_PROFILES = {
    "tensor parallel vs rollout GPUs": ({"rollout": {"CPU": 16, "GPU": 2}}, "must equal vllm.tensor_parallel_size"),
    "unknown vllm key": ({"vllm": {"precision": "fp8", "tensor_parallel_size": 1, "quantisation": "fp8"}},
                         "key 'vllm.quantisation': unknown key"),
    "zero stage out of range": ({"deepspeed": {"zero_stage": 4}}, "key 'deepspeed.zero_stage'"),
    "memory share above 1": ({"vllm": {"tensor_parallel_size": 1, "gpu_memory_utilization": 1.5}},
                             "key 'vllm.gpu_memory_utilization'"),
    "shm weights across nodes": ({"nodes": 2, "weight_sync": "shm"}, "weight_sync 'shm' needs the trial on one node"),
    "no nodes": ({"nodes": 0}, "key 'nodes'"),
    "no GPU memory": ({"gpu_memory_gib": 0}, "key 'gpu_memory_gib'"),
}


@pytest.mark.parametrize("case", list(BAD_PROFILES), ids=list(BAD_PROFILES))
def test_bad_profiles_name_file_and_key(tmp_path: Path, case: str):
    body = load(PROFILES)["h200-node"]
    change, message = BAD_PROFILES[case]
    body.update(change)
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump({"broken": body}))
    with pytest.raises(ConfigError, match=re.escape(f"{path}: profile 'broken'") + ".*" + re.escape(message)):
        load_profiles(path)


def test_cpu_profiles_ask_for_no_gpu_features(tmp_path: Path):
    body = load(PROFILES)["cpu-tiny"] | {"deepspeed": {"zero_stage": 3}}
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump({"tiny3": body}))
    with pytest.raises(ConfigError, match="zero_stage 3 needs GPUs"):
        load_profiles(path)


def test_profiles_are_models():
    assert all(isinstance(p, Profile) for p in load_profiles().values())
