"""Several vLLM rollout actors behind one rollout engine (the default engine of a trial)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from torch import Tensor

from isosweep.rollout.base import Rollouts, WeightSyncMode
from isosweep.rollout.placement import ACTOR_NAMESPACE, place
from isosweep.rollout.vllm import spawn_rollout_actor

if TYPE_CHECKING:
    from isosweep.rollout.weight_sync import NcclWeightSender


class RolloutPool:
    """Rollout actors (Ray, one vLLM engine each) shared by the trainer workers of one trial.

    Prompts are split into contiguous chunks, one per actor. Weights go out once through Ray's
    object store (shared memory on one node) and every actor reloads them in place; or, with a
    ``sender`` (actors spawned with ``weight_sync="nccl"``), this process broadcasts them from its GPU
    to the actors' GPUs (:mod:`isosweep.rollout.weight_sync`).
    """

    def __init__(self, actors: list, sender: NcclWeightSender | None = None):
        self.actors = actors
        self.sender = sender
        self.policy_version = 0

    @staticmethod
    def spawn(names: list[str], model_path: str, max_new_tokens: int, temperature: float, precision: str,
              seed: int, cpus: float, gpus: float, weight_sync: WeightSyncMode = "shm",
              engine_kwargs: dict | None = None, strategy: str | None = None) -> RolloutPool:
        """Start one named actor per name, each in its bundle of a placement group (:func:`place`) packed by
        ``strategy`` (None: outside any group). With ``weight_sync="nccl"`` the calling process then joins the
        actors' weight-transfer group as its sender, on its current CUDA device: call it from the process that
        publishes the weights."""
        import ray

        bundle = {k: v for k, v in {"CPU": cpus, "GPU": gpus}.items() if v > 0}
        group = place(names, [bundle] * len(names), strategy) if strategy else None
        actors = [spawn_rollout_actor(model_path, max_new_tokens=max_new_tokens, temperature=temperature,
                                      precision=precision, seed=seed, num_cpus=cpus, num_gpus=gpus, name=name,
                                      weight_sync=weight_sync, engine_kwargs=engine_kwargs,
                                      placement=None if group is None else (group, i))
                  for i, name in enumerate(names)]
        ray.get([actor.__ray_ready__.remote() for actor in actors])  # engines up before anyone samples
        if weight_sync == "nccl":
            from isosweep.rollout.weight_sync import NcclWeightSender  # imports vllm's NCCL transfer: GPU only

            return RolloutPool(actors, NcclWeightSender(actors))
        return RolloutPool(actors)

    @staticmethod
    def attach(names: list[str]) -> RolloutPool:
        """The pool of already started actors, by name (after the spawning rank's barrier)."""
        import ray

        return RolloutPool([ray.get_actor(name, namespace=ACTOR_NAMESPACE) for name in names])

    def generate(self, prompts: Sequence[str], n: int, seed: int, temperature: float | None = None) -> Rollouts:
        import ray

        size = -(-len(prompts) // len(self.actors))
        chunks = [list(prompts[i:i + size]) for i in range(0, len(prompts), size)]
        parts = ray.get([actor.generate.remote(chunk, n, seed * 131 + i, temperature)
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

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int, at_precision: bool = True) -> None:
        """``at_precision=False`` (bf16 weights, for an evaluation) reaches engines that round the weights
        themselves; over NCCL vLLM's own FP8 quantization applies either way.

        ``state_dict`` may be lazy (:class:`isosweep.trial.learner.GatheredWeights`): over NCCL each tensor
        goes from the GPU as it is read; through the object store each becomes a compact host copy (a view
        into a trainer's flat buffer would ship the whole buffer)."""
        if self.sender is not None:
            self.sender.send(state_dict, version)
        else:
            import ray

            ref = ray.put({name: tensor.detach().cpu().clone() for name, tensor in state_dict.items()})
            ray.get([actor.update_weights.remote(ref, version, at_precision) for actor in self.actors])
        self.policy_version = version
