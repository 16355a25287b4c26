"""Submit a sweep to a running Ray cluster as a Ray job (Ray's job submission client), with this checkout as its working dir.

    make submit CLUSTER=clusters/aws-h200.yaml SWEEP=sweeps/isocompute-easy.yaml BUDGET=1e5
      -> ray dashboard clusters/aws-h200.yaml      (SSH tunnel: 127.0.0.1:8265 -> the head's dashboard)
      -> isosweep submit --address http://127.0.0.1:8265 sweeps/... --budget 1e5
      -> JobSubmissionClient(address).submit_job(entrypoint, runtime_env={working_dir: ., ...})

The job's entrypoint is the same ``isosweep sweep`` a laptop runs, with ``--address auto``
(join the cluster it runs on) and ``PYTHONPATH=platform`` so that the uploaded copy of the code
runs, not whatever version the nodes have installed. The sweep driver runs on the head; its
trials are placed by Ray on the GPU workers. On a cluster, MLflow is the head's tracking server:
the cluster YAMLs set ``MLFLOW_TRACKING_URI`` on every node.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import time
from pathlib import Path

from isosweep.run.plan import check_memory
from isosweep.spec.study import load_study
from isosweep.spec.yamlio import ConfigError

EXCLUDES = [".venv", ".git", ".cache", ".mlflow", "runs", "bench/*.json", "**/__pycache__", ".pytest_cache",
            ".whl"]
"""What the upload of the working directory leaves out: environments, caches and local results."""


def entrypoint(spec: str, budget: str | None, runs: str, extra: list[str] | None = None) -> list[str]:
    """The command the Ray job runs on the head node, one argument per item."""
    args = ["sweep", spec, "--address", "auto", "--runs", runs, "--no-dashboards"]
    if budget:
        args += ["--budget", str(budget)]
    return ["env", "PYTHONPATH=platform", "python", "-m", "isosweep.cli", *args, *(extra or [])]


def token_auth(cluster: str | Path) -> bool:
    """Whether the cluster YAML starts Ray with token authentication (``RAY_AUTH_MODE=token`` in its start
    commands). If so, this laptop must hold the token the nodes got (``~/.ray/auth_token``, from
    ``ray get-auth-token --generate``, or ``$RAY_AUTH_TOKEN``); a missing one is a :class:`ConfigError`
    saying how to make it."""
    text = Path(cluster).read_text()
    if "RAY_AUTH_MODE=token" not in text:
        return False
    token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token")).expanduser()
    if not os.environ.get("RAY_AUTH_TOKEN") and not token.is_file():
        raise ConfigError(f"{cluster}: its nodes run Ray with token authentication, and this machine has no token "
                          f"({token} is missing): run `ray get-auth-token --generate`, then `ray up {cluster}` so the "
                          "nodes get the same token")
    return True


def ray_cli() -> str:
    candidate = Path(sys.executable).with_name("ray")
    return str(candidate) if candidate.exists() else "ray"


def submit(address: str, spec: str, budget: str | None = None, runs: str = "runs/sweeps",
           env: dict[str, str] | None = None, wait: bool = False, working_dir: str | Path = ".",
           extra: list[str] | None = None, retry_s: float = 300.0) -> str:
    """Submit the sweep ``spec`` to the Ray cluster whose dashboard is at ``address``; returns the job id.

    Ray's :class:`~ray.job_submission.JobSubmissionClient` uploads ``working_dir`` (less :data:`EXCLUDES`)
    and starts :func:`entrypoint` on the head. ``env`` adds environment variables for the job (e.g.
    ``MLFLOW_TRACKING_URI``). With ``wait`` the call prints the job's logs until it ends and raises if it
    failed. A cluster that has just started has no job agent for a while: the submission is retried for up
    to ``retry_s`` seconds. A sweep with a grid point (or an HPO study with a size) that does not fit its
    profile's GPUs is refused first, before any upload (:func:`isosweep.run.plan.check_memory`).
    """
    check_memory(load_study(spec, budget))
    from ray.job_submission import JobSubmissionClient  # Ray: seconds to import

    runtime_env = {"working_dir": str(working_dir), "excludes": EXCLUDES, "env_vars": dict(env or {})}
    command = shlex.join(entrypoint(spec, budget, runs, extra))
    deadline = time.monotonic() + retry_s
    while True:
        try:
            client = JobSubmissionClient(address)
            job = client.submit_job(entrypoint=command, runtime_env=runtime_env)
            break
        except (ConnectionError, RuntimeError) as error:
            # the head answers "No available agent to submit job" until its job agent is up
            if "No available agent" not in str(error) or time.monotonic() > deadline:
                raise RuntimeError(f"submitting to {address} failed: {error}") from error
            time.sleep(3)
    if wait:
        asyncio.run(print_logs(client, job))
        status = job_status(address, job)
        if status != "SUCCEEDED":
            raise RuntimeError(f"job {job} ended {status}; see `ray job logs --address {address} {job}`")
    return job


async def print_logs(client, job: str) -> None:
    """Print a job's logs as they come until the job ends."""
    async for lines in client.tail_job_logs(job):
        print(lines, end="", flush=True)


def job_status(address: str, job: str) -> str:
    """PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED (Ray's job states)."""
    from ray.job_submission import JobSubmissionClient  # Ray: seconds to import

    return str(JobSubmissionClient(address).get_job_status(job).value)


def how_to_follow(address: str, job: str, cluster: str | None) -> str:
    mlflow = (f"ray attach {cluster} --port-forward 5000 is not enough where MLflow binds the head's private "
              f"IP: ssh -L 5000:<head private ip>:5000 <head> (see clusters/README.md), then http://127.0.0.1:5000"
              if cluster else "the MLflow server the job logs to (MLFLOW_TRACKING_URI)")
    return (f"[submit] job {job} submitted to {address}\n"
            f"[submit] follow it:  ray job logs --address {address} --follow {job}\n"
            f"[submit] status:     ray job status --address {address} {job}\n"
            f"[submit] stop it:    ray job stop --address {address} {job}   (re-submitting resumes the sweep)\n"
            f"[submit] MLflow:     {mlflow}")
