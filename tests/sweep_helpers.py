"""Helpers shared by the end-to-end sweep tests (test_sweep, test_hpo_sweep)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from isosweep.track import runs
from isosweep.trial.files import TrialDir
from isosweep.trial.localhost import free_port

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


def check_mlflow_matches_the_trials(client, sweep, runs_dir: Path) -> None:
    """One FINISHED child per trial; every eval logged once, at step = rollouts, as in metrics.jsonl."""
    found = {r.data.tags[runs.TRIAL_TAG]: r for r in children(client, sweep.sweep_id)}
    assert sorted(found) == sorted(p.key for p in sweep.trials)
    for point in sweep.trials:
        run = found[point.key]
        assert run.info.status == "FINISHED"
        records = TrialDir(runs_dir / sweep.sweep_id / "trials" / point.key).records()
        steps = [r["step"] for r in records]
        assert steps == sorted(set(steps)) and records[-1]["step"] == point.cfg.budget // (point.cfg.Bp * point.cfg.n)
        history = sorted(client.get_metric_history(run.info.run_id, "eval/mean_at_4"), key=lambda m: m.step)
        assert [(m.step, m.value) for m in history] == [(r["rollouts"], r["eval/mean@4"]) for r in records]
        reward_steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/reward")]
        assert len(reward_steps) == len(set(reward_steps)) == records[-1]["step"]
        assert run.data.params["n"] == str(point.cfg.n) and run.data.params["Bp"] == str(point.cfg.Bp)


def wait_for(predicate, timeout: float, what: str, every: float = 0.25) -> None:
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


LOOPBACK_ADDRESSES = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def listeners_while_running(proc, every: float = 0.5) -> set[tuple[str, int, str]]:
    """``(address, port, process name)`` of every listening TCP socket that ``proc`` or any process
    under it held while ``proc`` ran, sampled every ``every`` seconds until it exits."""
    import psutil  # reason: a dependency of Ray, used only by the tests that list sockets

    seen: set[tuple[str, int, str]] = set()
    while proc.poll() is None:
        try:
            tree = {p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            break
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.pid in tree:
                try:
                    name = tree[conn.pid].name()
                except psutil.Error:
                    name = "?"
                seen.add((conn.laddr.ip, conn.laddr.port, name))
        time.sleep(every)
    return seen


def signal_and_wait(proc, sig: int, timeout: float = 120, teardown: float = 60) -> float:
    """Send ``sig`` to ``proc``, wait for it to exit, then for the Ray it had started (GCS, raylet and every
    worker: what could still write to a trial folder) to be gone, at most ``teardown`` seconds; returns the
    seconds that last wait took. A sweep started next then finds no trial of the old one still running. Ray's
    node agents are not waited for: after a SIGKILL they outlive the rest by about a minute, doing nothing."""
    import psutil  # reason: a dependency of Ray, used only by the tests that follow process trees

    def counts(p) -> bool:
        name = p.name()
        return name in ("gcs_server", "raylet") or (name.startswith("ray::") and not name.endswith("Agent"))

    tree = []
    try:
        for p in psutil.Process(proc.pid).children(recursive=True):
            try:
                if counts(p):
                    tree.append(p)
            except psutil.Error:
                pass
    except psutil.NoSuchProcess:
        pass
    proc.send_signal(sig)
    proc.wait(timeout=timeout)
    start = time.monotonic()
    psutil.wait_procs(tree, timeout=teardown)
    return time.monotonic() - start


class Forwarder:
    """127.0.0.1:<port> -> the server at ``target``; :meth:`down` refuses and cuts connections, :meth:`up` serves."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = free_port()
        self.listener: socket.socket | None = None
        self.open: list[socket.socket] = []
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.listener, self.serving = listener, True
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        self.serving = False
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept(); close() alone does not
        except OSError:
            pass
        self.listener.close()
        for conn in self.open:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self.open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if not self.serving:
                client.close()
                return
            server = socket.create_connection(self.target)
            self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def processes_under(temp_dir: str) -> list[int]:
    """The processes of a Ray started with ``--temp-dir temp_dir``: every one names it on its command line."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and temp_dir.encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            pass
    return pids


def kill_ray_under(temp_dir: str) -> None:
    """Stop the Ray processes of :func:`processes_under` ``temp_dir``, and only those: `ray stop` would stop
    every Ray on the machine."""
    for attempt in range(3):
        pids = processes_under(temp_dir)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM if attempt == 0 else signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3  # up to 3 s for them to exit before the next, harder signal
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.1)


@contextmanager
def another_ray():
    """A second, bare Ray head on this machine (no CPUs, no dashboard) while the block runs: what a sweep or a
    test running beside this one looks like to Ray's process scans. Stopped by its temp dir afterwards."""
    ray = str(Path(sys.executable).with_name("ray"))
    temp_dir = tempfile.mkdtemp(prefix="isr-o")  # Unix socket paths are limited to ~107 bytes: keep it short
    port = free_port()
    try:
        subprocess.run([ray, "start", "--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false",
                        "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--disable-usage-stats"],
                       check=True, capture_output=True, timeout=300)
        yield f"127.0.0.1:{port}"
    finally:
        kill_ray_under(temp_dir)
