"""MLflow tracking against a real local server: runs found again, metrics logged once, records as logged
models, the frontier's winners in the model registry, the experiment a training experiment."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest

from isosweep.report.schema import FrontierRow
from isosweep.spec.yamlio import ConfigError
from isosweep.track import runs, server
from isosweep.track.tags import EXPERIMENT_KIND_TAG, TRAINING_KIND
from isosweep.trial.files import TrialDir
from sweep_helpers import own_smoke, record_models

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


def test_the_zero_signal_check_is_logged_with_its_record_and_read_back_into_the_curve(mlflow_server, tmp_path):
    """The step-0 check rides on the first eval record after step 0 (``check/`` keys): it reaches MLflow with
    that record and :func:`~isosweep.track.runs.read_curves` puts it in the trial's curve; a trial of an earlier
    isosweep (no check) reads back without one."""
    uri, _ = mlflow_server
    sweep = own_smoke(tmp_path)
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, tmp_path)
    sweep_id = sweep.sweep_id + "-check-" + tmp_path.name
    check = {"check/zero_signal_observed": 0.4375, "check/zero_signal_expected": 0.398, "check/zero_signal_sd": 0.107}
    for point, first in zip(sweep.trials[:2], (check, {})):
        child = runs.open_child(client, parent, sweep_id, point.key, point.cfg, point.config_key)
        out = tmp_path / point.key
        records = [record(0, 0.50), {**record(4, 0.55), **first}, record(8, 0.53)]
        write_trial(out, records, steps_upto(8))
        logger = runs.TrialLogger(uri, child, TrialDir(out), k=4)
        for r in records:
            logger.log(r, checkpoint=False)
    curves = {c.key: c for c in runs.read_curves(client, sweep_id, 4)}
    with_check, without = (curves[p.key] for p in sweep.trials[:2])
    assert (with_check.zero_signal.observed, with_check.zero_signal.expected, with_check.zero_signal.sd) == (
        0.4375, 0.398, 0.107)
    assert without.zero_signal is None


def write_checkpoints(out: Path, records: list[dict], tag: str = "") -> None:
    """A fake checkpoint per record: weights that say which trial and step they are, a config, and trainer
    state that must not be logged."""
    for r in records:
        folder = out / "checkpoints" / f"step-{r['step']:06d}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(f"weights-{tag}{r['step']}".encode())
        (folder / "config.json").write_text("{}")
        (folder / "trainer_state.json").write_text("{}")  # not logged


def download(uri: str, model_uri: str, dst: Path) -> Path:
    """A ``models:/`` URI fetched as a user does: MLflow resolves it on the tracking URI of the environment
    (``MLFLOW_TRACKING_URI``; download_artifacts' ``tracking_uri`` argument is not used for it)."""
    import mlflow

    dst.mkdir(parents=True, exist_ok=True)
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        return Path(mlflow.artifacts.download_artifacts(model_uri, dst_path=str(dst)))
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI")
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved


def test_a_trial_whose_key_mlflow_refuses_in_a_model_name_still_gets_its_record_models(run, tmp_path):
    """A tiny-0.3m HPO trial's key holds a '.', which MLflow refuses in a logged model's name (seen: the trial's
    logger took the refusal for an outage and never caught up); the model is named with '_' instead."""
    uri, client, child = run
    client.set_tag(child, runs.TRIAL_TAG, "t002-tiny-0.3m-256")
    out = tmp_path / "trial"
    records = [record(0, 0.50), record(4, 0.55)]
    write_trial(out, records, steps_upto(4))
    write_checkpoints(out, records)
    logger = runs.TrialLogger(uri, child, TrialDir(out), k=4)
    assert logger.catch_up() == 2 and not logger.behind
    models = record_models(client, child)
    assert sorted(models) == [0, 128] and models[128].name == "t002-tiny-0_3m-256-rollouts-000000128"
    assert runs.record_model_name("a/b:c.d%e", 7) == "a_b_c_d_e-rollouts-000000007"


def test_record_breaking_checkpoints_are_logged_models_of_the_run_once_each(run, tmp_path):
    uri, client, child = run
    out = tmp_path / "trial"
    records = [record(0, 0.50), record(4, 0.55), record(8, 0.52), record(12, 0.60)]
    write_trial(out, records, steps_upto(12))
    write_checkpoints(out, records)
    logger = runs.TrialLogger(uri, child, TrialDir(out), k=4)
    for r in records:
        logger.log(r)
    models = record_models(client, child)
    assert sorted(models) == [0, 128, 384]
    best = models[384]
    assert best.status == "READY" and best.name == "n4-Bp8-rollouts-000000384" and best.source_run_id == child
    assert best.tags["isosweep.value"] == "0.6" and best.tags["isosweep.config"] == "n4-Bp8"
    assert best.tags["isosweep.metric"] == "eval/mean@4" and best.params["n"] == "4"
    local = download(uri, f"models:/{best.model_id}", tmp_path / "down")
    assert sorted(p.name for p in local.iterdir()) == ["config.json", "model.safetensors"]
    assert (local / "model.safetensors").read_bytes() == b"weights-12"
    outputs = client.get_run(child).outputs.model_outputs
    assert sorted((o.step, o.model_id) for o in outputs) == sorted((r, m.model_id) for r, m in models.items())
    tags = client.get_run(child).data.tags
    assert tags["isosweep.record_checkpoint"] == f"models:/{best.model_id}"
    assert tags["isosweep.records"] == "0,128,384" and tags["isosweep.best_rollouts"] == "384"

    # a resumed trial (a new logger, its run caught up and settled) and a repeated call log no record again
    again = runs.TrialLogger(uri, child, TrialDir(out), k=4)
    assert again.catch_up() == 0
    assert runs.log_record_model(client, child, runs.record_files(out / "checkpoints" / "step-000012"),
                                 records[3], "eval/mean@4") == best.model_id
    assert sorted(record_models(client, child)) == [0, 128, 384]
    assert len(client.get_run(child).outputs.model_outputs) == 3
    assert client.get_run(child).data.tags["isosweep.records"] == "0,128,384"


def test_a_record_cut_off_mid_upload_is_finished_not_logged_again(run, tmp_path):
    """A logged model left PENDING (the upload cut off by an outage or a crash) is found again, its files
    uploaded and it is finalized, rather than a second model made."""
    uri, client, child = run
    out = tmp_path / "trial"
    records = [record(0, 0.50)]
    write_trial(out, records, [])
    write_checkpoints(out, records)
    pending = client.create_logged_model(client.get_run(child).info.experiment_id, name="cut-off", source_run_id=child,
                                         tags={"isosweep.rollouts": "0", "isosweep.kind": "record"})
    assert runs.log_record_model(client, child, runs.record_files(out / "checkpoints" / "step-000000"), records[0],
                                 "eval/mean@4") == pending.model_id
    assert client.get_logged_model(pending.model_id).status == "READY"
    assert [o.model_id for o in client.get_run(child).outputs.model_outputs] == [pending.model_id]
    local = download(uri, f"models:/{pending.model_id}", tmp_path / "down")
    assert (local / "model.safetensors").read_bytes() == b"weights-0"


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


@pytest.mark.parametrize("shard", [None, "300KB"], ids=["one-file", "sharded"])
def test_a_record_checkpoint_is_a_logged_model_that_loads_with_from_pretrained(run, tmp_path, base_model, shard):
    """The record's logged model, downloaded by its ``models:/`` URI, loads with from_pretrained to the same
    weights; a large model is saved in shards by save_pretrained, and every shard and the index go to MLflow
    (forced here with a small shard size); optimizer state does not."""
    import torch
    from transformers import AutoModelForCausalLM

    uri, client, child = run
    out = tmp_path / "trial"
    records = [record(0, 0.50)]
    write_trial(out, records, [])
    model = AutoModelForCausalLM.from_pretrained(base_model)
    folder = out / "checkpoints" / "step-000000"
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    (folder / "optimizer_state.pt").write_bytes(b"not logged")
    shards = sorted(p.name for p in folder.glob("model-*-of-*.safetensors"))
    assert (len(shards) > 1 and (folder / "model.safetensors.index.json").exists()) if shard else not shards
    runs.TrialLogger(uri, child, TrialDir(out), k=4).log(records[0])
    model_uri = client.get_run(child).data.tags["isosweep.record_checkpoint"]
    assert model_uri == f"models:/{record_models(client, child)[0].model_id}"
    local = download(uri, model_uri, tmp_path / "down")
    logged = {p.name for p in local.iterdir()}
    assert {"config.json", *(shards + ["model.safetensors.index.json"] if shard else ["model.safetensors"])} <= logged
    assert "optimizer_state.pt" not in logged
    again = AutoModelForCausalLM.from_pretrained(local, use_safetensors=True)
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_experiment_is_a_training_experiment(mlflow_server, tmp_path, monkeypatch):
    """Created with MLflow's training kind; an existing one without a kind or marked GenAI is marked training;
    another training kind someone chose is left. The UI's address asks for the runs table."""
    uri, _ = mlflow_server
    client = runs.client(uri)
    monkeypatch.setattr(runs, "EXPERIMENT", f"kind-{tmp_path.name}")
    created = runs.experiment_id(client)
    assert client.get_experiment(created).tags[EXPERIMENT_KIND_TAG] == TRAINING_KIND == "custom_model_development"
    for before in (None, "genai_development", "finetuning"):
        if before is None:
            client.delete_experiment_tag(created, EXPERIMENT_KIND_TAG)
        else:
            client.set_experiment_tag(created, EXPERIMENT_KIND_TAG, before)
        assert runs.experiment_id(client) == created
        after = client.get_experiment(created).tags.get(EXPERIMENT_KIND_TAG)
        assert after == (before if before == "finetuning" else TRAINING_KIND), before
    assert runs.experiment_url(uri, client) == f"{uri}/#/experiments/{created}/runs?workflowType=machine_learning"
    monkeypatch.undo()
    session = runs.experiment_id(client)  # the session's own experiment, made by whichever test came first
    assert client.get_experiment(session).tags[EXPERIMENT_KIND_TAG] == TRAINING_KIND


def test_the_frontier_checkpoint_is_the_winning_configs_best_record_by_c():
    seeds = {("a", "a-s0"): ((0, .5), (128, .6), (384, .7)), ("a", "a-s1"): ((0, .5), (256, .65), (512, .8)),
             ("b", "b-s0"): ((64, .9),)}
    records = [{"config": config, "trial": trial, "rollouts": r, "value": v}
               for (config, trial), points in seeds.items() for r, v in points]
    pick = runs.frontier_checkpoint
    assert (pick(records, "a", 100)["trial"], pick(records, "a", 100)["rollouts"]) == ("a-s0", 0)  # the first of equals
    assert (pick(records, "a", 300)["trial"], pick(records, "a", 300)["rollouts"]) == ("a-s1", 256)  # any seed
    assert (pick(records, "a", 384)["trial"], pick(records, "a", 384)["rollouts"]) == ("a-s0", 384)  # at C counts
    assert pick(records, "a", 10_000)["value"] == .8 and pick(records, "b", 64)["value"] == .9  # only the winner's
    assert pick(records, "b", 63) is None and pick(records, "c", 1e9) is None


def frontier_row(C: float, config: str | None, value: float, **extra) -> FrontierRow:
    return FrontierRow(**{"C": C, "config": config, "value": value, "p_best": 0.9, **extra})


def test_the_frontier_winners_are_registered_once_per_sweep_with_their_tags(mlflow_server, tmp_path):
    """Two configs' trials log their records; the frontier's winner at each C gets its best record at or below
    C as a tagged, aliased version of the sweep's registered model; a second registration adds nothing."""
    uri, _ = mlflow_server
    client = runs.client(uri)
    sweep = own_smoke(tmp_path)
    parent = runs.open_parent(client, sweep, tmp_path)
    values = {"n4-Bp8": [0.50, 0.55, 0.53, 0.60], "n8-Bp8": [0.50, 0.58, 0.62, 0.61]}  # at rollouts 0, 128, 256, 384
    trial_runs = {}
    for point in sweep.trials:
        per_step = point.cfg.n * point.cfg.Bp
        records = [record(i * 128 // per_step, v, per_step) for i, v in enumerate(values[point.key])]
        out = tmp_path / point.key
        write_trial(out, records, [])
        write_checkpoints(out, records, tag=f"{point.key}-")
        trial_runs[point.key] = runs.open_child(client, parent, sweep.sweep_id, point.key, point.cfg, point.config_key)
        logger = runs.TrialLogger(uri, trial_runs[point.key], TrialDir(out), k=4)
        for r in records:
            logger.log(r)
    analysis = SimpleNamespace(primary="mean@4", metrics={"mean@4": SimpleNamespace(rows=[
        frontier_row(64, None, float("nan")), frontier_row(100, "n4-Bp8", 0.51),
        frontier_row(128, "n8-Bp8", 0.57), frontier_row(256, "n8-Bp8", 0.61),
        frontier_row(384, "n4-Bp8", 0.605, tie=True, runner_up="n8-Bp8", p_best=0.55)])})
    name = runs.registered_model_name(sweep.sweep_id)
    assert name == f"isosweep-{sweep.sweep_id}"

    first = runs.register_frontier(client, sweep.sweep_id, analysis)
    expected = [(100, "n4-Bp8", 0), (128, "n8-Bp8", 128), (256, "n8-Bp8", 256), (384, "n4-Bp8", 384)]
    assert [(r["C"], r["config"], r["rollouts"]) for r in first] == expected and all(r["new"] for r in first)
    assert [r["aliases"] for r in first] == [["c100"], ["c128"], ["c256"], ["c384", "budget"]]
    assert len(client.search_registered_models(f"name = '{name}'")) == 1
    versions = {v.tags["isosweep.C"]: v for v in client.search_model_versions(f"name = '{name}'")}
    assert sorted(versions, key=int) == ["100", "128", "256", "384"]
    top = versions["384"]
    assert top.tags["isosweep.config"] == "n4-Bp8" and top.tags["isosweep.metric"] == "eval/mean@4"
    assert top.tags["isosweep.value"] == "0.6050" and top.tags["isosweep.record_value"] == "0.6000"
    assert top.tags["isosweep.p_best"] == "0.55" and top.tags["isosweep.tie"] == "n8-Bp8"
    assert top.tags["isosweep.trial"] == "n4-Bp8" and top.tags["isosweep.rollouts"] == "384"
    assert versions["256"].tags["isosweep.record_value"] == "0.6200" and "isosweep.tie" not in versions["256"].tags
    assert client.get_model_version_by_alias(name, "budget").version == top.version
    best = record_models(client, trial_runs["n4-Bp8"])[384]  # the record checkpoint itself
    assert first[-1]["model_id"] == best.model_id and top.source == f"models:/{best.model_id}"
    assert top.run_id == trial_runs["n4-Bp8"]
    linked = json.loads(client.get_logged_model(best.model_id).tags["mlflow.modelVersions"])  # the server links them
    assert [(v["name"], str(v["version"])) for v in linked] == [(name, top.version)]

    # the best model at C is one call away, and it is the checkpoint that was logged
    assert (download(uri, f"models:/{name}@budget", tmp_path / "budget") / "model.safetensors").read_bytes() \
        == b"weights-n4-Bp8-12"
    assert (download(uri, f"models:/{name}@c128", tmp_path / "c128") / "model.safetensors").read_bytes() \
        == b"weights-n8-Bp8-2"

    again = runs.register_frontier(client, sweep.sweep_id, analysis)  # `isosweep frontier`, `make report`
    assert [(r["version"], r["new"]) for r in again] == [(r["version"], False) for r in first]
    assert len(client.search_model_versions(f"name = '{name}'")) == 4
    assert json.loads(client.get_logged_model(best.model_id).tags["mlflow.modelVersions"]) == linked


def test_a_sweep_without_record_models_registers_nothing(mlflow_server, tmp_path):
    """A sweep logged before records were models (or whose checkpoints were gone) has nothing to register: no
    empty registered model is made."""
    uri, _ = mlflow_server
    client = runs.client(uri)
    sweep = own_smoke(tmp_path)
    runs.open_parent(client, sweep, tmp_path)
    rows = [frontier_row(128, "n4-Bp8", .5)]
    analysis = SimpleNamespace(primary="mean@4", metrics={"mean@4": SimpleNamespace(rows=rows)})
    assert runs.register_frontier(client, sweep.sweep_id, analysis) == []
    name = runs.registered_model_name(sweep.sweep_id)
    assert client.search_registered_models(f"name = '{name}'") == []


def test_more_metrics_than_one_request_holds_are_logged_whole(mlflow_server):
    """2,500 step metrics in one log_metrics call: MLflow's client splits them into requests of 1,000."""
    from mlflow.entities import Metric

    uri, _ = mlflow_server
    client = runs.client(uri)
    run = client.create_run(runs.experiment_id(client), run_name="many-metrics")
    runs.log_metrics(client, run.info.run_id, [Metric("train/reward", i / 2500, 0, i) for i in range(2500)])
    history = client.get_metric_history(run.info.run_id, "train/reward")
    assert sorted(m.step for m in history) == list(range(2500))
    client.delete_run(run.info.run_id)


def test_a_child_run_left_without_its_params_gets_them_when_the_trial_resumes(mlflow_server, tmp_path):
    """A crash between creating a trial's run and logging its params leaves a run with tags only: the
    resumed trial finds it (no second run) and logs the params it lacks."""
    uri, _ = mlflow_server
    sweep = own_smoke(tmp_path)
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, tmp_path)
    point = sweep.trials[0]
    bare = client.create_run(runs.experiment_id(client), run_name=point.key, tags={
        "mlflow.parentRunId": parent, runs.SWEEP_TAG: sweep.sweep_id, runs.TRIAL_TAG: point.key,
        "isosweep.kind": "trial", "isosweep.config": point.config_key})
    assert client.get_run(bare.info.run_id).data.params == {}
    assert runs.open_child(client, parent, sweep.sweep_id, point.key, point.cfg, point.config_key) == bare.info.run_id
    params = client.get_run(bare.info.run_id).data.params
    assert params["Bp"] == str(point.cfg.Bp) and params["derived.M"] == "62" and len(params) > 40
    assert runs.open_child(client, parent, sweep.sweep_id, point.key, point.cfg, point.config_key) == bare.info.run_id


def test_a_finished_trial_whose_run_lost_its_params_is_settled_with_them(mlflow_server, tmp_path):
    """MLflow failed after creating a trial's run and before its params (the trial then trained on its files
    alone), and the run was caught up and marked FINISHED without them: settling the finished trial gives the run
    its params, so the frontier can read it (it failed with KeyError 'n' before)."""
    uri, _ = mlflow_server
    sweep = own_smoke(tmp_path)
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, tmp_path)
    point = sweep.trials[0]
    bare = client.create_run(runs.experiment_id(client), run_name=point.key, tags={
        "mlflow.parentRunId": parent, runs.SWEEP_TAG: sweep.sweep_id, runs.TRIAL_TAG: point.key,
        "isosweep.kind": "trial", "isosweep.config": point.config_key})
    client.set_terminated(bare.info.run_id, status="FINISHED")
    write_trial(tmp_path / "trial", [record(0, 0.50), record(4, 0.55)], steps_upto(4))
    trial = TrialDir(tmp_path / "trial")
    runs.settle_finished(client, uri, parent, sweep.sweep_id, point.key, point.cfg, point.config_key, trial,
                         log=lambda line: None)
    run = client.get_run(bare.info.run_id)
    assert run.info.status == "FINISHED" and set(runs.trial_params(point.cfg)) <= set(run.data.params)
    assert run.data.params["n"] == str(point.cfg.n)
