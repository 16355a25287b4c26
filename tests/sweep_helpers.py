"""Helpers shared by the end-to-end sweep tests (test_sweep, test_hpo_sweep)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from isosweep.track import runs

ROOT = Path(__file__).resolve().parents[1]
ISOSWEEP = str(Path(sys.executable).with_name("isosweep"))


def env_for(mlflow_env: dict) -> dict:
    env = {**os.environ, **mlflow_env}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def children(client, sweep_id: str) -> list:
    return client.search_runs([runs.experiment_id(client)],
                              filter_string=f"tags.`{runs.SWEEP_TAG}` = '{sweep_id}' and tags.`isosweep.kind` = 'trial'")


def record_models(client, run_id: str) -> dict[int, object]:
    """A trial run's record checkpoints (MLflow logged models), by rollouts."""
    found = client.search_logged_models([runs.experiment_id(client)], filter_string=f"source_run_id = '{run_id}'")
    return {int(m.tags["isosweep.rollouts"]): m for m in found}


def wait_for(predicate, timeout: float, what: str, every: float = 1.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def own_smoke(tmp_path: Path, budget: int | None = None):
    """``sweeps/smoke.yaml`` under a name of its own (``smoke-<test folder>``): a test that makes MLflow runs for
    it by hand does not claim the real smoke sweep's id, which a later end-to-end test runs for real (a
    sweep's parent run records its runs folder, and a rerun elsewhere is refused)."""
    import yaml

    from isosweep.spec.grid import load_sweep

    data = yaml.safe_load((ROOT / "sweeps" / "smoke.yaml").read_text())
    data["name"] = "smoke-" + "".join(c if c.isalnum() else "-" for c in tmp_path.name.lower())
    data["trial"] = str(ROOT / "sweeps" / data["trial"])
    path = tmp_path / "own-smoke.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_sweep(path, budget=budget)
