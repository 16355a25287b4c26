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
