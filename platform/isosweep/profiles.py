"""Hardware profiles: the Ray resources of one trial, read from ``clusters/profiles.yaml``.

A profile fixes the *shape* of a trial on a node type: the trainer's share of CPUs/GPUs (split
evenly across its Ray Train workers), each rollout actor's share, the driver's share, and the
collective backend (gloo on CPU, NCCL on GPU). The trial config chooses how many trainer workers
and rollout actors share it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from isosweep.config import ConfigError, _Section, read_yaml, validate

PROFILES_FILE = Path(os.environ.get("ISOSWEEP_PROFILES", Path(__file__).resolve().parents[2] / "clusters" / "profiles.yaml"))


class Resources(_Section):
    """Ray resources (logical, fractions allowed)."""

    CPU: float = Field(0.0, ge=0)
    GPU: float = Field(0.0, ge=0)


class Profile(_Section):
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
