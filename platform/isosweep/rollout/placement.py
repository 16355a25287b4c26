"""Names and placement of a trial's rollout actors, kept apart from the engines (no torch, no vLLM), so the
processes that only start and end trials -- a Tune trial's driver, the CLI -- can release them cheaply."""

from __future__ import annotations

import sys

ACTOR_NAMESPACE = "isosweep"
"""Ray namespace of named rollout actors (Train workers otherwise run in anonymous namespaces)."""


def actor_names(run_id: str, launch: str, count: int) -> list[str]:
    """The names of the ``count`` rollout actors of one launch of a trial's workers (``run_id``: the trial launch's)."""
    return [f"rollout-{run_id}-{launch}-{i}" for i in range(count)]


def release(run_id: str) -> int:
    """Kill every rollout actor of trial launch ``run_id`` still alive, and remove their placement groups;
    returns how many actors.

    An actor dies with the process that started it. A Ray Train worker ends with its trial, but an
    ``in_process`` trial's starter -- a Tune trial process Tune reuses, or a study's driver running one trial
    after another -- lives on, and its actor would keep its CPUs from the next trial's.
    """
    ray = sys.modules.get("ray")  # a process that never imported Ray started no actor
    if ray is None or not ray.is_initialized():
        return 0
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup

    prefix = f"rollout-{run_id}-"
    found = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == ACTOR_NAMESPACE and a["name"].startswith(prefix)]
    for actor in found:
        try:
            ray.kill(ray.get_actor(actor["name"], namespace=ACTOR_NAMESPACE))
        except ValueError:  # gone in between
            pass
    # a placement group lives as long as the job that made it (the sweep), not its maker (a trainer worker)
    for info in ray.util.placement_group_table().values():
        if info["name"].startswith(prefix) and info["state"] != "REMOVED":
            ray.util.remove_placement_group(PlacementGroup(PlacementGroupID.from_hex(info["placement_group_id"])))
    return len(found)


def group_name(prefix: str) -> str:
    """The name of the placement group of the rollout actors named ``prefix-<i>``."""
    return f"{prefix}-group"


PLACEMENT_TIMEOUT_S = 600.0
"""How long rollout actors wait for their placement group (a cluster scaling up takes minutes) before the trial
fails with what they asked for."""


def place(names: list[str], bundles: list[dict[str, float]], strategy: str, timeout_s: float = PLACEMENT_TIMEOUT_S):
    """A placement group of one bundle per rollout actor, ready, or a ``RuntimeError`` naming what it needs.

    ``strategy`` is the profile's (:func:`isosweep.spec.profiles.placement_bundles`): with ``STRICT_PACK`` the
    group is asked for on this process's node, where the trainer worker publishing the weights runs (Ray takes
    it as a hint: a node with room); Ray Train places the trainer workers in a group of their own.
    """
    import ray
    from ray.util.placement_group import placement_group

    here = ray.get_runtime_context().get_node_id() if strategy == "STRICT_PACK" else None
    group = placement_group(bundles, strategy=strategy, name=group_name(names[0].rsplit("-", 1)[0]),
                            _soft_target_node_id=here)
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(group)
        raise RuntimeError(f"the rollout actors' placement group ({len(bundles)} x {bundles[0]}, {strategy}) was not "
                           f"placed within {timeout_s:g} s; the cluster has {ray.available_resources()} free -- give "
                           "the cluster more nodes or the trial a smaller profile") from None
    return group
