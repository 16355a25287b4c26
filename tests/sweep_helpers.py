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


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
