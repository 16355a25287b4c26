"""MLflow: the local tracking server, a sweep's parent run, each trial's child run, batched logging.

Layout in MLflow: one experiment (``isosweep``); a sweep is a parent run tagged
``isosweep.sweep_id``; each trial is a child run (``mlflow.parentRunId``) tagged
``isosweep.trial``, whose params are the trial's full config (dotted keys). Every metric is
logged with ``step`` = rollouts consumed, so MLflow's charts overlay configs on one compute
axis: eval metrics (``eval/*``, ``system/*``; ``@`` spelled ``_at_``, e.g. ``eval/mean_at_4``,
as MLflow refuses ``@`` in names) at each evaluation, per-step training statistics
(``train/*``, ``rollout/*``, ``mismatch/*``, ``ais/*``, ``time/*``) in batches at each
evaluation. Checkpoints that break the trial's record are logged under ``records/`` and tagged.

Runs are found again by their tags, so a resumed sweep continues its runs instead of
creating new ones, and a trial's logger starts after the last step already in MLflow (the
trial's ``metrics.jsonl``/``steps.jsonl`` are the source of truth; MLflow is caught up to them).

If ``MLFLOW_TRACKING_URI`` is unset, :func:`ensure_server` starts (or reuses) ``mlflow server``
with a SQLite backend and on-disk artifacts under ``$ISOSWEEP_MLFLOW_DIR`` (default ``.mlflow``),
bound to 127.0.0.1 on ``$ISOSWEEP_MLFLOW_PORT`` (default 5000).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

EXPERIMENT = "isosweep"
SWEEP_TAG = "isosweep.sweep_id"
TRIAL_TAG = "isosweep.trial"
BATCH = 1000  # MLflow's log_batch takes at most 1000 metrics per call
RECORD_FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json")
"""What a record checkpoint logs to MLflow: the model and tokenizer, not the optimizer state."""
STEP_PREFIXES = ("train/", "rollout/", "mismatch/", "ais/", "time/")
EVAL_PREFIXES = ("eval/", "system/", "time/eval_s")


def mlflow_name(key: str) -> str:
    """MLflow's name for a metric key: ``eval/mean@4`` -> ``eval/mean_at_4`` (MLflow refuses '@')."""
    return key.replace("@", "_at_")


def store_dir() -> Path:
    root = Path(__file__).resolve().parents[2]
    return Path(os.environ.get("ISOSWEEP_MLFLOW_DIR", root / ".mlflow")).resolve()


def server_port() -> int:
    return int(os.environ.get("ISOSWEEP_MLFLOW_PORT", "5000"))


def _healthy(uri: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def ensure_server(log=print, wait_s: float = 300.0) -> str:
    """The tracking URI: ``$MLFLOW_TRACKING_URI`` if set, else a local server (started if not up).

    The local server outlives the sweep (so the UI stays browsable); :func:`stop_server` or
    ``make ui-stop`` stops it. Its PID and log are in the store directory.
    """
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    store, port = store_dir(), server_port()
    uri = f"http://127.0.0.1:{port}"
    if _healthy(uri):
        return uri
    store.mkdir(parents=True, exist_ok=True)
    (store / "artifacts").mkdir(exist_ok=True)
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    command = [str(mlflow_bin) if mlflow_bin.exists() else "mlflow", "server",
               "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
               "--artifacts-destination", str(store / "artifacts"),
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    log(f"[mlflow] starting a local tracking server on {uri} (store {store})")
    with open(store / "server.log", "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    (store / "server.pid").write_text(str(proc.pid))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if _healthy(uri):
            return uri
        if proc.poll() is not None:
            tail = (store / "server.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mlflow server exited with status {proc.returncode}; port {port} busy? "
                               f"(set ISOSWEEP_MLFLOW_PORT) -- last lines of {store / 'server.log'}:\n{tail}")
        time.sleep(0.5)
    raise RuntimeError(f"mlflow server did not answer {uri}/health within {wait_s:.0f} s; see {store / 'server.log'}")


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


def client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def experiment_id(mlflow_client) -> str:
    found = mlflow_client.get_experiment_by_name(EXPERIMENT)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow_client.create_experiment(EXPERIMENT)
    except Exception:  # created concurrently by another trial
        return mlflow_client.get_experiment_by_name(EXPERIMENT).experiment_id


def _find(mlflow_client, filter_string: str):
    runs = mlflow_client.search_runs([experiment_id(mlflow_client)], filter_string=filter_string,
                                     order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def find_parent(mlflow_client, sweep_id: str, prefix: bool = False):
    """The parent run of ``sweep_id`` (or of the newest sweep whose id starts with it), or None."""
    op = "LIKE" if prefix else "="
    value = f"{sweep_id}%" if prefix else sweep_id
    return _find(mlflow_client, f"tags.`{SWEEP_TAG}` {op} '{value}' and tags.`isosweep.kind` = 'sweep'")


def find_child(mlflow_client, sweep_id: str, key: str):
    """The child run of trial ``key`` in sweep ``sweep_id``, or None."""
    return _find(mlflow_client, f"tags.`{SWEEP_TAG}` = '{sweep_id}' and tags.`{TRIAL_TAG}` = '{key}'")


def flatten(data: dict, prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}`` (MLflow params are flat strings)."""
    flat: dict[str, str] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return flat


def open_parent(mlflow_client, sweep, out: Path) -> str:
    """Find or create the sweep's parent run and mark it running; returns its run id."""
    spec = sweep.spec
    tags = {"isosweep.study": spec.study, "isosweep.difficulty": sweep.trials[0].cfg.task.difficulty,
            "isosweep.out": str(out), "isosweep.metric": sweep.metric, "mlflow.note.content": spec.description}
    params = {"sweep.file": str(sweep.path), "sweep.budget": sweep.budget, "sweep.trials": len(sweep.trials),
              **flatten(spec.model_dump(mode="json"), "spec.")}
    return open_study_parent(mlflow_client, sweep.sweep_id, tags, params)


def open_study_parent(mlflow_client, sweep_id: str, tags: dict[str, str], params: dict) -> str:
    """Find the parent run tagged ``sweep_id`` or create it with ``tags`` and ``params``; mark it running."""
    found = find_parent(mlflow_client, sweep_id)
    if found is not None:
        mlflow_client.update_run(found.info.run_id, status="RUNNING")
        return found.info.run_id
    tags = {SWEEP_TAG: sweep_id, "isosweep.kind": "sweep", "mlflow.runName": sweep_id, **tags}
    run = mlflow_client.create_run(experiment_id(mlflow_client), tags=tags, run_name=sweep_id)
    _log_params(mlflow_client, run.info.run_id, params)
    return run.info.run_id


def _log_params(mlflow_client, run_id: str, params: dict) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for i in range(0, len(items), 100):
        mlflow_client.log_batch(run_id, params=items[i:i + 100])


def open_child(mlflow_client, parent_id: str, sweep_id: str, key: str, cfg, config_key: str) -> str:
    """Find or create a trial's child run (params = the full trial config); returns its run id."""
    found = find_child(mlflow_client, sweep_id, key)
    if found is not None:
        mlflow_client.update_run(found.info.run_id, status="RUNNING")
        return found.info.run_id
    tags = {"mlflow.parentRunId": parent_id, SWEEP_TAG: sweep_id, TRIAL_TAG: key, "isosweep.kind": "trial",
            "isosweep.config": config_key, "isosweep.difficulty": cfg.task.difficulty,
            "mlflow.runName": key}
    run = mlflow_client.create_run(experiment_id(mlflow_client), tags=tags, run_name=key)
    from isosweep import config as C

    params = {**flatten(cfg.model_dump(mode="json")), "derived.M": C.steps(cfg), "derived.lr": C.learning_rate(cfg),
              "derived.kl_coef": C.kl_coef(cfg), "derived.entropy_coef": C.entropy_coef(cfg)}
    _log_params(mlflow_client, run.info.run_id, params)
    return run.info.run_id


class TrialLogger:
    """Logs one trial's records and per-step statistics to its child run, exactly once each.

    ``log(record)`` is called at each evaluation (by the trial's rank-0 worker): it logs the
    eval metrics at ``step = record["rollouts"]``, the per-step statistics of ``steps.jsonl``
    since the last logged point, and, if the record beats every earlier one on ``mean@k``, the
    checkpoint written for it. ``catch_up()`` logs whatever the files hold that MLflow lacks
    (after a crash between the file write and the log call).
    """

    def __init__(self, uri: str, run_id: str, out: str | Path, k: int):
        self.client = client(uri)
        self.run_id = run_id
        self.out = Path(out)
        self.k = k
        self.metric = f"eval/mean@{k}"
        self.refresh()

    def refresh(self) -> None:
        """Read what the run already holds (another process may have logged since)."""
        history = self.client.get_metric_history(self.run_id, mlflow_name(self.metric))
        self.eval_logged = max((m.step for m in history), default=-1)
        self.best = max((m.value for m in history), default=float("-inf"))
        steps = self.client.get_metric_history(self.run_id, "train/reward")
        self.steps_logged = max((m.step for m in steps), default=0)

    def catch_up(self) -> int:
        """Log the records and steps of the trial's files that the run lacks; returns how many records."""
        from isosweep.trial import read_records

        self.refresh()
        missing = [r for r in read_records(self.out) if r["rollouts"] > self.eval_logged]
        for record in missing:
            self.log(record, checkpoint=False)
        return len(missing)

    def log(self, record: dict, checkpoint: bool = True) -> None:
        from mlflow.entities import Metric

        from isosweep.trial import read_steps

        if record["rollouts"] <= self.eval_logged:
            return
        now = int(time.time() * 1000)
        step = int(record["rollouts"])
        metrics = [Metric(mlflow_name(key), float(value), now, step) for key, value in record.items()
                   if key.startswith(EVAL_PREFIXES) and value is not None]
        metrics.append(Metric("tokens", float(record["tokens"]), now, step))
        for row in read_steps(self.out):
            if self.steps_logged < row["rollouts"] <= step:
                metrics.extend(Metric(mlflow_name(key), float(value), now, int(row["rollouts"])) for key, value in row.items()
                               if key.startswith(STEP_PREFIXES) and value is not None)
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + BATCH])
        self.steps_logged = max(self.steps_logged, step)
        self.eval_logged = step
        value = record[self.metric]
        if value > self.best:
            self.best = value
            if checkpoint:
                self._log_record_checkpoint(record)
            self.client.set_tag(self.run_id, "isosweep.best_rollouts", str(step))
            self.client.set_tag(self.run_id, f"isosweep.best_{mlflow_name(self.metric.split('/')[1])}", f"{value:.4f}")

    def _log_record_checkpoint(self, record: dict) -> None:
        from isosweep.trial import CHECKPOINTS

        folder = self.out / CHECKPOINTS / f"step-{record['step']:06d}"
        path = f"records/rollouts-{int(record['rollouts']):09d}"
        files = [folder / name for name in RECORD_FILES if (folder / name).exists()]
        if not files:
            return  # no checkpoint at this step (it was replaced before we got to it)
        for file in files:
            self.client.log_artifact(self.run_id, str(file), artifact_path=path)
        self.client.set_tag(self.run_id, "isosweep.record_checkpoint", path)
        tags = self.client.get_run(self.run_id).data.tags
        previous = tags.get("isosweep.records", "")
        self.client.set_tag(self.run_id, "isosweep.records", ",".join(filter(None, [previous, str(record["rollouts"])])))

    def finish(self, status: str, reason: str | None = None) -> None:
        if reason:
            self.client.set_tag(self.run_id, "isosweep.error", reason[:5000])
        self.client.set_terminated(self.run_id, status=status)
