"""Launch one trial: in this process, or as a Ray Train job of ``TorchTrainer`` workers running ``loop.train_loop``.

How is the trial config's choice (``trainer.launcher``, :func:`isosweep.spec.trial.launcher_choice`):

- ``in_process`` (one trainer worker on a CPU profile, the default there): the loop runs in the calling
  process -- a sweep's Ray Tune trial (an actor Tune reuses from one trial to the next, so torch,
  transformers and DeepSpeed are imported once per actor, not once per trial), or ``isosweep trial``'s own
  process -- as a world of one on loopback. Nothing is started for it.
- ``ray_train``: the Train V2 pattern: the caller (the CLI, or a Tune function in a sweep) builds a
  ``TorchTrainer`` whose per-worker function is the GRPO loop; the workers report every evaluation with
  ``ray.train.report``. Resources come from the trial's hardware profile: the trainer's share is split
  across ``trainer.num_workers`` workers, and the rollout actors that rank 0 starts ask for their own
  share in a placement group of their own (:mod:`isosweep.rollout.placement`). Ray Train restarts a worker group
  whose worker died.

A trial's state lives in its output directory (checkpoints, metrics), not in Ray: each launch
gets a fresh Ray Train run name, and the loop resumes from the directory's latest checkpoint.

Only the process that trains imports torch and the loop (transformers, DeepSpeed: seconds of imports per
process). This module is also unpickled by the Tune trial function and the Train controller, each a
fresh Ray worker process per trial; kept light, it costs them well under a second.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from isosweep.rollout.placement import release
from isosweep.spec.profiles import get_profile, placement_bundles
from isosweep.spec.trial import TrialConfig, launcher_choice, resources_of, rollout_engine
from isosweep.track.curves import without_counts
from isosweep.track.null import NullTracker
from isosweep.trial.files import TrialDir, kill_point
from isosweep.trial.localhost import LOOPBACK, free_port

RAY_ENV = {
    # ray.train.report costs ~2 s at the default health-check interval; 0.25 s makes it ~0.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
    # vLLM in a Ray actor: an in-process engine core starts in ~11 s instead of ~30 s.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # Ray Train sends a worker's print both to its stdout and through the root logger, so every line of a
    # trial's log reached the driver twice; off, a print is a print.
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    # Tune gives a reused trial process 2 s for the previous trial's thread to end before it fails the next
    # trial ("Trainable runner reuse requires reset_config() to be implemented and return True"). An
    # in-process trial that an HPO study stopped early still closes its MLflow run and frees its engine
    # after Tune ends it: more than 2 s on a busy machine. The wait ends as soon as the thread does.
    "TUNE_FUNCTION_THREAD_TIMEOUT_S": "60",
}


LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Ray's switch for macOS and Windows, where a local Ray takes 127.0.0.1 as its node address: its GCS,
raylet, workers, agents and dashboard then bind only to the loopback interface. On Linux Ray otherwise
takes the machine's network address and listens on every interface, and ``_node_ip_address="127.0.0.1"``
alone is rewritten to that address (``ray._private.services.resolve_ip_for_localhost``). Ray reads the
switch when it is imported (``ray._private.ray_constants.ENABLE_RAY_CLUSTER``), so :func:`ray_init` sets
both, for the processes the local Ray starts, and only while it starts them."""


@contextmanager
def _loopback_only():
    """Ray's :data:`LOOPBACK_ENV` switch on while a local Ray starts, restored after: a driver that later
    joins a real cluster from this process must take its network address again."""
    from ray._private import ray_constants  # Ray: the switch was read at import, possibly before this call

    saved_flag = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        with _environ(LOOPBACK_ENV):
            yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag


@contextmanager
def _environ(values: dict[str, str]):
    """``values`` in this process's environment (and so in the processes it starts) while the block runs."""
    saved_env = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def ray_init(address: str | None = None, log_to_driver: bool = True) -> bool:
    """Connect to ``address`` (or ``$RAY_ADDRESS``, as a Ray job's driver has) or start a local Ray that
    listens on 127.0.0.1 only (:data:`LOOPBACK_ENV`); returns whether this call started it.

    A local Ray is always a new one (``address="local"``): ``ray.init()`` alone would join a cluster some
    earlier ``ray start`` left running, on whatever addresses that cluster listens. Its workers get its
    address as ``RAY_ADDRESS``, so several local Rays can run on one machine (two sweeps, a sweep and the tests).
    """
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    if ray.is_initialized():
        return False
    # The dashboard serves Ray's state API. Without it, Ray Train's placement-group cleaner never
    # learns that the controller of a trial Tune stopped (an ASHA or early stop) has died, so the
    # trial's placement group is never removed: its CPUs stay reserved and later trials wait forever.
    env_vars = {k: os.environ[k] for k in RAY_ENV}
    common = {"include_dashboard": True, "log_to_driver": log_to_driver}
    if address is not None or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, runtime_env={"env_vars": env_vars}, **common)
        return True
    # Ray's state API, called without an address from inside a worker (Ray Train's placement-group cleaner
    # asks it whether a trial's Train controller is still alive), looks for the cluster among the machine's
    # processes and fails when it finds two: a second local Ray (another sweep, a test) then made every
    # stopped trial keep its CPUs. The local Ray's GCS gets a port chosen here, and its workers its address.
    port = free_port()
    env_vars["RAY_ADDRESS"] = f"{LOOPBACK}:{port}"
    with _loopback_only(), _environ({"RAY_GCS_SERVER_PORT": str(port)}):
        ray.init(address="local", _node_ip_address=LOOPBACK, dashboard_host=LOOPBACK,
                 runtime_env={"env_vars": env_vars}, **common)
    return True


def train_logged(cfg: TrialConfig, trial: TrialDir, tracker=None, report: Callable[[dict], None] | None = None,
                 rank: int = 0, log: Callable[[str], None] | None = None, run_id: str = "local",
                 launch: dict[str, float] | None = None) -> list[dict]:
    """One trainer worker's training loop, rank 0's records logged to ``tracker`` (its MLflow run in a sweep;
    default the null tracker) before each goes to ``report`` (per-problem counts left out: Tune and Ray Train
    keep every reported value); ``log`` takes the loop's lines (default: appended to the trial's
    ``trial.log`` where there is a tracker, else printed). Returns the eval records."""
    from isosweep.trial.loop import train_loop  # reason: torch, transformers, DeepSpeed (module docstring)

    logger = (tracker or NullTracker()).trial_logger(
        trial, cfg.eval.k, between_requests=lambda: kill_point("between-log-batches")) if rank == 0 else None

    def on_record(record: dict) -> None:
        if logger is not None:
            logger.log(record)
        if report is not None:
            report(without_counts(record))

    def to_file(line: str) -> None:
        with open(trial.log_file, "a") as f:
            f.write(line + "\n")

    log = log or (to_file if tracker is not None else print)
    if rank == 0:
        name, why = launcher_choice(cfg)
        log(f"[trial] launcher: {name} ({why})")
    records = train_loop(cfg, trial.path, log=log, report=on_record, run_id=run_id, launch=launch)
    if logger is not None:  # a record a resume restored to the files (a kill before its append) is never reported
        logger.catch_up()
    return records


def run_in_process(cfg: TrialConfig, out: str | Path, tracker=None, report: Callable[[dict], None] | None = None,
                   threads: int | None = None, log: Callable[[str], None] | None = None) -> list[dict]:
    """The ``in_process`` launch: the trial's one worker in this process (:func:`train_logged`), on ``threads``
    torch threads (default: as they are). Its first eval record's ``time/start_imports_s`` is what importing
    the loop cost this call: 0 in a process that trained before (a Tune actor reused)."""
    entered = time.time()
    import torch  # reason: only the process that trains loads torch (module docstring)

    import isosweep.trial.loop  # noqa: F401  reason: as above; timed as the launch's imports
    from isosweep.trial.learner import forget_launcher_env  # reason: as above

    forget_launcher_env()  # an in-process launch is a world of one, whatever its parent process left in the environment

    launch = {"time/start_imports_s": time.time() - entered}
    if threads:
        torch.set_num_threads(threads)
    run_id = uuid.uuid4().hex[:8]  # names this launch's rollout actors, if it starts any
    try:
        return train_logged(cfg, TrialDir(out), tracker, report, log=log, run_id=run_id, launch=launch)
    finally:
        release(run_id)  # this process outlives the trial (a reused Tune trial, a study's driver): so would they


def in_process_threads(cfg: TrialConfig) -> int | None:
    """Torch threads of an ``in_process`` trial inside a sweep: the CPUs its Tune trial holds (driver and
    trainer shares: one on the tiny profile, so two packed trials do not oversubscribe two cores); None on a
    GPU profile (the GPU does the work).

    It depends on the config alone, never on how many trials run beside it: a trial's float results depend
    on its thread count, and a difference in the last bit grows into another trajectory. So a sweep trial is
    the same run whether it ran packed, alone, or resumed as a sweep's last trial, which is what lets studies
    share and pool runs (dashboards/FINDINGS.md records a run that diverged on another thread count)."""
    profile = get_profile(cfg.profile)
    if profile.accelerator == "gpu":
        return None
    return max(1, int(profile.driver.CPU + profile.trainer.CPU + 1e-9))


def _worker(config: dict) -> None:
    """Per-worker entry point of a Ray Train job: rebuild the validated config, run the loop, report each eval.

    Rank 0 logs each record to the trial's tracker (its MLflow run in a sweep, nothing otherwise)
    before reporting it; with ``log_to_file`` the loop's log lines go to the trial's ``trial.log``.
    """
    entered = time.time()
    import ray.train
    import torch  # reason: only the Train worker loads torch (module docstring)

    import isosweep.trial.loop  # noqa: F401  reason: torch, transformers, DeepSpeed (module docstring)

    # the fixed cost before the loop: Ray Train's controller and worker processes up to this function (clocks of
    # one node; across nodes, their skew too), then the worker's imports
    launch = {"time/start_job_s": entered - config["submitted"], "time/start_imports_s": time.time() - entered}

    cfg = TrialConfig.model_validate(config["cfg"])
    if config.get("threads"):
        torch.set_num_threads(config["threads"])
    trial = TrialDir(config["out"])
    rank = ray.train.get_context().get_world_rank()
    train_logged(cfg, trial, config["tracker"], ray.train.report, rank=rank,
                 log=None if config["log_to_file"] else print, run_id=config["run_id"], launch=launch)


WORKER_RESTARTS = 2
"""How many times a trial's Ray Train job restarts its worker group after a worker (or the rollout actor rank 0
drives) dies, in the same run: the new workers resume from the trial's latest checkpoint, repeating at most the
steps since it (``eval.checkpoint_every``), and rank 0's MLflow logger skips what its run already holds."""


def run_torch_trainer(cfg: TrialConfig, out: Path, tracker=None, callbacks: list | None = None,
                      name: str = "trial", threads: int | None = None) -> None:
    """Run the ``ray_train`` launch of one trial (:func:`make_torch_trainer`) to its end, then free what its
    workers left in the cluster: the placement groups of its rollout actors outlive the workers that made them."""
    run_id = uuid.uuid4().hex[:8]  # a repeated Train run name would resume Ray's old run, not ours
    try:
        make_torch_trainer(cfg, out, tracker, callbacks, name, threads, run_id).fit()
    finally:
        release(run_id)


def make_torch_trainer(cfg: TrialConfig, out: Path, tracker=None, callbacks: list | None = None,
                       name: str = "trial", threads: int | None = None, run_id: str | None = None):
    """The ``TorchTrainer`` of one trial: ``trainer.num_workers`` workers sharing the profile's
    trainer resources, each running :func:`_worker`. ``tracker`` (an
    :class:`isosweep.track.runs.MlflowTracker` in a sweep; default the null tracker) receives rank
    0's records, and with one (a null tracker included) the trial logs to its ``trial.log``; ``callbacks`` are Ray Train
    callbacks (a sweep passes Tune's). ``threads``: torch threads per worker (default: what Ray
    gives a worker of its CPU share, one thread on the tiny profile, so packed trials do not
    oversubscribe the cores). ``run_id`` names the Train run and the rollout actors (default: a new one)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from isosweep.trial.loopback import LoopbackTorchConfig  # reason: Ray's torch backend imports torch

    profile = get_profile(cfg.profile)
    workers = cfg.trainer.num_workers
    run_id = run_id or uuid.uuid4().hex[:8]  # a repeated Train run name would resume Ray's old run, not ours
    return TorchTrainer(
        _worker,
        train_loop_config={"cfg": cfg.model_dump(mode="json"), "out": str(out), "run_id": run_id,
                           "tracker": tracker or NullTracker(), "log_to_file": tracker is not None,
                           "threads": threads, "submitted": time.time()},
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=profile.accelerator == "gpu",
            resources_per_worker={"CPU": profile.trainer.CPU / workers, "GPU": profile.trainer.GPU / workers},
            # the trainer workers packed: on one node for a one-node profile, on as few as fit otherwise
            placement_strategy=placement_bundles(profile, workers, cfg.rollout.actors)[1],
        ),
        torch_config=LoopbackTorchConfig(backend=profile.backend),
        run_config=RunConfig(name=f"{name}-{run_id}", storage_path=str(out / "ray"), callbacks=callbacks,
                             failure_config=FailureConfig(max_failures=WORKER_RESTARTS)),
    )


def lone_trial_threads(cfg: TrialConfig, cluster_cpus: float) -> int | None:
    """Torch threads per trainer worker of a trial that has a cluster of ``cluster_cpus`` to itself
    (None on GPU profiles: the GPU does the work)."""
    profile = get_profile(cfg.profile)
    if profile.accelerator == "gpu":
        return None
    actors = resources_of(cfg)["CPU"] - profile.driver.CPU - profile.trainer.CPU  # the rollout actors' share
    return max(1, int((cluster_cpus - actors + 1e-9) // cfg.trainer.num_workers))


def run_trial(cfg: TrialConfig, out: str | Path, address: str | None = None,
              log: Callable[[str], None] = print) -> list[dict]:
    """Run (or resume) one trial; returns its eval records.

    A trial run alone has the machine to itself, so on CPU its trainer workers share the CPUs its
    rollout actors leave (two threads for the in-process engine on 2 cores) instead of the one
    thread a packed sweep trial gets. An ``in_process`` trial (:func:`launcher_choice`) trains in this
    process and starts Ray only for vLLM rollout actors (or joins ``address``); a ``ray_train`` one runs
    as a Ray Train job, on a local Ray started here unless one is running or ``address`` is given.
    """
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    in_process = launcher_choice(cfg)[0] == "in_process"
    needs_ray = not in_process or rollout_engine(cfg) == "vllm" or address is not None
    started = ray_init(address) if needs_ray else False
    try:
        ray = sys.modules.get("ray")  # imported only where Ray is used: an in-process hf trial never needs it
        cpus = ray.cluster_resources().get("CPU", 1.0) if ray and ray.is_initialized() else float(len(os.sched_getaffinity(0)))
        threads = lone_trial_threads(cfg, cpus)
        if in_process:
            run_in_process(cfg, out, threads=threads, log=log)
        else:
            run_torch_trainer(cfg, out, threads=threads)
    finally:
        if started:
            import ray

            ray.shutdown()
    return TrialDir(out).records()
