"""The learner's process group survives the group being torn down and made again in one process."""

import os
from pathlib import Path

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
