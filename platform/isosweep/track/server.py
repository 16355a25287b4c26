"""The local MLflow tracking server: started (or reused) on 127.0.0.1, stopped by its PID.

If ``MLFLOW_TRACKING_URI`` is unset, :func:`ensure_server` starts (or reuses) ``mlflow server``
with a SQLite backend and on-disk artifacts under ``$ISOSWEEP_MLFLOW_DIR`` (default ``.mlflow``),
bound to 127.0.0.1 on ``$ISOSWEEP_MLFLOW_PORT`` (default 5000). A server already answering on that
port is reused only if it is the one recorded in the store's ``server.pid`` (isosweep's own for
this store); any other is an error naming both ways out. It only talks HTTP to the server and
starts it as a process: it does not import mlflow.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from isosweep.spec.yamlio import ConfigError

EXPERIMENT = "isosweep"
"""The MLflow experiment every study and trial of isosweep is logged to."""


def store_dir() -> Path:
    root = Path(__file__).resolve().parents[3]
    return Path(os.environ.get("ISOSWEEP_MLFLOW_DIR", root / ".mlflow")).resolve()


def server_port() -> int:
    text = os.environ.get("ISOSWEEP_MLFLOW_PORT", "5000")
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise ConfigError(f"ISOSWEEP_MLFLOW_PORT={text!r}: not a port; allowed: a whole number from 1 to 65535 "
                         "(the local MLflow server's port, default 5000)")
    return port


def own_server(store: Path) -> bool:
    """Whether the server recorded in ``store/server.pid`` is alive and serves this store (its command line
    names the store, where the system shows command lines)."""
    pid_file = store / "server.pid"
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists():
        return str(store) in cmdline.read_bytes().decode(errors="replace")
    return True


def answers(uri: str, timeout: float = 2.0) -> bool:
    """Whether an MLflow server answers ``uri``'s ``/health`` within ``timeout`` seconds (one request, no
    retries: the MLflow client's own retries take minutes against a server that is down)."""
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def tracking_wait_s() -> float:
    """How long to wait for ``$MLFLOW_TRACKING_URI`` to answer: ``$ISOSWEEP_MLFLOW_WAIT_S`` seconds, default 20
    (a server that is still starting gets that long)."""
    text = os.environ.get("ISOSWEEP_MLFLOW_WAIT_S", "20")
    try:
        wait_s = float(text)
    except ValueError:
        wait_s = math.nan
    if not 0 <= wait_s <= 86400:
        raise ConfigError(f"ISOSWEEP_MLFLOW_WAIT_S={text!r}: not a wait; allowed: seconds from 0 to 86400 (how long "
                          "to wait for MLFLOW_TRACKING_URI to answer, default 20)")
    return wait_s


def reachable(uri: str) -> str:
    """``uri`` (from ``MLFLOW_TRACKING_URI``) if an MLflow server answers its ``/health`` within
    :func:`tracking_wait_s`; else a :class:`ConfigError` naming it -- at once, rather than after the MLflow
    client's minutes of retries with a study folder and runs half made. Only HTTP(S) servers are checked (a
    ``file:`` or database URI is MLflow's to open)."""
    if not uri.startswith(("http://", "https://")):
        return uri
    wait_s = tracking_wait_s()
    deadline = time.monotonic() + wait_s
    while not answers(uri, timeout=5.0):
        if time.monotonic() > deadline:
            raise ConfigError(f"MLFLOW_TRACKING_URI={uri}: no MLflow server answers at {uri.rstrip('/')}/health "
                              f"(tried for {wait_s:g} s; ISOSWEEP_MLFLOW_WAIT_S sets how long); start it, correct "
                              "the variable, or unset it to use isosweep's local server")
        time.sleep(1.0)
    return uri


def ensure_server(log=print, wait_s: float = 300.0) -> str:
    """The tracking URI: ``$MLFLOW_TRACKING_URI`` if set, else a local server (started if not up).

    The local server outlives the sweep (so the UI stays browsable); :func:`stop_server` or
    ``make ui-stop`` stops it. Its PID and log are in the store directory.
    """
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return reachable(os.environ["MLFLOW_TRACKING_URI"])
    store, port = store_dir(), server_port()
    uri = f"http://127.0.0.1:{port}"
    if own_server(store) and not answers(uri):
        # our server is alive but slow to answer (a busy machine): wait for it; a second one could not bind the port
        log(f"[mlflow] the local server at {uri} is running but slow to answer: waiting for it")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and own_server(store):
            if answers(uri, timeout=10.0):
                return uri
            time.sleep(1.0)
        if own_server(store):
            raise RuntimeError(f"the local MLflow server at {uri} (pid in {store / 'server.pid'}) is running but did "
                               f"not answer /health within {wait_s:.0f} s; see {store / 'server.log'}")
    if answers(uri):
        if own_server(store):
            return uri
        raise ConfigError(f"{uri} answers as an MLflow server, but not one isosweep started for the store {store} "
                           f"(no live server recorded in {store / 'server.pid'}): set ISOSWEEP_MLFLOW_PORT to a free "
                           f"port for isosweep's own server, or MLFLOW_TRACKING_URI={uri} to log to that server")
    store.mkdir(parents=True, exist_ok=True)
    (store / "artifacts").mkdir(exist_ok=True)
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow_bin) if mlflow_bin.exists() else "mlflow", "server",
               "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
               "--artifacts-destination", str(store / "artifacts"),
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    log(f"[mlflow] starting a local tracking server on {uri} (store {store})")
    with open(store / "server.log", "ab") as out:
        # MLflow's job runner (seven huey consumers, each importing mlflow: minutes of CPU on a busy 2-core
        # machine before /health answers) serves GenAI jobs that isosweep never submits: off unless asked for.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION",
                                                                                  "false")}
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    (store / "server.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if answers(uri):
            return uri
        if proc.poll() is not None:
            (store / "server.pid").unlink(missing_ok=True)  # it never served: record no server
            tail = (store / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mlflow server exited with status {proc.returncode}; port {port} busy? "
                               f"(set ISOSWEEP_MLFLOW_PORT) -- last lines of {store / 'server.log'}:\n{tail}")
        time.sleep(0.5)
    raise RuntimeError(f"mlflow server did not answer {uri}/health within {wait_s:.0f} s; see {store / 'server.log'}")


def revive(uri: str, log=print) -> bool:
    """Restart the local server at ``uri`` if it died (a study's driver calls this as it goes); returns whether
    it did. A server named by ``MLFLOW_TRACKING_URI`` is not ours to restart, and one whose process is alive
    is only slow (a busy machine): it is left alone, since a second server could not bind its port."""
    if os.environ.get("MLFLOW_TRACKING_URI") or own_server(store_dir()) or answers(uri):
        return False
    log(f"[mlflow] the local server at {uri} stopped answering: restarting it (the trials keep their records on "
        "disk and catch MLflow up)")
    ensure_server(log)
    return True


def stop_server() -> bool:
    """Stop the local server this store started (by PID); returns whether one was running."""
    pid_file = store_dir() / "server.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    pid_file.unlink()
    try:
        os.killpg(pid, signal.SIGTERM)  # the server and its gunicorn/uvicorn workers
    except ProcessLookupError:
        return False
    for _ in range(50):
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    os.killpg(pid, signal.SIGKILL)
    return True
