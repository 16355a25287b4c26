"""Fixtures shared by the trial-level tests, and the suite's order.

Modules whose tests need no base model run first while a background process builds the models the
others train (see ``pytest_collection_finish``): on a fresh machine that takes the builds off the
suite's wall time."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EASY = ROOT / "sweeps" / "trials" / "easy.yaml"
# The base models the suite's trials train (arithmetic, seed 0): tiny-1m everywhere, tiny-0.3m in the smoke
# studies' ladders. Building them takes a minute or two each on 2 cores.
SUITE_MODELS = ("tiny-1m", "tiny-0.3m")
PREBUILD_OFF = "ISOSWEEP_TEST_PREBUILD"
PREBUILDER = pytest.StashKey[subprocess.Popen]()


def needs_a_model(item) -> bool:
    """A test that trains or serves a base model, or might (a ``slow`` end-to-end run)."""
    return bool(item.get_closest_marker("slow")) or "base_model" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(session, config, items):
    """Modules with no test that needs a base model run first, in their usual order, then the others.

    Whole modules move (never single tests: a module's fixtures are set up once), so the background
    build started below has the unit tests' minutes to finish before the first test waits for it."""
    modules: dict = {}
    for item in items:
        modules.setdefault(getattr(item, "module", None), []).append(item)
    later = {module for module, its in modules.items() if any(needs_a_model(item) for item in its)}
    items[:] = ([item for item in items if getattr(item, "module", None) not in later]
                + [item for item in items if getattr(item, "module", None) in later])


def pytest_collection_finish(session):
    """Start building the suite's missing base models in a background process, on one thread.

    The tests run one at a time in this process, mostly on one core, and the first that needs a model
    would otherwise build it in the foreground; building them on the other core meanwhile takes the
    build off the suite's wall time. A test that asks for a model first waits for the build on the
    model's lock (``ensure_base_model``) and gets the same cached directory. Only when a collected test
    is ``slow`` or asks for ``base_model`` (a ``-k`` pick of unit tests builds nothing);
    ``ISOSWEEP_TEST_PREBUILD=0`` turns it off. The builder stops with the session (a build cut short
    leaves nothing behind: it writes to a temporary folder and renames it when done).
    """
    if os.environ.get(PREBUILD_OFF) == "0":
        return
    if not any(needs_a_model(item) for item in session.items):
        return
    from isosweep.models.warmup import REPORT_FILE, base_model_dir

    missing = [size for size in SUITE_MODELS if not (base_model_dir(size, "arithmetic", 0) / REPORT_FILE).exists()]
    if not missing:
        return
    log = base_model_dir(missing[0], "arithmetic", 0).parent / "prebuild.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "platform"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with open(log, "w") as out:
        builder = subprocess.Popen([sys.executable, "-m", "isosweep.cli", "models", "build", "--sizes", *missing],
                                   cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    session.config.stash[PREBUILDER] = builder


def pytest_sessionfinish(session):
    """Stop a background build still running (a ``-x`` stop, an interrupted run): SIGINT, so that the
    build removes its temporary folder on the way out."""
    builder = session.config.stash.get(PREBUILDER, None)
    if builder is not None and builder.poll() is None:
        builder.send_signal(signal.SIGINT)
        try:
            builder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            builder.kill()
            builder.wait()


@pytest.fixture(scope="session")
def base_model() -> Path:
    """The tiny-1m arithmetic base model (built and cached on first use)."""
    from isosweep.models.warmup import ensure_base_model

    return ensure_base_model("tiny-1m", "arithmetic", 0)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real local MLflow server (SQLite + on-disk artifacts) for the whole session.

    Yields ``(uri, env)``: ``env`` points isosweep's server management at it
    (``ISOSWEEP_MLFLOW_DIR``/``ISOSWEEP_MLFLOW_PORT``, no ``MLFLOW_TRACKING_URI``), so a
    subprocess sweep given ``env`` finds and reuses this server.
    """
    import os

    from isosweep.track import server

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
