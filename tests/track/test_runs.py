"""MLflow tracking against a real local server: runs found again, metrics logged once, records as artifacts."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from isosweep.spec.yamlio import ConfigError
from isosweep.track import runs, server
from isosweep.trial.files import TrialDir
from sweep_helpers import own_smoke

ROOT = Path(__file__).resolve().parents[2]


def write_trial(out: Path, records: list[dict], steps: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))


def record(step: int, value: float, per_step: int = 32) -> dict:
    return {"step": step, "rollouts": step * per_step, "tokens": step * 100, "eval/mean@4": value,
            "eval/best@4": value + 0.2, "eval/worst@4": value - 0.2, "eval/stderr_mean@4": 0.02,
            "system/wall_s": float(step), "system/trainer_flops": 6.0 * step, "time/eval_s": 0.5,
            "train/reward": None if step == 0 else 0.4}


def steps_upto(last: int, per_step: int = 32) -> list[dict]:
    return [{"step": s, "rollouts": s * per_step, "train/reward": 0.1 * s, "train/kl": 0.01, "rollout/length": 4.0,
             "time/generate_s": 0.05, "mismatch/mean_abs": 0.005, "ais/alpha": 0.3} for s in range(1, last + 1)]


@pytest.fixture
def run(mlflow_server, tmp_path):
    uri, _ = mlflow_server
    sweep = own_smoke(tmp_path)
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, tmp_path)
    point = sweep.trials[0]
    child = runs.open_child(client, parent, sweep.sweep_id + tmp_path.name, point.key, point.cfg, point.config_key)
    return uri, client, child


def test_parent_and_child_runs_are_found_again_not_duplicated(mlflow_server, tmp_path):
    uri, _ = mlflow_server
    sweep = own_smoke(tmp_path, budget=2048)
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, tmp_path)
    assert runs.open_parent(client, sweep, tmp_path) == parent
    point = sweep.trials[1]
    child = runs.open_child(client, parent, sweep.sweep_id, point.key, point.cfg, point.config_key)
    assert runs.open_child(client, parent, sweep.sweep_id, point.key, point.cfg, point.config_key) == child
    run = client.get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == parent
    params = run.data.params
    assert params["n"] == str(point.cfg.n) and params["Bp"] == str(point.cfg.Bp)
    assert params["rollout.engine"] == point.cfg.rollout.engine and params["algorithm.lr_ref"] == str(point.cfg.algorithm.lr_ref)
    assert params["derived.M"] == str(2048 // (point.cfg.n * point.cfg.Bp))
    assert runs.find_parent(client, sweep.sweep_id[:8], prefix=True).info.run_id == parent


def test_each_point_is_logged_once_at_step_rollouts(run, tmp_path):
    uri, client, child = run
    out = tmp_path / "trial"
    records = [record(0, 0.50), record(4, 0.55), record(8, 0.53)]
    write_trial(out, records, steps_upto(8))
    logger = runs.TrialLogger(uri, child, TrialDir(out), k=4)
    for r in records:
        logger.log(r)
        logger.log(r)  # a repeat (a retried report) changes nothing
    history = client.get_metric_history(child, "eval/mean_at_4")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == [(0, 0.50), (128, 0.55), (256, 0.53)]
    reward = client.get_metric_history(child, "train/reward")
    assert sorted(m.step for m in reward) == [32 * s for s in range(1, 9)]
    assert [m.value for m in sorted(reward, key=lambda m: m.step)] == pytest.approx([0.1 * s for s in range(1, 9)])
    assert len(client.get_metric_history(child, "ais/alpha")) == 8
    assert len(client.get_metric_history(child, "system/wall_s")) == 3


def test_a_new_logger_catches_up_only_what_mlflow_lacks(run, tmp_path):
    uri, client, child = run
    out = tmp_path / "trial"
    records = [record(0, 0.50), record(4, 0.55), record(8, 0.60), record(12, 0.58)]
    write_trial(out, records[:2], steps_upto(4))
    first = runs.TrialLogger(uri, child, TrialDir(out), k=4)
    for r in records[:2]:
        first.log(r)
    write_trial(out, records, steps_upto(12))  # the trial went on; its driver died before logging
    again = runs.TrialLogger(uri, child, TrialDir(out), k=4)
    assert again.catch_up() == 2
    assert first.catch_up() == 0  # a logger created earlier sees what the other one logged
    assert runs.TrialLogger(uri, child, TrialDir(out), k=4).catch_up() == 0
    steps = sorted(m.step for m in client.get_metric_history(child, "eval/mean_at_4"))
    assert steps == [0, 128, 256, 384]
    assert sorted(m.step for m in client.get_metric_history(child, "train/reward")) == [32 * s for s in range(1, 13)]


def test_record_breaking_checkpoints_are_logged_and_tagged(run, tmp_path):
    uri, client, child = run
    out = tmp_path / "trial"
    records = [record(0, 0.50), record(4, 0.55), record(8, 0.52), record(12, 0.60)]
    write_trial(out, records, steps_upto(12))
    for r in records:
        folder = out / "checkpoints" / f"step-{r['step']:06d}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights-%d" % r["step"])
        (folder / "config.json").write_text("{}")
        (folder / "trainer_state.json").write_text("{}")  # not logged
    logger = runs.TrialLogger(uri, child, TrialDir(out), k=4)
    for r in records:
        logger.log(r)
    logged = {a.path for a in client.list_artifacts(child, "records")}
    assert logged == {"records/rollouts-000000000", "records/rollouts-000000128", "records/rollouts-000000384"}
    files = {a.path.rsplit("/", 1)[1] for a in client.list_artifacts(child, "records/rollouts-000000384")}
    assert files == {"model.safetensors", "config.json"}
    tags = client.get_run(child).data.tags
    assert tags["isosweep.record_checkpoint"] == "records/rollouts-000000384"
    assert tags["isosweep.records"] == "0,128,384" and tags["isosweep.best_rollouts"] == "384"
    local = client.download_artifacts(child, "records/rollouts-000000384/model.safetensors", str(tmp_path))
    assert Path(local).read_bytes() == b"weights-12"


def test_names_mlflow_accepts():
    assert runs.mlflow_name("eval/mean@4") == "eval/mean_at_4"
    assert runs.flatten({"a": {"b": 1, "c": [2, 3]}, "d": "x"}) == {"a.b": "1", "a.c": "[2, 3]", "d": "x"}


def test_a_running_server_is_reused(mlflow_server):
    uri, _ = mlflow_server
    pid = (server.store_dir() / "server.pid").read_text()
    assert server.ensure_server(log=lambda line: None) == uri
    assert (server.store_dir() / "server.pid").read_text() == pid


def test_a_bad_port_or_a_server_that_is_not_ours_is_a_clear_error(mlflow_server, tmp_path, monkeypatch):
    uri, env = mlflow_server
    monkeypatch.setenv("ISOSWEEP_MLFLOW_PORT", "abc")
    with pytest.raises(ConfigError, match=r"ISOSWEEP_MLFLOW_PORT='abc': not a port; allowed: a whole number"):
        server.ensure_server(log=lambda line: None)
    # the session's server answers on its port, but another store did not start it: not reused
    monkeypatch.setenv("ISOSWEEP_MLFLOW_PORT", env["ISOSWEEP_MLFLOW_PORT"])
    monkeypatch.setenv("ISOSWEEP_MLFLOW_DIR", str(tmp_path / "other-store"))
    with pytest.raises(ConfigError, match=rf"{uri} answers as an MLflow server, but not one isosweep started"):
        server.ensure_server(log=lambda line: None)
    assert not (tmp_path / "other-store").exists()


def test_a_local_server_that_is_only_slow_is_waited_for_not_replaced(mlflow_server):
    """A busy machine: our server's process is alive but does not answer (here: stopped with SIGSTOP). The
    driver must not start a second server (it could not bind the port, and its PID would replace ours)."""
    uri, _ = mlflow_server
    pid_file = server.store_dir() / "server.pid"
    pid = int(pid_file.read_text())
    os.killpg(pid, signal.SIGSTOP)
    try:
        lines = []
        assert not server.revive(uri, log=lines.append) and lines == []
        with pytest.raises(RuntimeError, match="is running but did not answer /health within 3 s"):
            server.ensure_server(log=lines.append, wait_s=3)
        assert "slow to answer: waiting for it" in lines[0]
        assert int(pid_file.read_text()) == pid
    finally:
        os.killpg(pid, signal.SIGCONT)
    assert server.ensure_server(log=lambda _: None) == uri and int(pid_file.read_text()) == pid


def test_a_local_server_that_stopped_is_restarted_with_its_data(mlflow_server, tmp_path):
    uri, _ = mlflow_server
    before = runs.experiment_id(runs.client(uri))
    assert not server.revive(uri)  # answering: left alone
    assert server.stop_server()
    lines = []
    assert server.revive(uri, log=lines.append)
    assert "stopped answering: restarting it" in lines[0]
    assert runs.experiment_id(runs.client(uri)) == before  # the same store


def test_a_sharded_record_checkpoint_is_logged_whole_and_loads_back(run, tmp_path, base_model):
    """A large model is saved in shards by save_pretrained: every shard and the index go to MLflow, and the
    downloaded record loads with from_pretrained to the same weights (forced here with a small shard size)."""
    import torch
    from transformers import AutoModelForCausalLM

    uri, client, child = run
    out = tmp_path / "trial"
    records = [record(0, 0.50)]
    write_trial(out, records, [])
    model = AutoModelForCausalLM.from_pretrained(base_model)
    folder = out / "checkpoints" / "step-000000"
    model.save_pretrained(folder, max_shard_size="300KB")
    (folder / "optimizer_state.pt").write_bytes(b"not logged")
    shards = sorted(p.name for p in folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").exists()
    runs.TrialLogger(uri, child, TrialDir(out), k=4).log(records[0])
    logged = {a.path.rsplit("/", 1)[1] for a in client.list_artifacts(child, "records/rollouts-000000000")}
    assert set(shards) | {"model.safetensors.index.json", "config.json"} <= logged
    assert "optimizer_state.pt" not in logged
    local = client.download_artifacts(child, "records/rollouts-000000000", str(tmp_path / "down"))
    again = AutoModelForCausalLM.from_pretrained(local, use_safetensors=True)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
