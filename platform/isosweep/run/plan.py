"""What a sweep will ask for, before anything starts: trials, resources, GPU-hours, concurrency.

``isosweep sweep <file> --dry-run [--cluster clusters/<x>.yaml]`` prints this plan. Concurrency
on a cluster is read from its YAML: each worker node type's ``resources`` times its
``max_workers``; a one-node trial (profile ``nodes: 1``) must fit one node of a type, so the
count is per node (``floor(node GPUs / trial GPUs)``) summed over the nodes the cluster can
grow to. GPU-hours come from the sweep's ``estimate`` section (FLOPs per rollout
``12 * params * tokens``, divided by the GPU's peak times the utilisation achieved). Without an estimate
the plan says so. On GPU profiles it also prints the memory of each grid point per trainer rank and per
rollout GPU (:mod:`isosweep.run.memory`); :func:`check_memory` refuses a sweep with a point that does not fit.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from isosweep.run.memory import TrialMemory, memory_table, plan_trials, refuse_unfit
from isosweep.spec.grid import EstimateSpec, Sweep
from isosweep.spec.hpo import HPOStudy
from isosweep.spec.profiles import get_profile
from isosweep.spec.trial import eval_steps, learning_rate, resources_of, rollout_engine, steps
from isosweep.spec.yamlio import ConfigError, read_yaml

FLOPS_PER_PARAM_TOKEN = 12
"""Generation (2) + policy and reference log-probs (2 + 2) + training step (6)."""


def cluster_capacity(path: str | Path) -> list[dict]:
    """Worker node types of a ``ray up`` YAML: name, resources and how many the cluster grows to."""
    cfg = read_yaml(path)
    provider = cfg.get("provider") or {}
    if provider.get("type") == "local" and "available_node_types" not in cfg:
        return [_local_workers(path, cfg, provider)]
    head = cfg.get("head_node_type")
    types = cfg.get("available_node_types")
    if not isinstance(types, dict):
        raise ConfigError(f"{path}: key 'available_node_types': missing; a cluster YAML for `ray up` lists its node types")
    out = []
    for name, body in types.items():
        if name == head:
            continue
        resources = body.get("resources", {})
        out.append({"name": name, "CPU": float(resources.get("CPU", 0)), "GPU": float(resources.get("GPU", 0)),
                    "max_workers": int(body.get("max_workers", cfg.get("max_workers", 0)))})
    return out


def _local_workers(path, cfg: dict, provider: dict) -> dict:
    """Ray's ``local`` provider: the machines in ``worker_ips``, with the GPUs their ``ray start`` declares
    (CPUs: ``--num-cpus`` if given, else the 192 of an 8 x H200 machine, which Ray would detect)."""
    command = " ".join(str(c) for c in cfg.get("worker_start_ray_commands", []))
    gpus = re.search(r"--num-gpus[= ](\d+)", command)
    cpus = re.search(r"--num-cpus[= ](\d+)", command)
    if gpus is None:
        raise ConfigError(f"{path}: key 'worker_start_ray_commands': no --num-gpus; the plan needs the GPUs per machine")
    return {"name": "worker_ips", "CPU": float(cpus.group(1)) if cpus else 192.0, "GPU": float(gpus.group(1)),
            "max_workers": len(provider.get("worker_ips") or [])}


def concurrency_on(need: dict[str, float], nodes: int, capacity: list[dict]) -> int:
    """Trials that fit at once: per node for one-node trials, over the pooled resources for multi-node ones."""
    if nodes == 1:
        total = 0
        for node in capacity:
            fits = [math.floor(node[k] / need[k] + 1e-9) for k in ("CPU", "GPU") if need[k] > 0]
            total += (min(fits) if fits else 0) * node["max_workers"]
        return total
    pooled = {k: sum(node[k] * node["max_workers"] for node in capacity) for k in ("CPU", "GPU")}
    fits = [math.floor(pooled[k] / need[k] + 1e-9) for k in ("CPU", "GPU") if need[k] > 0]
    node_limit = sum(node["max_workers"] for node in capacity) // nodes
    return min(fits + [node_limit]) if fits else 0


def trial_gpu_hours(sweep: Sweep, cfg) -> float | None:
    """Expected GPU-hours of one trial, or None without a cost model."""
    estimate = sweep.spec.estimate
    if estimate is None:
        return None
    flops = FLOPS_PER_PARAM_TOKEN * estimate.params * estimate.tokens_per_rollout * steps(cfg) * cfg.Bp * cfg.n
    return flops / (estimate.flops_per_gpu * estimate.utilisation) / 3600


def prompt_tokens(study: Sweep | HPOStudy) -> int:
    """The longest prompt the memory plan pads sequences to: a sweep's ``estimate.prompt_tokens``, else its default."""
    estimate = study.spec.estimate if isinstance(study, Sweep) else None
    return estimate.prompt_tokens if estimate else EstimateSpec.model_fields["prompt_tokens"].default


def study_memory(study: Sweep | HPOStudy) -> list[TrialMemory]:
    """The memory plan of every distinct trial shape of a study on GPU profiles (seeds share one): a sweep's grid
    points, or an HPO study's full-fidelity trial at each model size (its search space changes no shape)."""
    if isinstance(study, Sweep):
        first: dict[str, tuple] = {}
        for p in study.trials:
            first.setdefault(p.config_key, (p.key, p.cfg))
        points = list(first.values())
    else:
        low = {k: r.low for k, r in study.spec.space.items()}
        points = [(size, study.trial_config(low, size, study.budget)) for size, _ in study.space.ladder]
    return plan_trials(points, prompt_tokens(study))


def check_memory(study: Sweep | HPOStudy) -> None:
    """A :class:`ConfigError` naming each grid point (or HPO size) that does not fit its profile's GPUs."""
    refuse_unfit(study_memory(study), study.path)


def plan(sweep: Sweep, cluster: str | Path | None = None) -> str:
    """The dry run's text."""
    lines = [f"sweep {sweep.sweep_id}: {sweep.spec.study} study from {sweep.path}, C = {sweep.budget:,} rollouts per trial",
             f"{'trial':<14} {'n':>4} {'Bp':>5} {'M':>7} {'lr':>9} {'evals':>5}  {'model':<20} {'engine':<6} "
             f"{'profile':<14} {'CPU':>6} {'GPU':>4} {'GPU-h':>8}"]
    total_hours, hours_known = 0.0, True
    for point in sweep.trials:
        cfg = point.cfg
        need = resources_of(cfg)
        hours = trial_gpu_hours(sweep, cfg)
        hours_known &= hours is not None
        total_hours += hours or 0.0
        lines.append(f"{point.key:<14} {cfg.n:>4} {cfg.Bp:>5} {steps(cfg):>7} {learning_rate(cfg):>9.2e} "
                     f"{len(eval_steps(cfg)):>5}  {cfg.model.name[:20]:<20} {rollout_engine(cfg):<6} {cfg.profile:<14} "
                     f"{need['CPU']:>6g} {need['GPU']:>4g} {'-' if hours is None else f'{hours:,.1f}':>8}")
    rollouts = sum(steps(p.cfg) * p.cfg.Bp * p.cfg.n for p in sweep.trials)
    lines.append(f"{len(sweep.trials)} trials, {rollouts:,} rollouts in all")
    first = sweep.trials[0].cfg
    need = {k: max(resources_of(p.cfg)[k] for p in sweep.trials) for k in ("CPU", "GPU")}
    profile = get_profile(first.profile)
    if hours_known and need["GPU"] > 0:
        lines.append(f"expected GPU-hours: {total_hours:,.0f} in all (estimate: {sweep.spec.estimate.params:.3g} params, "
                     f"{sweep.spec.estimate.tokens_per_rollout:g} tokens per rollout, "
                     f"{sweep.spec.estimate.utilisation:.0%} of {sweep.spec.estimate.flops_per_gpu:.3g} FLOP/s per GPU)")
    elif need["GPU"] > 0:
        lines.append("expected GPU-hours: unknown (add an `estimate:` section with params and tokens_per_rollout)")
    if cluster:
        capacity = cluster_capacity(cluster)
        at_once = concurrency_on(need, profile.nodes, capacity)
        grow = ", ".join(f"{n['max_workers']} x {n['name']} ({n['CPU']:g} CPU, {n['GPU']:g} GPU)" for n in capacity)
        lines.append(f"on {cluster} (up to {grow}): {at_once} trials at once "
                     f"(one trial: {need['CPU']:g} CPU, {need['GPU']:g} GPU on {profile.nodes} node(s))")
        if at_once < 1:
            lines.append("  no trial fits this cluster: choose a smaller profile or a cluster with bigger nodes")
        elif hours_known and need["GPU"] > 0:
            rounds = math.ceil(len(sweep.trials) / at_once)
            longest = max(trial_gpu_hours(sweep, p.cfg) / need["GPU"] for p in sweep.trials)
            lines.append(f"  about {rounds} round(s) of trials, {longest:,.1f} h wall each at most: "
                         f"~{rounds * longest:,.1f} h of wall time, {total_hours:,.0f} GPU-hours")
    lines += memory_table(study_memory(sweep), prompt_tokens(sweep))
    lines.append("which allocation to run at a budget, from finished sweeps: isosweep recommend --budget C")
    return "\n".join(lines)
