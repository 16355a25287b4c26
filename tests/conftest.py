"""Fixtures shared by the trial-level tests."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EASY = ROOT / "sweeps" / "trials" / "easy.yaml"


@pytest.fixture(scope="session")
def base_model() -> Path:
    """The tiny-1m arithmetic base model (built and cached on first use)."""
    from isosweep.models.warmup import ensure_base_model

    return ensure_base_model("tiny-1m", "arithmetic", 0)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real local MLflow server (SQLite + on-disk artifacts) for the whole session.

    Yields ``(uri, env)``: ``env`` points isosweep's server management at it
    (``ISOSWEEP_MLFLOW_DIR``/``ISOSWEEP_MLFLOW_PORT``, no ``MLFLOW_TRACKING_URI``), so a
    subprocess sweep given ``env`` finds and reuses this server.
    """
    import os

    from isosweep.track import server
    from isosweep.trial.localhost import free_port

    env = {"ISOSWEEP_MLFLOW_DIR": str(tmp_path_factory.mktemp("mlflow")), "ISOSWEEP_MLFLOW_PORT": str(free_port())}
    saved = {key: os.environ.get(key) for key in (*env, "MLFLOW_TRACKING_URI")}
    os.environ.update(env)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        uri = server.ensure_server(log=lambda line: None)
        yield uri, env
    finally:
        server.stop_server()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
