"""`make submit` rehearsed on this machine: a Ray head and a second Ray node, the smoke sweep as a Ray job."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from isosweep.run.submit import EXCLUDES, entrypoint
from isosweep.spec.grid import load_sweep
from isosweep.track import runs
from isosweep.trial.localhost import free_port
from sweep_helpers import kill_ray_under

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


def test_the_job_runs_the_uploaded_code_and_joins_its_cluster():
    command = entrypoint("sweeps/smoke.yaml", "2e3", "~/runs")
    assert command[:5] == ["env", "PYTHONPATH=platform", "python", "-m", "isosweep.cli"]
    assert command[5:] == ["sweep", "sweeps/smoke.yaml", "--address", "auto", "--runs", "~/runs", "--no-dashboards",
                           "--budget", "2e3"]
    assert {".venv", ".git", "runs", ".mlflow"} <= set(EXCLUDES)


def test_submit_refuses_a_bad_sweep_before_touching_a_cluster(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nstudy: isocompute\ntrial: nope.yaml\nbudget: 100\ngrid: {n: [4], Bp: [8]}\n")
    done = subprocess.run([str(Path(sys.executable).with_name("isosweep")), "submit", str(bad), "--address",
                           "http://127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "key 'trial': no such file" in done.stderr


@pytest.mark.slow
def test_rehearsal_two_ray_nodes_run_the_submitted_smoke_sweep(mlflow_server):
    uri, _ = mlflow_server
    # Unix socket paths are limited to ~107 bytes: keep Ray's temp dirs short.
    head_tmp, worker_tmp = tempfile.mkdtemp(prefix="isr-h"), tempfile.mkdtemp(prefix="isr-w")
    gcs, dashboard = free_port(), free_port()
    # as the cluster YAMLs do: every node gets MLFLOW_TRACKING_URI before `ray start`
    # Ray 2.60 clusters authenticate with a token (~/.ray/auth_token); every node and client of
    # this one uses it, as the cluster launcher arranges on a real cluster.
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "RAY_AUTH_MODE": "token",
           # the job's `python` is the nodes' Python environment, as in the cluster image
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=120)
    runs_dir = Path(tempfile.mkdtemp(prefix="isr-runs"))
    try:
        # each node's dashboard agent on a port of its own: at Ray's fixed default (52365) the head's agent does
        # not start if anything else holds that port (a Ray an earlier test left), and no job can be submitted
        subprocess.run([RAY, "start", "--head", f"--port={gcs}", "--num-cpus=1", "--include-dashboard=true",
                        "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", f"--temp-dir={head_tmp}",
                        f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, timeout=300)
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{gcs}", "--num-cpus=2", f"--temp-dir={worker_tmp}",
                        f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"],
                       env=env, check=True, capture_output=True, timeout=300)
        address = f"http://127.0.0.1:{dashboard}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the second node registers with the head
            status = subprocess.run([RAY, "status", f"--address=127.0.0.1:{gcs}"], env=env, capture_output=True,
                                    text=True, timeout=120).stdout
            if "/3.0 CPU" in status:
                break
            time.sleep(2)
        assert "/3.0 CPU" in status, status
        # the same path as `make submit ADDRESS=... SWEEP=sweeps/smoke.yaml BUDGET=...`
        done = subprocess.run(["make", "-s", "submit", f"ADDRESS={address}", "SWEEP=sweeps/smoke.yaml", "BUDGET=2048",
                               f"RUNS_ON_CLUSTER={runs_dir}"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=480)  # submit itself waits up to 300 s for the head's job agent
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert "[submit] job raysubmit_" in done.stdout and "ray job logs --address" in done.stdout
        job = done.stdout.split("[submit] job ")[1].split()[0]
        # The job's status is polled from a process of its own, with the cluster's RAY_AUTH_MODE: Ray reads a
        # process's auth mode once, and an earlier test in this pytest process may have read it as disabled.
        waiter = ("import sys, time\nfrom isosweep.run.submit import job_status\n"
                  "deadline = time.monotonic() + 900\n"
                  "while (state := job_status(sys.argv[1], sys.argv[2])) not in ('SUCCEEDED', 'FAILED', 'STOPPED') "
                  "and time.monotonic() < deadline:\n    time.sleep(1)\nprint(state)\n")
        polled = subprocess.run([sys.executable, "-c", waiter, address, job], env=env, capture_output=True, text=True,
                                timeout=960)
        state = (polled.stdout.split() or ["?"])[-1]
        logs = subprocess.run([RAY, "job", "logs", "--address", address, job], env=env, capture_output=True,
                              text=True, timeout=120).stdout
        assert state == "SUCCEEDED", logs[-4000:] + polled.stderr[-2000:]
        assert "frontier of mean@4" in logs and "2/2 trials done" in logs
        assert "1 at a time" not in logs and "2 at a time" in logs  # concurrency from the 3-CPU cluster

        sweep = load_sweep(ROOT / "sweeps/smoke.yaml", budget=2048)  # not the id test_sweep uses
        client = runs.client(uri)
        parent = runs.find_parent(client, sweep.sweep_id)
        assert parent.info.status == "FINISHED" and parent.data.tags["isosweep.out"].startswith(str(runs_dir))
        runs_of = client.search_runs([runs.experiment_id(client)],
                                     filter_string=f"tags.`{runs.SWEEP_TAG}` = '{sweep.sweep_id}' and "
                                                   "tags.`isosweep.kind` = 'trial'")
        assert sorted(r.data.tags[runs.TRIAL_TAG] for r in runs_of) == ["n4-Bp8", "n8-Bp8"]
        assert all(r.info.status == "FINISHED" and client.get_metric_history(r.info.run_id, "eval/mean_at_4")
                   for r in runs_of)
        assert "frontier/frontier.csv" in {a.path for a in client.list_artifacts(parent.info.run_id, "frontier")}
    finally:
        kill_ray_under(worker_tmp)
        kill_ray_under(head_tmp)
