"""The learner's process group survives the group being torn down and made again in one process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from isosweep.spec.trial import load_trial
from isosweep.trial.learner import init_distributed, make_learner

EASY = Path(__file__).parents[2] / "sweeps" / "trials" / "easy.yaml"


def test_a_learner_builds_after_the_process_group_was_destroyed_and_made_again():
    """An in-process vLLM engine destroys the default group on shutdown; DeepSpeed's cached clone of
    the old world must not be handed to the next engine (it failed with "Group ... is not registered")."""
    cfg = load_trial(EASY)
    init_distributed("gloo")
    make_learner(torch.nn.Linear(4, 4), cfg, gpu=False)
    dist.destroy_process_group()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        # the next world of one gets a fresh port; these named the destroyed group's
        os.environ.pop(key, None)
    rank, world = init_distributed("gloo")
    engine = make_learner(torch.nn.Linear(4, 4), cfg, gpu=False)
    engine.backward(engine(torch.randn(1, 4)).sum())
    engine.step()
    assert (rank, world) == (0, 1)


LEARNER_STEP = """
import torch
from isosweep.spec.trial import load_trial
from isosweep.trial.learner import init_distributed, make_learner
import torch.distributed as dist
import deepspeed.comm.comm as ds_comm
if {group_first!r}:  # as Ray Train's torch backend does before the training function runs
    import os, socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1")
    dist.init_process_group("gloo")
init_distributed("gloo")
engine = make_learner(torch.nn.Linear(4, 4), load_trial({easy!r}), gpu=False)
engine.backward(engine(torch.randn(1, 4)).sum())
engine.step()
print("shm op:", ds_comm.cdb.shm_comm_op)
"""


@pytest.mark.parametrize("group_first", [False, True], ids=["world-of-one", "group-from-ray-train"])
def test_a_cpu_learner_compiles_nothing_on_a_fresh_machine(tmp_path, group_first):
    """DeepSpeed's shared-memory allreduce is a C++ op compiled on first use (60-90 s, and only with a
    compiler); a CPU learner trains through gloo without it, in a process whose extension cache is empty,
    whether it makes its own world of one or joins a process group made before it (Ray Train)."""
    extensions = tmp_path / "torch_extensions"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions),
           "PYTHONPATH": str(Path(__file__).parents[2] / "platform")}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a world of one, as `isosweep trial` outside Ray makes it
    done = subprocess.run([sys.executable, "-c", LEARNER_STEP.format(easy=str(EASY), group_first=group_first)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "shm op: None" in done.stdout
    assert not (extensions.exists() and any(extensions.rglob("*shm*"))), sorted(extensions.rglob("*"))


@pytest.mark.parametrize("scaling", ["all", "hidden"])
def test_each_parameter_steps_at_its_groups_rate_with_the_warm_up(scaling):
    """Reference: Adam's first step moves every weight by ``lr * g / (|g| + eps)``, so a parameter's largest
    move is its rate. Under ``hidden`` scaling the block matrices of a width-64 model take twice ``lr_ref``
    (width_ref 128) and the embedding, norms and biases take ``lr_ref``; under ``all`` everything takes twice;
    the first step of a 2-step warm-up takes half of either."""
    from transformers import Qwen2ForCausalLM

    from isosweep.models.family import qwen2_config
    from isosweep.trial.learner import schedule_rate

    cfg = load_trial(EASY, ["model.name=tiny-w64", "budget=2048", "Bp=16", "n=8", "algorithm.lr_ref=1e-3",
                            "algorithm.width_ref=128", f"algorithm.width_scaling={scaling}", "algorithm.lr_warmup=0.1"])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config("tiny-w64", 22, 0, 1))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    init_distributed("gloo")
    engine = make_learner(model, cfg, gpu=False)
    assert schedule_rate(engine, cfg, 0) == pytest.approx(0.5 * 2e-3)  # warm-up of ceil(0.1 * 16) = 2 steps
    engine.backward(engine(input_ids=torch.randint(2, 22, (4, 12))).logits.pow(2).mean())
    engine.step()
    moved = {name: float((p.detach() - before[name]).abs().max()) for name, p in engine.module.named_parameters()}
    for name, move in moved.items():
        if name.endswith("k_proj.bias"):  # softmax ignores a shift shared by all keys: its gradient is rounding noise
            continue
        block_matrix = ".layers." in name and name.endswith("proj.weight")
        rate = 0.5 * (2e-3 if scaling == "all" or block_matrix else 1e-3)
        assert move == pytest.approx(rate, rel=1e-3), name
    assert schedule_rate(engine, cfg, 1) == pytest.approx(2e-3)  # the warm-up's last step: the full rate
    dist.destroy_process_group()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        os.environ.pop(key, None)
