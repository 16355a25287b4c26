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
from sweep_helpers import ISOSWEEP, check_mlflow_matches_the_trials, env_for, own_smoke

ROOT = Path(__file__).resolve().parents[2]
EASY = ROOT / "sweeps" / "trials" / "easy.yaml"
SHORT = ["budget=256", "Bp=8", "n=4", "eval.every=4", "task.eval_problems=32", "rollout.engine=hf"]

CHILD = """
import sys
import time
from isosweep.spec.trial import load_trial
from isosweep.track import runs
from isosweep.trial.files import TrialDir, kill_point
from isosweep.trial.loop import train_loop

uri, run_id, out, config, *sets = sys.argv[1:]
cfg = load_trial(config, sets)
logger = runs.TrialLogger(uri, run_id, TrialDir(out), cfg.eval.k, between_requests=lambda: kill_point("between-log-batches"))
logger.catch_up()  # as a sweep's trial starts: MLflow caught up from the files
train_loop(cfg, out, log=lambda _: None, report=logger.log)
logger.catch_up()
"""


@pytest.fixture(scope="module")
def reference(base_model, tmp_path_factory) -> TrialDir:
    out = tmp_path_factory.mktemp("uninterrupted") / "trial"
    train_loop(load_trial(EASY, SHORT), out, log=lambda _: None)
    return TrialDir(out)


def trial_run(mlflow_server, tmp_path: Path) -> tuple:
    """``(uri, client, run_id)``: a trial's child run on the session's server, under a smoke sweep of the test's own."""
    uri, _ = mlflow_server
    sweep = own_smoke(tmp_path)
    client = runs.client(uri)
    parent = runs.open_parent(client, sweep, tmp_path)
    point = sweep.trials[0]
    return uri, client, runs.open_child(client, parent, sweep.sweep_id, point.key, point.cfg, point.config_key)


def assert_mlflow_holds(client, run_id: str, records: list[dict], steps: list[dict],
                        keys: tuple[str, ...] = ("train/reward",)) -> None:
    """MLflow holds what the files hold, each point once: every eval record, and each step's ``keys``."""
    evals = client.get_metric_history(run_id, "eval/mean_at_4")
    assert sorted((m.step, m.value) for m in evals) == [(r["rollouts"], r["eval/mean@4"]) for r in records]
    for key in keys:
        history = client.get_metric_history(run_id, runs.mlflow_name(key))
        assert sorted((m.step, m.value) for m in history) == [(r["rollouts"], r[key]) for r in steps], key


def assert_uninterrupted_and_in_mlflow(reference: TrialDir, trial: TrialDir, client, run_id: str) -> None:
    """The trial's evaluations (steps 0, 4, 8) and steps are the uninterrupted run's, to 1e-9, and MLflow holds them."""
    want, got = reference.records(), trial.records()
    assert [r["step"] for r in got] == [0, 4, 8] and [r["rollouts"] for r in got] == [0, 128, 256]
    for a, b in zip(want, got):
        assert math.isclose(a["eval/mean@4"], b["eval/mean@4"], abs_tol=1e-9)
    steps = trial.steps()
    assert [r["step"] for r in steps] == [r["step"] for r in reference.steps()]
    assert_mlflow_holds(client, run_id, got, steps)


def run_child(uri: str, run_id: str, out: Path, kill_at: str | None, sets: list[str] = SHORT
              ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()  # not this process's torch.distributed world (the reference's)
           if k not in (KILL_AT, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(ROOT / "platform")
    if kill_at:
        env[KILL_AT] = kill_at
    return subprocess.run([sys.executable, "-c", CHILD, uri, run_id, str(out), str(EASY), *sets], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("point", [p for p in KILL_POINTS if p != "between-log-batches"])
def test_a_trial_killed_at_a_fixed_point_resumes_to_the_same_files_and_mlflow_holds_them_once(
        point, reference, mlflow_server, tmp_path):
    uri, client, run_id = trial_run(mlflow_server, tmp_path)
    out = tmp_path / "trial"

    killed = run_child(uri, run_id, out, f"{point}:2")  # the second evaluation's (step 4)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [r["step"] for r in TrialDir(out).records()] == ([0, 4] if point == "record-appended" else [0])
    done = run_child(uri, run_id, out, None)
    assert done.returncode == 0, done.stderr[-3000:]

    assert_uninterrupted_and_in_mlflow(reference, TrialDir(out), client, run_id)


@pytest.mark.slow
def test_a_trial_killed_between_two_requests_of_one_records_metrics_resumes_and_mlflow_holds_each_step_once(
        base_model, mlflow_server, tmp_path):
    """A record 48 steps after the one before carries 48 x 25 step metrics: more than one ``log_batch`` request.
    Killed between the two, MLflow holds whole steps only; the resumed trial logs exactly the rest."""
    uri, client, run_id = trial_run(mlflow_server, tmp_path)
    out = tmp_path / "trial"
    long = ["budget=3072", "Bp=8", "n=4", "eval.every=48", "task.eval_problems=32", "rollout.engine=hf"]

    killed = run_child(uri, run_id, out, "between-log-batches", long)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    held = sorted(m.step for m in client.get_metric_history(run_id, "train/reward"))
    assert 0 < len(held) < 48 and held == [32 * s for s in range(1, len(held) + 1)]  # a prefix of whole steps
    assert [m.step for m in client.get_metric_history(run_id, "eval/mean_at_4")] == [0]  # the record: not yet
    done = run_child(uri, run_id, out, None, long)
    assert done.returncode == 0, done.stderr[-3000:]

    got, steps = TrialDir(out).records(), TrialDir(out).steps()
    assert [r["step"] for r in got] == [0, 48, 96] and [r["step"] for r in steps] == list(range(1, 97))
    # a step's first, middle and last metrics
    assert_mlflow_holds(client, run_id, got, steps, keys=("train/reward", "train/kl", "time/step_s"))


def test_log_metrics_splits_only_between_steps_and_calls_back_between_requests():
    """Requests of at most 1,000 metrics, each ending at a change of step (a step of more than 1,000 is the only
    one split), in the order given; the callback between two requests, never after the last."""
    from mlflow.entities import Metric

    class Recorder:  # stands in for MlflowClient: only what was sent, and in which requests
        def __init__(self):
            self.requests = []

        def log_batch(self, run_id, metrics):
            self.requests.append(list(metrics))

    metrics = [Metric(f"m{k}", 1.0, 0, step) for step in range(100) for k in range(25)]  # 100 steps x 25
    metrics += [Metric(f"big{k}", 1.0, 0, 100) for k in range(1200)] + [Metric("eval", 1.0, 0, 101)]
    client, calls = Recorder(), []
    runs.log_metrics(client, "run", metrics, between=lambda: calls.append(len(client.requests)))
    assert [m for r in client.requests for m in r] == metrics
    assert all(len(r) <= runs.BATCH_METRICS for r in client.requests)
    for request in client.requests[:-1]:
        end = metrics.index(request[-1])
        assert metrics[end + 1].step != request[-1].step or len(request) == runs.BATCH_METRICS
    assert [len(r) for r in client.requests][:3] == [1000, 1000, 500]  # 40 whole steps, 40 steps, the last 20
    assert calls == list(range(1, len(client.requests)))
    client = Recorder()
    runs.log_metrics(client, "run", metrics[:30], between=lambda: calls.append("never"))
    assert len(client.requests) == 1 and "never" not in calls


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

    uri, client, run_id = trial_run(mlflow_server, tmp_path)
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

    assert_uninterrupted_and_in_mlflow(reference, TrialDir(out), client, run_id)


@pytest.mark.slow
def test_a_sweep_trial_whose_process_is_killed_is_retried_by_tune_and_finishes_in_the_same_run(mlflow_server, tmp_path):
    """A sweep's trial trains in its Tune trial's process (``in_process``, the default here), with no Ray Train job to
    restart it: that process dies (SIGKILL at a trial's second committed checkpoint, in one process only), Tune
    retries the trial, which resumes from the checkpoint; the same sweep run ends with every trial finished, each
    evaluation once in the files and in MLflow."""
    uri, mlflow_env = mlflow_server
    sweep = own_smoke(tmp_path, budget=640)
    runs_dir = tmp_path / "runs"
    marker = tmp_path / "killed-once"
    env = {**env_for(mlflow_env), KILL_AT: "checkpoint-committed:2", KILL_ONCE: str(marker)}  # Ray passes it on
    done = subprocess.run([ISOSWEEP, "sweep", str(sweep.path), "--budget", "640", "--runs", str(runs_dir),
                           "--no-dashboards"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert marker.exists() and "trainer in_process" in done.stdout  # the kill happened, once
    logs = [(runs_dir / sweep.sweep_id / "trials" / p.key / "trial.log").read_text() for p in sweep.trials]
    retried = [log for log in logs if log.count("[trial] arithmetic/easy") == 2]
    assert len(retried) == 1 and "resuming at step" in retried[0], logs
    check_mlflow_matches_the_trials(runs.client(uri), sweep, runs_dir)


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

    uri, client, run_id = trial_run(mlflow_server, tmp_path)
    out = tmp_path / "trial"
    cfg = load_trial(EASY, ["budget=512", "Bp=8", "n=4", "eval.every=4", "task.eval_problems=32",
                            "rollout.engine=vllm"])  # 16 steps, 5 evaluations
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
        actors = list_actors(address=ray.get_runtime_context().gcs_address,  # not a search for it: other Rays may run
                             filters=[("class_name", "=", "VLLMEngine"), ("state", "=", "ALIVE")])
        assert len(actors) == 1 and TrialDir(out).records()[-1]["step"] < 16, "the trial ended before the kill"
        os.kill(actors[0].pid, signal.SIGKILL)
        runner.join(timeout=900)
        assert not runner.is_alive() and not failed, failed
    finally:
        ray.shutdown()
    log = (out / "trial.log").read_text()
    assert log.count("[trial] arithmetic/easy") == 2 and "resuming at step" in log  # a new worker group and actor
    got = TrialDir(out).records()
    assert [r["step"] for r in got] == list(range(0, 17, 4))
    steps = TrialDir(out).steps()
    assert [r["step"] for r in steps] == list(range(1, 17))
    assert_mlflow_holds(client, run_id, got, steps)
