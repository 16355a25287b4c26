"""The rollout interface: what a trial needs from whatever samples its completions.

A trial talks to its rollout engine through two calls:

- ``generate(prompts, n, seed)`` samples ``n`` completions per prompt and returns them with the
  log-probability of every sampled token under the *processed* sampling distribution
  (``log_softmax(logits / temperature)``, no top-k/top-p), which is what the trainer recomputes;
- ``update_weights(state_dict, version)`` loads the trainer's latest weights; every ``Rollouts``
  carries the ``policy_version`` it was sampled with, so a trainer can prove no rollout is stale.

Engines: ``hf.HFEngine`` (in-process Hugging Face model), ``vllm.VLLMEngine`` (a vLLM engine in a
Ray actor) and ``pool.RolloutPool`` (several such actors behind one engine); `TemplatedEngine` wraps
any of them to format every prompt first (a chat template).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from isosweep.rollout.fp8 import rounded_state_dict

WeightSyncMode = Literal["shm", "nccl"]
"""How weights reach rollout actors: Ray's object store (shared memory on one node) or NCCL broadcast."""


@dataclass(frozen=True)
class Rollouts:
    """Completions for ``prompts x n`` samples, sample ``i * n + j`` being the j-th for prompt i."""

    prompt_ids: list[list[int]]
    """Token ids of the prompt of each sample (no padding)."""
    completion_ids: list[list[int]]
    """Sampled token ids, ending with ``<eos>`` when the sample finished within the cap."""
    logprobs: list[list[float]]
    """Post-temperature log-prob of each sampled token, aligned with ``completion_ids``."""
    texts: list[str]
    """Decoded completions without the end-of-sequence token (what rewards see)."""
    policy_version: int
    """Version of the weights that generated every sample of this batch."""

    @property
    def num_tokens(self) -> int:
        """Total completion tokens generated."""
        return sum(len(c) for c in self.completion_ids)

    def select(self, prompts: Sequence[int], n: int) -> Rollouts:
        """The samples of the prompts at indices ``prompts`` (in that order), ``n`` per prompt."""
        rows = [i * n + j for i in prompts for j in range(n)]
        return Rollouts([self.prompt_ids[r] for r in rows], [self.completion_ids[r] for r in rows],
                        [self.logprobs[r] for r in rows], [self.texts[r] for r in rows], self.policy_version)


class RolloutEngine(Protocol):
    """What the GRPO loop needs from a rollout engine."""

    policy_version: int

    def generate(self, prompts: Sequence[str], n: int, seed: int, temperature: float | None = None) -> Rollouts:
        """``n`` completions per prompt at ``temperature`` (None: the engine's own)."""
        ...

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int, at_precision: bool = True) -> None:
        """Serve ``state_dict`` as policy ``version``, rounded to the engine's rollout precision; with
        ``at_precision=False`` only to bf16 (evaluation measures the trained weights, not their rounding)."""
        ...


class TemplatedEngine:
    """A rollout engine whose prompts pass through ``template`` first (a chat template, for one).

    The one place a trial's prompts are formatted: training rollouts, evaluation and the difficulty probe
    all sample through it, so they see the same text, while problems, probes and eval-set ids keep the raw
    prompt. ``Rollouts.prompt_ids`` are the formatted prompt's tokens, which the trainer conditions on.
    """

    def __init__(self, engine: RolloutEngine, template: Callable[[str], str]):
        self.engine = engine
        self.template = template

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def generate(self, prompts: Sequence[str], n: int, seed: int, temperature: float | None = None) -> Rollouts:
        return self.engine.generate([self.template(p) for p in prompts], n, seed, temperature)

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int, at_precision: bool = True) -> None:
        self.engine.update_weights(state_dict, version, at_precision)


def round_weights(state_dict: Mapping[str, Tensor], precision: str) -> dict[str, Tensor]:
    """The rollout copy of the weights at ``precision``: ``bf16`` rounds every tensor to bfloat16,
    ``fp8`` additionally rounds linear weights through float8_e4m3fn (per-output-channel scale), ``int8``
    ... ``int2`` to that many bits (:func:`isosweep.rollout.fp8.rounded_state_dict`). Tensors keep their
    dtype, so the engine computes in its own precision on rounded values."""
    rounded = {k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    return rounded_state_dict(rounded, precision)
