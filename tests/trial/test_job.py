"""Launching a trial: in process or as a Ray Train job (data-parallel DeepSpeed workers), fresh weights for every
rollout, profiles."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import ray
from transformers import AutoModelForCausalLM

from isosweep.rollout.hf import HFEngine
from isosweep.spec.profiles import get_profile, load_profiles, trial_resources
from isosweep.spec.trial import load_trial
from isosweep.spec.yamlio import ConfigError
from isosweep.trial.files import TrialDir
from isosweep.trial.job import in_process_threads, lone_trial_threads, ray_init, run_trial
from isosweep.trial.loop import train_loop

ROOT = Path(__file__).resolve().parents[2]
EASY = ROOT / "sweeps" / "trials" / "easy.yaml"
SHORT = ["budget=512", "Bp=8", "n=4", "eval.every=8", "task.eval_problems=32", "rollout.engine=hf"]


def test_profiles_load_and_fit_their_node():
    profiles = load_profiles()
    assert "cpu-tiny" in profiles
    for name, profile in profiles.items():
        need = trial_resources(profile, workers=1, actors=1)
        nodes = profile.nodes  # a multi-node profile fits its nodes together (tests/test_clusters.py: each bundle fits one)
        assert need["CPU"] <= nodes * profile.node.CPU and need["GPU"] <= nodes * profile.node.GPU, name
    with pytest.raises(ConfigError, match="unknown hardware profile 'h100-galaxy'"):
        get_profile("h100-galaxy")


def test_a_lone_trial_takes_the_cpus_its_rollout_actors_leave():
    assert lone_trial_threads(load_trial(EASY, SHORT), 2) == 2  # in-process engine: both cores
    assert lone_trial_threads(load_trial(EASY, SHORT[:-1] + ["rollout.engine=vllm"]), 2) == 1  # an actor has 0.9
    assert lone_trial_threads(load_trial(EASY, SHORT + ["trainer.num_workers=2"]), 2) == 1
    assert lone_trial_threads(load_trial(EASY, SHORT), 1) == 1


def test_a_sweep_trial_runs_on_its_own_share_whatever_runs_beside_it():
    """One thread on both CPU profiles of a 2-core machine: the thread count sets a trial's float rounding, so it
    comes from the config alone (a sweep trial is the same run packed, alone or resumed)."""
    assert in_process_threads(load_trial(EASY, SHORT)) == 1  # cpu-tiny
    assert in_process_threads(load_trial(EASY, SHORT + ["profile=cpu-half"])) == 1
    assert in_process_threads(load_trial(EASY, SHORT + ["profile=h200-node"])) is None  # the GPU does the work


def test_unknown_profile_is_rejected_at_load(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("budget: 1000\nprofile: laptop\n")
    with pytest.raises(ConfigError, match="key 'profile'.*unknown hardware profile 'laptop'"):
        load_trial(path)


def test_every_rollout_uses_the_weights_of_the_step_it_feeds(base_model, tmp_path):
    """The policy-version counter: step s is sampled with version s (weights after s updates)."""
    cfg = load_trial(EASY, SHORT)
    train_loop(cfg, tmp_path, log=lambda _: None)
    steps = TrialDir(tmp_path).steps()
    assert [s["step"] for s in steps] == list(range(1, 17))
    assert all(s["rollout/policy_version"] == s["step"] - 1 for s in steps)


class _DroppedUpdates(HFEngine):
    """A rollout engine that loses weight updates (the fault the version counter must catch)."""

    def update_weights(self, state_dict, version, at_precision=True):
        if version == 0:
            super().update_weights(state_dict, version, at_precision)


def test_stale_rollouts_stop_the_trial(base_model, tmp_path, monkeypatch):
    import isosweep.trial.loop as loop

    real = loop.make_engine

    def faulty(cfg, model_path, tokenizer, rank, run_id):
        engine, shared = real(cfg, model_path, tokenizer, rank, run_id)
        return _DroppedUpdates(engine.model, tokenizer, engine.max_new_tokens, engine.temperature), shared

    monkeypatch.setattr(loop, "make_engine", faulty)
    with pytest.raises(RuntimeError, match="stale rollouts: policy version 0, trainer at 1"):
        train_loop(load_trial(EASY, SHORT), tmp_path, log=lambda _: None)


@pytest.mark.slow
def test_two_data_parallel_workers_match_one_in_expectation(base_model, tmp_path):
    """2 DeepSpeed workers (gloo) split each step's problems; the run reports the same schedule and
    statistics of the same size as one worker."""
    one = train_loop(load_trial(EASY, SHORT), tmp_path / "one", log=lambda _: None)  # a world of one, no Ray needed
    two = run_trial(load_trial(EASY, SHORT + ["trainer.num_workers=2", "trainer.zero_stage=2"]), tmp_path / "two")
    assert [r["rollouts"] for r in one] == [r["rollouts"] for r in two] == [0, 256, 512]
    assert one[0]["eval/mean@4"] == two[0]["eval/mean@4"]  # same base model, same eval seed
    s1, s2 = TrialDir(tmp_path / "one").steps(), TrialDir(tmp_path / "two").steps()
    assert len(s1) == len(s2) == 16
    kl1 = sum(s["train/kl"] for s in s1) / 16
    kl2 = sum(s["train/kl"] for s in s2) / 16
    # the policy moves by the same order of magnitude. Over trial seeds 0-9 (2026-12-01) kl2 / kl1 was
    # 0.60-3.57 (log-ratio mean 0.20, sd 0.56); the old bounds 0.25-4 sat 2.1 sd from that mean, so a
    # machine whose float rounding reshuffles the samples failed about 1 run in 50. An order of magnitude is 3.7 sd.
    assert 0.1 < kl2 / kl1 < 10, (kl1, kl2)
    assert all(s["rollout/policy_version"] == s["step"] - 1 for s in s2)
    # a Ray Train launch's fixed cost, phase by phase, in its first record only (the in-process run has no job phases)
    assert two[0]["time/start_job_s"] > 0 and two[0]["time/start_imports_s"] > 0 and two[0]["time/start_learner_s"] > 0
    assert not any(key.startswith("time/start_") for r in two[1:] for key in r)
    assert "time/start_job_s" not in one[0] and one[0]["time/start_learner_s"] > 0


def _computed(rows: list[dict]) -> list[dict]:
    """What a trial computed, without its clocks."""
    return [{k: v for k, v in row.items() if not k.startswith("time/") and k != "system/wall_s"} for row in rows]


@pytest.mark.slow
def test_a_trial_computes_the_same_in_process_as_in_a_ray_train_job(base_model, tmp_path):
    """``trainer.launcher`` changes where a trial runs, never what it computes: every record and step the same,
    bit for bit (a lone trial has both cores either way); only a Ray Train launch has a job start-up to report."""
    inline = run_trial(load_trial(EASY, SHORT), tmp_path / "in")
    job = run_trial(load_trial(EASY, SHORT + ["trainer.launcher=ray_train"]), tmp_path / "job")
    assert _computed(inline) == _computed(job) and len(inline) == 3
    assert _computed(TrialDir(tmp_path / "in").steps()) == _computed(TrialDir(tmp_path / "job").steps())
    assert "time/start_job_s" in job[0] and "time/start_job_s" not in inline[0]
    assert inline[0]["time/start_imports_s"] >= 0 and inline[0]["time/start_learner_s"] > 0


def test_an_in_process_trial_ignores_the_launcher_variables_its_parent_left(base_model, tmp_path):
    """A process that trained in process (a test, a driver) has ``RANK`` and ``MASTER_PORT`` of its world of one in
    its environment, and its children inherit them: an in-process trial started by such a child is still a world of
    one of its own, not a rendezvous at the parent's port (two of them at once failed with EADDRINUSE)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {**os.environ, "PYTHONPATH": str(ROOT / "platform"), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(taken.getsockname()[1])}
        sets = [arg for kv in ["budget=64", "Bp=8", "n=4", "eval.every=2", "task.eval_problems=8", "rollout.engine=hf"]
                for arg in ("--set", kv)]
        done = subprocess.run([sys.executable, "-m", "isosweep.cli", "trial", str(EASY), *sets, "--out",
                               str(tmp_path / "trial")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["step"] for r in TrialDir(tmp_path / "trial").records()] == [0, 2]


@pytest.mark.slow
def test_corrections_run_and_log_their_diagnostics_every_step(base_model, tmp_path):
    for correction in ("tis", "ais"):
        cfg = load_trial(EASY, SHORT + ["rollout.precision=fp8", f"algorithm.correction={correction}"])
        train_loop(cfg, tmp_path / correction, log=lambda _: None)
        steps = TrialDir(tmp_path / correction).steps()
        for s in steps:
            for key in ("mismatch/logp_abs_diff_mean", "mismatch/ratio_max", "mismatch/kl", "ais/alpha",
                        "ais/alpha_ess", "ais/alpha_mis", "ais/alpha_var", "ais/ess"):
                assert key in s
            assert 0 <= s["ais/alpha"] <= 1
            assert s["mismatch/logp_abs_diff_mean"] > 0  # fp8-rounded rollout weights differ from the trainer's


@pytest.mark.slow
@pytest.mark.parametrize(
    ("engine", "factor"),
    [
        # HF engine (delta 0.02): fp8/bf16 ratio of mean alpha 3.7-7.2 over trial seeds 0-9 (2026-12-01;
        # alpha 0.09-0.16 for bf16 vs 0.53-0.71 for fp8)
        ("hf", 2.5),
        # vLLM on CPU (bf16 activations): ratio 2.07-2.85 over trial seeds 0-9 (2026-12-01; alpha
        # 0.24-0.32 for bf16 vs 0.61-0.76 for fp8)
        pytest.param("vllm", 1.5, marks=pytest.mark.vllm),
    ],
)
def test_alpha_is_well_below_under_bf16_than_under_fp8_rollouts(base_model, tmp_path, engine, factor):
    """At the same delta, the AIS gate stays low for bf16 rollout weights and opens for FP8 ones."""
    if engine == "vllm":
        pytest.importorskip("vllm", reason="vLLM is not installed")
    alphas = {}
    started = engine == "vllm" and ray_init(log_to_driver=False)  # one Ray for both trials, as a study's driver has
    try:
        for precision in ("bf16", "fp8"):
            cfg = load_trial(EASY, SHORT[:-1] + [f"rollout.engine={engine}", f"rollout.precision={precision}"])
            out = tmp_path / precision
            if engine == "hf":
                train_loop(cfg, out, log=lambda _: None)
            else:
                run_trial(cfg, out)  # in this process, with a vLLM rollout actor
                # the trial's process lives on, so the trial itself must free its actor (and the actor's CPUs)
                assert [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("rollout-")
                        ] == []
            steps = TrialDir(out).steps()
            alphas[precision] = sum(s["ais/alpha"] for s in steps) / len(steps)
    finally:
        if started:
            ray.shutdown()
    assert alphas["fp8"] > factor * alphas["bf16"], alphas


def _run_cli_trial(out: Path, sets: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    """``isosweep trial`` in a process group of its own, killed whole (its Ray too) if it outlives ``timeout_s``:
    a collective that one worker never joins hangs until gloo's 30-minute timeout, and the test must fail instead."""
    cmd = [sys.executable, "-m", "isosweep.cli", "trial", str(EASY), *[a for kv in sets for a in ("--set", kv)],
           "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the trial hung (killed after {timeout_s:g} s); its last lines:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, output)


@pytest.mark.slow
@pytest.mark.vllm
def test_two_zero3_workers_share_one_vllm_actor_train_and_resume(base_model, tmp_path):
    """The multi-GPU layout on CPU: 2 trainer workers under ZeRO-3 with every parameter partitioned (persistence
    threshold 0: each worker holds a shard, ``numel()`` 0 outside a gather) and one shared vLLM actor in the trial's
    placement group (2 CPUs: 2 x 0.45 + 0.9). Rank 0 samples for both workers and publishes; every worker joins each
    gather of the weights (before, only rank 0 entered them and the trial hung at the first publication). Three
    steps, no stale rollouts, the parameter count of the whole model in the FLOPs, a KL of exactly 0 at the first
    step (a reference partitioned like the policy); then the newest checkpoint removed and the trial resumed from
    the one before it: the same step redone."""
    pytest.importorskip("vllm", reason="vLLM is not installed")
    sets = ["budget=96", "Bp=8", "n=4", "eval.every=2", "task.eval_problems=32", "rollout.engine=vllm",
            "trainer.num_workers=2", "trainer.zero_stage=3", "trainer.param_persistence_threshold=0"]
    _run_cli_trial(tmp_path, sets, timeout_s=480)
    trial = TrialDir(tmp_path)
    records, steps = trial.records(), trial.steps()
    assert [r["rollouts"] for r in records] == [0, 64, 96]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["rollout/policy_version"] == s["step"] - 1 for s in steps)
    assert steps[0]["train/kl"] == 0.0
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(base_model).parameters())
    assert [r["system/trainer_flops"] for r in records] == [6 * params * r["tokens"] for r in records]
    assert records[-1]["system/trainer_flops"] > 0

    newest = trial.checkpoints()[-1]
    assert newest.name.endswith("3")
    shutil.rmtree(newest)
    resumed = _run_cli_trial(tmp_path, sets, timeout_s=480)
    assert "resuming at step 2" in resumed.stdout
    again = TrialDir(tmp_path)
    assert [r["rollouts"] for r in again.records()] == [0, 64, 96]
    assert [s["step"] for s in again.steps()] == [1, 2, 3]
    assert again.steps()[-1]["rollout/policy_version"] == 2


def _forever(config: dict) -> None:
    import time

    import ray.train

    for i in range(1, 10_000):
        time.sleep(0.2)
        ray.train.report({"i": i})


def _tune_fn(config: dict) -> None:
    import uuid

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    TorchTrainer(_forever, scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.9}),
                 run_config=RunConfig(name=f"leak-{uuid.uuid4().hex[:6]}", storage_path=config["store"],
                                      callbacks=[TuneReportCallback()])).fit()


def test_a_trial_tune_stops_gives_its_train_placement_group_back(tmp_path):
    """Tune ending a trial kills its Ray Train controller; the Train job's placement group (CPUs for
    its workers) must then be removed, or an HPO study's stopped trials pile up until no trial fits.
    This failed (the groups stayed) when local Ray ran without the dashboard and its state API, and
    again when another Ray ran on the machine: Train's cleaner asks the state API, which without an
    address searched the machine's processes for the cluster and gave up on finding two."""
    import sys
    import time

    import cloudpickle
    from ray import tune

    from sweep_helpers import another_ray  # here, not above: Ray's workers unpickle this module's globals

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray's workers cannot import tests/

    @ray.remote(num_cpus=0)
    def seen_from_a_worker() -> tuple[str, int]:
        from ray.util.state import list_actors  # no address: as Ray Train's cleaner calls it

        return os.environ.get("RAY_ADDRESS", ""), len(list_actors())

    def live() -> list:
        return [p for p in ray.util.placement_group_table().values() if p["state"] != "REMOVED"]

    with another_ray() as other:
        assert ray_init()
        try:
            address, _ = ray.get(seen_from_a_worker.remote())
            assert address == ray.get_runtime_context().gcs_address and address != other
            tuner = tune.Tuner(tune.with_resources(_tune_fn, {"CPU": 0.1}),
                               param_space={"store": str(tmp_path / "ray"), "x": tune.grid_search([0, 1])},
                               tune_config=tune.TuneConfig(max_concurrent_trials=1),
                               run_config=tune.RunConfig(stop={"i": 3}, storage_path=str(tmp_path / "tune"),
                                                         verbose=0))
            results = tuner.fit()
            assert [r.metrics["i"] for r in results] == [3, 3] and not results.errors
            deadline = time.monotonic() + 60
            while live() and time.monotonic() < deadline:
                time.sleep(1)
            assert live() == [], "stopped trials kept their Train placement groups"
        finally:
            ray.shutdown()

