"""The dry run: trial list, resources, GPU-hours and concurrency on a cluster, with nothing started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from isosweep.run.plan import cluster_capacity, concurrency_on, plan, trial_gpu_hours
from isosweep.spec.grid import load_sweep
from isosweep.spec.trial import TrialConfig, steps

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "sweeps" / "qwen25-gsm8k-h200.yaml"
CLUSTERS = sorted(p for p in (ROOT / "clusters").glob("*.yaml") if p.name != "profiles.yaml")


def test_the_real_model_study_loads_with_h200_fp8_trials():
    sweep = load_sweep(REAL)
    for point in sweep.trials:
        assert point.cfg.profile == "h200-node" and point.cfg.rollout.precision == "fp8"
        assert point.cfg.model.name.startswith("Qwen/") and point.cfg.task.name.endswith(".jsonl")


def test_gpu_hours_follow_the_flops_model():
    sweep = load_sweep(REAL)
    est = sweep.spec.estimate
    for point in sweep.trials:
        rollouts = steps(point.cfg) * point.cfg.Bp * point.cfg.n
        expected = 12 * est.params * est.tokens_per_rollout * rollouts / (est.flops_per_gpu * est.utilisation) / 3600
        assert trial_gpu_hours(sweep, point.cfg) == pytest.approx(expected)
    assert trial_gpu_hours(load_sweep(ROOT / "sweeps/smoke.yaml"), load_sweep(ROOT / "sweeps/smoke.yaml").trials[0].cfg) is None


def test_concurrency_counts_whole_trials_per_node_and_pools_nodes_for_multinode_trials():
    nodes = [{"name": "h200", "CPU": 192.0, "GPU": 8.0, "max_workers": 3}, {"name": "cpu", "CPU": 64.0, "GPU": 0.0,
                                                                           "max_workers": 10}]
    assert concurrency_on({"CPU": 129.0, "GPU": 8.0}, 1, nodes) == 3
    assert concurrency_on({"CPU": 40.0, "GPU": 4.0}, 1, nodes) == 6  # two per H200 node, none on CPU nodes
    assert concurrency_on({"CPU": 100.0, "GPU": 16.0}, 2, nodes[:1]) == 1  # 3 nodes hold one 2-node trial
    assert concurrency_on({"CPU": 1.0, "GPU": 0.0}, 1, nodes) == 3 * 192 + 10 * 64


@pytest.mark.parametrize("cluster", CLUSTERS, ids=[p.name for p in CLUSTERS])
def test_every_cluster_can_be_planned_for(cluster):
    capacity = cluster_capacity(cluster)
    assert capacity and all(node["GPU"] == 8 and node["max_workers"] >= 1 for node in capacity)
    text = plan(load_sweep(REAL), cluster)
    assert "trials at once" in text and "GPU-hours" in text and "no trial fits" not in text


def test_dry_run_from_the_command_line_starts_nothing():
    done = subprocess.run([str(Path(sys.executable).with_name("isosweep")), "sweep", str(REAL), "--dry-run",
                           "--cluster", str(ROOT / "clusters/aws-h200.yaml")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("n") and "h200-node" in line for line in lines) == len(load_sweep(REAL).trials)
    assert "8 trials at once" in done.stdout and "expected GPU-hours" in done.stdout
    assert "Started a local Ray" not in done.stdout + done.stderr


def test_a_profile_decides_the_trainers_deepspeed_settings():
    from isosweep.trial.learner import deepspeed_config

    cpu = TrialConfig(budget=1024, trainer={"zero_stage": 2})
    assert deepspeed_config(cpu, gpu=False)["zero_optimization"] == {"stage": 2}  # the trial's stage on cpu-tiny
    assert deepspeed_config(cpu, gpu=False)["bf16"] == {"enabled": False}
    h200 = TrialConfig(budget=1024, profile="h200-node", trainer={"zero_stage": 1})
    assert deepspeed_config(h200, gpu=True)["zero_optimization"] == {"stage": 3}  # the profile's ZeRO-3 wins
    assert deepspeed_config(h200, gpu=True)["bf16"] == {"enabled": True}
