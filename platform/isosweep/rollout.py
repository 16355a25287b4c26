"""Rollout engines: sample completions and their post-temperature log-probs behind one interface.

A trial talks to its rollout engine through two calls:

- ``generate(prompts, n, seed)`` samples ``n`` completions per prompt and returns them with the
  log-probability of every sampled token under the *processed* sampling distribution
  (``log_softmax(logits / temperature)``, no top-k/top-p), which is what the trainer recomputes;
- ``update_weights(state_dict, version)`` loads the trainer's latest weights; every ``Rollouts``
  carries the ``policy_version`` it was sampled with, so a trainer can prove no rollout is stale.

``HFEngine`` here runs a Hugging Face causal LM in-process with a plain KV-cached sampling loop
(not ``generate``, whose default top-k would silently change the distribution).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

if TYPE_CHECKING:
    from isosweep.vllm_engine import WeightSyncMode
    from isosweep.weight_sync import NcclWeightSender


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


class RolloutEngine(Protocol):
    """What the GRPO loop needs from a rollout engine."""

    policy_version: int

    def generate(self, prompts: Sequence[str], n: int, seed: int) -> Rollouts: ...

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int) -> None: ...


@torch.no_grad()
def sample_tokens(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    eos_id: int,
    pad_id: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor]:
    """Ancestral sampling with a KV cache from left-padded prompts.

    Returns ``tokens (batch, max_new_tokens)``, ``logprobs (batch, max_new_tokens)`` (post-temperature
    log-prob of each sampled token) and ``lengths (batch,)``: the number of valid tokens of each
    row, ``<eos>`` included. Positions past a row's length hold ``pad_id`` and log-prob 0.
    """
    batch = len(prompt_ids)
    width = max(len(p) for p in prompt_ids)
    device = next(model.parameters()).device
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    for row, ids in enumerate(prompt_ids):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids):] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)

    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    next_pos = positions[:, -1:] + 1
    for t in range(max_new_tokens):
        step_logp = torch.log_softmax(out.logits[:, -1, :].float() / temperature, dim=-1)
        token = torch.multinomial(step_logp.exp(), 1, generator=generator).squeeze(-1)
        live = ~done
        tokens[live, t] = token[live]
        logprobs[live, t] = step_logp[live].gather(-1, token[live, None]).squeeze(-1)
        lengths += live.long()
        done |= token == eos_id
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        attention = torch.cat([attention, live.long()[:, None]], dim=-1)
        feed = torch.where(live, token, torch.full_like(token, pad_id))[:, None]
        out = model(
            input_ids=feed,
            attention_mask=attention,
            position_ids=next_pos,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
        next_pos = next_pos + 1
    return tokens.cpu(), logprobs.cpu(), lengths.cpu()


def round_weights(state_dict: Mapping[str, Tensor], precision: str) -> dict[str, Tensor]:
    """The rollout copy of the weights at ``precision``: ``bf16`` rounds every tensor to bfloat16,
    ``fp8`` additionally rounds linear weights through float8_e4m3fn (per-output-channel scale).
    Tensors keep their dtype, so the engine computes in its own precision on rounded values."""
    rounded = {k: v.to(torch.bfloat16).to(v.dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    if precision == "fp8":
        from isosweep.fp8 import fp8_state_dict

        rounded = fp8_state_dict(rounded)
    return rounded


class HFEngine:
    """In-process rollout engine on a Hugging Face causal LM (its own copy of the weights).

    With ``precision`` set, every weight update is rounded like the rollout weights of a bf16 or
    FP8 serving engine (``round_weights``), which reproduces the weight part of the mismatch.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, max_new_tokens: int, temperature: float,
                 batch_size: int = 512, precision: str | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.batch_size = batch_size
        self.precision = precision
        self.policy_version = 0
        if precision is not None:
            self.update_weights(self.model.state_dict(), version=0)

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        """Copy the trainer's weights in place (rounded to ``precision``) and record their version."""
        if self.precision is not None:
            state_dict = round_weights(state_dict, self.precision)
        self.model.load_state_dict(state_dict, strict=True)
        self.policy_version = version

    def generate(self, prompts: Sequence[str], n: int, seed: int) -> Rollouts:
        """Sample ``n`` completions for each prompt; deterministic for a given ``seed`` and weights."""
        encoded = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        prompt_ids = [ids for ids in encoded for _ in range(n)]
        generator = torch.Generator(device=next(self.model.parameters()).device).manual_seed(seed)
        completion_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        for start in range(0, len(prompt_ids), self.batch_size):
            chunk = prompt_ids[start:start + self.batch_size]
            tokens, logp, lengths = sample_tokens(
                self.model, chunk, self.max_new_tokens, self.temperature,
                self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, generator,
            )
            for row, length in enumerate(lengths.tolist()):
                completion_ids.append(tokens[row, :length].tolist())
                logprobs.append(logp[row, :length].tolist())
        eos = self.tokenizer.eos_token_id
        texts = self.tokenizer.batch_decode(
            [ids[:-1] if ids and ids[-1] == eos else ids for ids in completion_ids],
            skip_special_tokens=True,
        )
        return Rollouts(prompt_ids, completion_ids, logprobs, texts, self.policy_version)


class RolloutPool:
    """Rollout actors (Ray, one vLLM engine each) shared by the trainer workers of one trial.

    Prompts are split into contiguous chunks, one per actor. Weights go out once through Ray's
    object store (shared memory on one node) and every actor reloads them in place; or, with a
    ``sender`` (actors spawned with ``weight_sync="nccl"``), this process broadcasts them from its GPU
    to the actors' GPUs (:mod:`isosweep.weight_sync`).
    """

    def __init__(self, actors: list, sender: NcclWeightSender | None = None):
        self.actors = actors
        self.sender = sender
        self.policy_version = 0

    @staticmethod
    def spawn(names: list[str], model_path: str, max_new_tokens: int, temperature: float, precision: str,
              seed: int, cpus: float, gpus: float, weight_sync: WeightSyncMode = "shm",
              engine_kwargs: dict | None = None) -> RolloutPool:
        """Start one named actor per name (outside the caller's placement group). With
        ``weight_sync="nccl"`` the calling process then joins the actors' weight-transfer group as its
        sender, on its current CUDA device: call it from the process that publishes the weights."""
        from isosweep.vllm_engine import spawn_rollout_actor

        import ray

        actors = [spawn_rollout_actor(model_path, max_new_tokens=max_new_tokens, temperature=temperature,
                                      precision=precision, seed=seed, num_cpus=cpus, num_gpus=gpus, name=name,
                                      weight_sync=weight_sync, engine_kwargs=engine_kwargs)
                  for name in names]
        ray.get([actor.__ray_ready__.remote() for actor in actors])  # engines up before anyone samples
        if weight_sync == "nccl":
            from isosweep.weight_sync import NcclWeightSender

            return RolloutPool(actors, NcclWeightSender(actors))
        return RolloutPool(actors)

    @staticmethod
    def attach(names: list[str]) -> RolloutPool:
        """The pool of already started actors, by name (after the spawning rank's barrier)."""
        import ray

        from isosweep.vllm_engine import ACTOR_NAMESPACE

        return RolloutPool([ray.get_actor(name, namespace=ACTOR_NAMESPACE) for name in names])

    def generate(self, prompts: Sequence[str], n: int, seed: int) -> Rollouts:
        import ray

        size = -(-len(prompts) // len(self.actors))
        chunks = [list(prompts[i:i + size]) for i in range(0, len(prompts), size)]
        parts = ray.get([actor.generate.remote(chunk, n, seed * 131 + i)
                         for i, (actor, chunk) in enumerate(zip(self.actors, chunks))])
        versions = {part.policy_version for part in parts}
        if len(versions) != 1:
            raise RuntimeError(f"rollout actors disagree on the policy version: {sorted(versions)}")
        return Rollouts(
            prompt_ids=[x for part in parts for x in part.prompt_ids],
            completion_ids=[x for part in parts for x in part.completion_ids],
            logprobs=[x for part in parts for x in part.logprobs],
            texts=[x for part in parts for x in part.texts],
            policy_version=versions.pop(),
        )

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int) -> None:
        if self.sender is not None:
            self.sender.send(state_dict, version)
        else:
            import ray

            ref = ray.put(dict(state_dict))
            ray.get([actor.update_weights.remote(ref, version) for actor in self.actors])
        self.policy_version = version
