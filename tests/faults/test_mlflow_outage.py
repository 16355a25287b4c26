"""MLflow going away mid-trial: training goes on, the files keep everything, and MLflow is caught up
(eval points, per-step metrics, counts, the best record's checkpoint and tags) once it answers again.

The outage is real at the socket level: the trial logger talks to the session's MLflow server through a
TCP forwarder, and "down" closes the forwarder (connections refused), "back" opens it again.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from isosweep.run.core import is_finished
from isosweep.track import runs
from isosweep.trial.files import TrialDir
from sweep_helpers import ISOSWEEP, Forwarder, children, own_smoke, record_models, wait_for

ROOT = Path(__file__).resolve().parents[2]


def record(step: int, value: float) -> dict:
    return {"step": step, "rollouts": step * 32, "tokens": step * 100, "eval/mean@4": value, "eval/best@4": value + 0.2,
            "eval/worst@4": value - 0.2, "eval_correct": [step % 3, 2, 1, 0], "eval_samples": 4, "eval_set": "s"}


def write(out: Path, records: list[dict]) -> None:
    last = records[-1]["step"]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "steps.jsonl").write_text("".join(json.dumps({"step": s, "rollouts": 32 * s, "train/reward": 0.1 * s}) + "\n"
                                             for s in range(1, last + 1)))
    for r in records:
        folder = out / "checkpoints" / f"step-{r['step']:06d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.safetensors").write_bytes(b"weights-%d" % r["step"])


def trial_run(mlflow_server, tmp_path: Path, monkeypatch) -> tuple:
    """A trial's child run on the session's server, a forwarder to that server, and the trial's folder;
    MLflow's client set to fail at once instead of retrying for minutes."""
    uri, _ = mlflow_server
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    client = runs.client(uri)
    sweep = own_smoke(tmp_path)
    parent = runs.open_parent(client, sweep, tmp_path)
    point = sweep.trials[0]
    child = runs.open_child(client, parent, sweep.sweep_id, point.key, point.cfg, point.config_key)
    proxy = Forwarder(("127.0.0.1", int(uri.rsplit(":", 1)[1])))
    out = tmp_path / "trial"
    out.mkdir()
    return client, child, proxy, out


def test_a_trial_outlives_an_mlflow_outage_and_mlflow_is_caught_up_after(mlflow_server, tmp_path, monkeypatch):
    client, child, proxy, out = trial_run(mlflow_server, tmp_path, monkeypatch)
    records = [record(0, 0.50), record(4, 0.55), record(8, 0.60), record(12, 0.58)]
    lines: list[str] = []
    logger = runs.TrialLogger(f"http://127.0.0.1:{proxy.port}", child, TrialDir(out), k=4, warn=lines.append)

    write(out, records[:2])
    for r in records[:2]:
        logger.log(r)
    proxy.down()  # MLflow gone: the trial's next evaluations are only on disk
    write(out, records[:3])
    logger.log(records[2])  # the best record, and its checkpoint, missed by MLflow
    assert logger.behind and len(lines) == 1 and "did not answer" in lines[0] and str(out) in lines[0]
    logger.finish("FINISHED")  # nothing raises; the run is left as it was
    assert client.get_run(child).info.status == "RUNNING"
    assert sorted(m.step for m in client.get_metric_history(child, "eval/mean_at_4")) == [0, 128]

    proxy.up()
    write(out, records)
    logger.log(records[3])  # MLflow back: everything the files hold since the outage goes in
    assert not logger.behind and "answers again" in lines[-1]
    assert sorted(m.step for m in client.get_metric_history(child, "eval/mean_at_4")) == [0, 128, 256, 384]
    assert sorted(m.step for m in client.get_metric_history(child, "train/reward")) == [32 * s for s in range(1, 13)]
    tags = client.get_run(child).data.tags
    assert tags["isosweep.best_rollouts"] == "256" and tags["isosweep.best_mean_at_4"] == "0.6000"
    assert record_models(client, child)[256].status == "READY"  # the record MLflow missed, logged as a model
    counts = json.loads(Path(client.download_artifacts(child, "eval_counts.json", str(tmp_path))).read_text())
    assert counts["rollouts"] == [0, 128, 256, 384]
    logger.finish("FINISHED")
    assert client.get_run(child).info.status == "FINISHED"
    proxy.down()


def test_a_logger_started_while_mlflow_is_down_catches_up_later(mlflow_server, tmp_path, monkeypatch):
    client, child, proxy, out = trial_run(mlflow_server, tmp_path, monkeypatch)
    proxy.down()
    records = [record(0, 0.50), record(4, 0.55)]
    write(out, records)
    logger = runs.TrialLogger(f"http://127.0.0.1:{proxy.port}", child, TrialDir(out), k=4, warn=lambda line: None)
    logger.log(records[0])
    assert logger.behind
    proxy.up()
    logger.log(records[1])
    assert sorted(m.step for m in client.get_metric_history(child, "eval/mean_at_4")) == [0, 128]
    proxy.down()


@pytest.mark.slow
def test_trials_that_start_while_mlflow_is_down_train_and_get_their_runs_when_it_answers(mlflow_server, tmp_path):
    """A smoke sweep whose MLflow goes away right after its parent run is made: both trials start without a child
    run and train on their files alone (their logs say so); MLflow back before the study ends, the driver creates
    their runs and catches them up, so the sweep finishes in one invocation with MLflow equal to the files."""
    uri, _ = mlflow_server
    client = runs.client(uri)
    # another budget than the smoke sweep's: a finished sweep of the same design would be pooled with the real
    # smoke sweep by `make report` in the end-to-end test that shares this session's server
    sweep = own_smoke(tmp_path, budget=1024)
    proxy = Forwarder(("127.0.0.1", int(uri.rsplit(":", 1)[1])))
    runs_dir = tmp_path / "runs"
    trials = {p.key: TrialDir(runs_dir / sweep.sweep_id / "trials" / p.key) for p in sweep.trials}
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{proxy.port}",
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}  # refused at once, not after minutes of retries
    log = open(tmp_path / "driver.log", "w")
    driver = subprocess.Popen([ISOSWEEP, "sweep", str(sweep.path), "--budget", "1024", "--runs", str(runs_dir),
                               "--no-dashboards"],
                              cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # the driver's last MLflow call before the trials is done when it names the parent run (then it starts Ray)
        wait_for(lambda: "[sweep] MLflow: " in (tmp_path / "driver.log").read_text() or driver.poll() is not None, 300,
                 "the driver's parent run", every=0.1)
        proxy.down()  # before Ray is up: no trial has opened its run
        wait_for(lambda: any(is_finished(t, p.cfg) for t, p in zip(trials.values(), sweep.trials))
                 or driver.poll() is not None, 600, "a trial trained without MLflow", every=0.2)
        proxy.up()
        assert driver.wait(timeout=600) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        proxy.down()
    for key, trial in trials.items():
        assert "did not answer when the trial started" in trial.log_file.read_text(), key
    found = {r.data.tags[runs.TRIAL_TAG]: r for r in children(client, sweep.sweep_id)}
    assert sorted(found) == sorted(trials)
    for key, trial in trials.items():
        run = found[key]
        assert run.info.status == "FINISHED" and run.data.params["n"] in ("4", "8")
        evals = client.get_metric_history(run.info.run_id, "eval/mean_at_4")
        assert sorted((m.step, m.value) for m in evals) == [(r["rollouts"], r["eval/mean@4"]) for r in trial.records()]
        rewards = client.get_metric_history(run.info.run_id, "train/reward")
        assert sorted((m.step, m.value) for m in rewards) == [(r["rollouts"], r["train/reward"]) for r in trial.steps()]
    assert runs.find_parent(client, sweep.sweep_id).info.status == "FINISHED"
