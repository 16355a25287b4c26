"""A trial process killed (SIGKILL) at each fixed point between the writes of an evaluation, then run again:
its records and steps equal an uninterrupted run's (to 1e-9: the trial is deterministic), and its MLflow run
holds exactly what the files hold, each point once.

The kill comes from the test hook ``ISOSWEEP_KILL_AT=<point>:<n>`` (:data:`isosweep.trial.files.KILL_AT`),
at the evaluation at step 4 of a short trial (evaluations at 0, 4, 8), so no timing is involved. The trial
runs as a sweep's trial does, without Ray: a logger that first catches its run up from the files, the
training loop reporting each record to it, and a final catch-up.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from isosweep.spec.trial import load_trial
from isosweep.track import runs
from isosweep.trial.files import KILL_AT, KILL_ONCE, KILL_POINTS, TrialDir
from isosweep.trial.loop import train_loop
from sweep_helpers import own_smoke

ROOT = Path(__file__).resolve().parents[2]
EASY = ROOT / "sweeps" / "trials" / "easy.yaml"
SHORT = ["budget=256", "Bp=8", "n=4", "eval.every=4", "task.eval_problems=32", "rollout.engine=hf"]

CHILD = """
import sys
import time
from isosweep.spec.trial import load_trial
from isosweep.track import runs
from isosweep.trial.files import TrialDir
from isosweep.trial.loop import train_loop

uri, run_id, out, config, *sets = sys.argv[1:]
cfg = load_trial(config, sets)
logger = runs.TrialLogger(uri, run_id, TrialDir(out), cfg.eval.k)
logger.catch_up()  # as a sweep's trial starts: MLflow caught up from the files
train_loop(cfg, out, log=lambda _: None, report=logger.log)
logger.catch_up()
"""


@pytest.fixture(scope="module")
def reference(base_model, tmp_path_factory) -> TrialDir:
    out = tmp_path_factory.mktemp("uninterrupted") / "trial"
    train_loop(load_trial(EASY, SHORT), out, log=lambda _: None)
    return TrialDir(out)


def run_child(uri: str, run_id: str, out: Path, kill_at: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()  # not this process's torch.distributed world (the reference's)
           if k not in (KILL_AT, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(ROOT / "platform")
    if kill_at:
        env[KILL_AT] = kill_at
    return subprocess.run([sys.executable, "-c", CHILD, uri, run_id, str(out), str(EASY), *SHORT], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_trial_killed_at_a_fixed_point_resumes_to_the_same_files_and_mlflow_holds_them_once(
        point, reference, mlflow_server, tmp_path):
    uri, _ = mlflow_server
    sweep = own_smoke(tmp_path)
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, tmp_path)
    point_cfg = sweep.trials[0]
    run_id = runs.open_child(client, parent, sweep.sweep_id, point_cfg.key, point_cfg.cfg, point_cfg.config_key)
    out = tmp_path / "trial"

    killed = run_child(uri, run_id, out, f"{point}:2")  # the second evaluation's (step 4)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [r["step"] for r in TrialDir(out).records()] == ([0, 4] if point == "record-appended" else [0])
    done = run_child(uri, run_id, out, None)
    assert done.returncode == 0, done.stderr[-3000:]

    want, got = reference.records(), TrialDir(out).records()
    assert [r["step"] for r in got] == [0, 4, 8] and [r["rollouts"] for r in got] == [0, 128, 256]
    for a, b in zip(want, got):
        assert math.isclose(a["eval/mean@4"], b["eval/mean@4"], abs_tol=1e-9)
    steps = TrialDir(out).steps()
    assert [r["step"] for r in steps] == [r["step"] for r in reference.steps()]
    # MLflow holds what the files hold, each point once
    evals = client.get_metric_history(run_id, "eval/mean_at_4")
    assert sorted((m.step, m.value) for m in evals) == [(r["rollouts"], r["eval/mean@4"]) for r in got]
    rewards = client.get_metric_history(run_id, "train/reward")
    assert sorted((m.step, m.value) for m in rewards) == [(r["rollouts"], r["train/reward"]) for r in steps]


def test_an_unknown_kill_point_is_refused(monkeypatch):
    from isosweep.trial.files import kill_point

    monkeypatch.setenv(KILL_AT, "nowhere:2")
    with pytest.raises(ValueError, match="no such kill point; allowed: checkpoint-written"):
        kill_point("checkpoint-written")


@pytest.mark.slow
def test_a_train_worker_killed_while_its_driver_lives_is_restarted_and_the_trial_finishes_in_the_same_run(
        reference, mlflow_server, tmp_path, monkeypatch):
    """The Ray Train worker running the loop dies (SIGKILL at the second evaluation's committed checkpoint, once:
    ``ISOSWEEP_KILL_ONCE``); its Train job restarts the worker group in the same ``fit()``, the new worker resumes
    from that checkpoint, and the trial ends with the uninterrupted run's records, MLflow holding each point once."""
    import ray

    from isosweep.trial.job import lone_trial_threads, make_torch_trainer, ray_init

    uri, _ = mlflow_server
    sweep = own_smoke(tmp_path)
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, tmp_path)
    point_cfg = sweep.trials[0]
    run_id = runs.open_child(client, parent, sweep.sweep_id, point_cfg.key, point_cfg.cfg, point_cfg.config_key)
    out = tmp_path / "trial"
    marker = tmp_path / "killed-once"
    # the Ray this test starts passes its environment to every worker it starts
    monkeypatch.setenv(KILL_AT, "checkpoint-committed:2")
    monkeypatch.setenv(KILL_ONCE, str(marker))
    cfg = load_trial(EASY, SHORT)
    assert ray_init(log_to_driver=False)
    try:
        threads = lone_trial_threads(cfg, ray.cluster_resources().get("CPU", 1.0))
        make_torch_trainer(cfg, out, tracker=runs.MlflowTracker(uri, run_id), threads=threads).fit()
    finally:
        ray.shutdown()
    assert marker.exists()  # the kill happened, once
    log = (out / "trial.log").read_text()
    assert log.count("[trial] arithmetic/easy") == 2 and "resuming at step 4" in log  # a second worker, resumed

    want, got = reference.records(), TrialDir(out).records()
    assert [r["step"] for r in got] == [0, 4, 8]
    for a, b in zip(want, got):
        assert math.isclose(a["eval/mean@4"], b["eval/mean@4"], abs_tol=1e-9)
    steps = TrialDir(out).steps()
    assert [r["step"] for r in steps] == [r["step"] for r in reference.steps()]
    evals = client.get_metric_history(run_id, "eval/mean_at_4")
    assert sorted((m.step, m.value) for m in evals) == [(r["rollouts"], r["eval/mean@4"]) for r in got]
    rewards = client.get_metric_history(run_id, "train/reward")
    assert sorted((m.step, m.value) for m in rewards) == [(r["rollouts"], r["train/reward"]) for r in steps]


@pytest.mark.slow
def test_a_rollout_actor_killed_while_its_trial_runs_is_replaced_and_the_trial_finishes_in_the_same_run(
        base_model, mlflow_server, tmp_path):
    """The vLLM rollout actor of a running trial is killed (SIGKILL, once the step-4 evaluation is written): the
    rank-0 worker's next rollout fails, Ray Train restarts the worker group, which starts a new actor and resumes
    from the latest checkpoint; the trial ends in the same ``fit()`` with every evaluation once, in the files and
    in MLflow."""
    import threading

    import ray
    from ray.util.state import list_actors

    from isosweep.trial.job import lone_trial_threads, make_torch_trainer, ray_init

    uri, _ = mlflow_server
    sweep = own_smoke(tmp_path)
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, tmp_path)
    point_cfg = sweep.trials[0]
    run_id = runs.open_child(client, parent, sweep.sweep_id, point_cfg.key, point_cfg.cfg, point_cfg.config_key)
    out = tmp_path / "trial"
    cfg = load_trial(EASY, ["budget=1024", "Bp=8", "n=4", "eval.every=4", "task.eval_problems=32",
                            "rollout.engine=vllm"])
    assert ray_init(log_to_driver=False)
    failed = []
    try:
        threads = lone_trial_threads(cfg, ray.cluster_resources().get("CPU", 1.0))
        trainer = make_torch_trainer(cfg, out, tracker=runs.MlflowTracker(uri, run_id), threads=threads)

        def fit() -> None:
            try:
                trainer.fit()
            except BaseException as err:  # noqa: BLE001 -- reported by the assertion below
                failed.append(err)

        runner = threading.Thread(target=fit)
        runner.start()
        deadline = time.monotonic() + 600
        while len(TrialDir(out).records()) < 2 and runner.is_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        actors = list_actors(filters=[("class_name", "=", "VLLMEngine"), ("state", "=", "ALIVE")])
        assert len(actors) == 1 and TrialDir(out).records()[-1]["step"] < 32, "the trial ended before the kill"
        os.kill(actors[0].pid, signal.SIGKILL)
        runner.join(timeout=900)
        assert not runner.is_alive() and not failed, failed
    finally:
        ray.shutdown()
    log = (out / "trial.log").read_text()
    assert log.count("[trial] arithmetic/easy") == 2 and "resuming at step" in log  # a new worker group and actor
    got = TrialDir(out).records()
    assert [r["step"] for r in got] == list(range(0, 33, 4))
    steps = TrialDir(out).steps()
    assert [r["step"] for r in steps] == list(range(1, 33))
    evals = client.get_metric_history(run_id, "eval/mean_at_4")
    assert sorted((m.step, m.value) for m in evals) == [(r["rollouts"], r["eval/mean@4"]) for r in got]
    rewards = client.get_metric_history(run_id, "train/reward")
    assert sorted((m.step, m.value) for m in rewards) == [(r["rollouts"], r["train/reward"]) for r in steps]
