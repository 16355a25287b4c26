"""The runner core shared by grid sweeps (:mod:`isosweep.run.grid`) and HPO studies (:mod:`isosweep.run.hpo`).

    a study (grid or HPO) ─► its folder runs/sweeps/<sweep-id>/ and its MLflow server
                         ─► Ray Tune (one session: a local Ray, or the cluster at --address)
                              each Tune trial = tune_trial(TrialJob): continue (or create) its MLflow
                              child run, then train: in the Tune trial's own process (``in_process``,
                              one CPU worker; Tune reuses the process for the next trial) reporting
                              each eval to Tune, or a Ray Train TorchTrainer (``ray_train``) whose
                              rank 0 logs every eval and whose TuneReportCallback forwards them
                         ─► progress: on a terminal a live display (rich: a line per running trial, the
                            study's bar; Ray's own messages to <sweep-id>/ray.log), elsewhere a status line
                            every N s; either way a line per finished or failed trial

Resuming. A study's state is its trial directories (``runs/sweeps/<sweep-id>/trials/<key>``:
checkpoints and ``metrics.jsonl``) and its MLflow runs, not Tune's experiment snapshot: a
re-run of the same command skips trials whose metrics reach their last step, restarts the
others from their latest checkpoint (no eval point repeated or lost) and continues their
MLflow runs. That holds after Ctrl-C and after a killed driver alike.

Concurrency. In the Train V2 pattern a Tune trial only holds its driver's share (a fraction
of a CPU); its Ray Train workers and rollout actors ask for theirs when the trial starts (an
``in_process`` trial holds the driver's and the trainer's share itself: it is the worker). So
the number of trials Tune runs at once is set from the cluster's resources and one trial's
total (the hardware profile's driver + trainer + rollout actors): more would start trials
that then wait for workers that cannot be placed.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

import ray
import yaml
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, TaskID, TextColumn
from rich.progress import Progress as Bars
from rich.text import Text

from isosweep.run.lock import lock_study
from isosweep.spec.profiles import get_profile
from isosweep.spec.trial import TrialConfig, launcher_choice, resources_of, steps
from isosweep.spec.yamlio import ConfigError
from isosweep.track import runs
from isosweep.track.curves import without_counts
from isosweep.track.null import NullTracker
from isosweep.track.server import answers, ensure_server, revive
from isosweep.track.tags import OUT_TAG
from isosweep.trial.files import TrialDir
from isosweep.trial.job import WORKER_RESTARTS, in_process_threads, ray_init, run_in_process, run_torch_trainer

TRIALS = "trials"
RAY_LOG = "ray.log"
"""Where, in a study's folder, Ray's and Tune's own messages go while the live display is up."""
PLAIN_ENV = "ISOSWEEP_PLAIN"
"""``ISOSWEEP_PLAIN=1``: plain progress lines even on a terminal (as ``isosweep sweep --plain``)."""
REDRAW_S = 1.0
"""Seconds between two redraws of the live display between Tune's events (it reads the trials' ``steps.jsonl``)."""


def say(*args, **kwargs) -> None:
    """``print`` that flushes: progress lines reach a log file or a pipe as they happen, not when a buffer
    fills. A module-level function, so Tune can pickle what refers to it (a ``partial`` of ``print``
    cannot be pickled once Ray has swapped ``builtins.print`` in the driver)."""
    print(*args, flush=True, **kwargs)


def duration(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``3700`` -> ``1h01m``."""
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def trial_of(sweep_out: Path, key: str) -> TrialDir:
    """The directory of trial ``key`` of the study whose folder is ``sweep_out``."""
    return TrialDir(Path(sweep_out) / TRIALS / key)


def is_finished(trial: TrialDir, cfg: TrialConfig) -> bool:
    """Whether the trial has evaluated at its last step."""
    return trial.is_finished(steps(cfg))


@dataclass(frozen=True)
class TrialJob:
    """Everything one Tune trial needs to run one trial of a study (grid point or HPO suggestion)."""

    key: str
    """The trial's name in its study (``n8-Bp16``, ``t003-tiny-1m-4096``): its folder and MLflow run."""
    config_key: str
    """Its configuration without the seed or budget: trials that share it are the same config."""
    cfg: TrialConfig
    out: str
    """The trial's directory."""
    sweep_id: str
    parent_run_id: str
    tracking_uri: str
    tags: dict[str, str] = field(default_factory=dict)
    """Extra tags of the child run (an HPO trial's fidelity and promotion)."""

    def to_tune(self) -> dict[str, Any]:
        """The job as Tune's trial config (plain data: Tune stores it with the experiment)."""
        return {**asdict(self), "cfg": self.cfg.model_dump(mode="json")}

    @classmethod
    def from_tune(cls, config: dict[str, Any]) -> TrialJob:
        return cls(**{**config, "cfg": TrialConfig.model_validate(config["cfg"])})

    @property
    def trial(self) -> TrialDir:
        return TrialDir(self.out)


def job_key(trial) -> str:
    """The key of a Tune trial's job (Tune callbacks see Tune's trial objects)."""
    return trial.config["trial"]["key"]


def tune_trial(config: dict) -> None:
    """The Tune function of one trial: continue its MLflow run, then train -- in this process (``in_process``)
    or as a Ray Train job (``ray_train``; :func:`isosweep.spec.trial.launcher_choice`).

    A trial that already reached its last step (an earlier run of the study) only catches its
    MLflow run up and reports its last record: nothing is trained again. If MLflow does not answer
    when the trial starts, the trial trains without its run (its files keep everything) and the
    study's driver creates and catches up the run later.
    """
    job = TrialJob.from_tune(config["trial"])
    trial = job.trial
    trial.path.mkdir(parents=True, exist_ok=True)

    def ended() -> bool:  # finished, or stopped early by an HPO study
        return is_finished(trial, job.cfg) or trial.stop_requested()

    client = runs.client(job.tracking_uri)
    try:
        if not answers(job.tracking_uri):  # at once, not after the MLflow client's minutes of retries
            raise OSError(f"no answer at {job.tracking_uri}/health")
        run_id = runs.open_child(client, job.parent_run_id, job.sweep_id, job.key, job.cfg, job.config_key)
        for name, value in job.tags.items():
            client.set_tag(run_id, name, value)
        tracker = runs.MlflowTracker(job.tracking_uri, run_id)
    except runs.UNANSWERED as err:  # an MLflow server that does not answer, after the client's retries
        # MLflow down when the trial starts fails no training: the trial runs on its files alone, and the
        # driver creates its run and catches it up once MLflow answers (end of this study, or its next run)
        with open(trial.log_file, "a") as f:
            f.write(f"[mlflow] {job.tracking_uri} did not answer when the trial started ({type(err).__name__}: "
                    f"{str(err)[:200]}); training goes on, its records are kept in {trial.path} and logged when "
                    "MLflow answers\n")
        tracker = NullTracker()
    logger = tracker.trial_logger(trial, job.cfg.eval.k)
    logger.catch_up()

    if ended():
        records = trial.records()
        tune.report({**without_counts(records[-1] if records else {}), "isosweep/skipped": 1})
        logger.finish("FINISHED")
        return
    try:
        if launcher_choice(job.cfg)[0] == "in_process":
            run_in_process(job.cfg, trial.path, tracker=tracker, report=tune.report, threads=in_process_threads(job.cfg))
        else:
            run_torch_trainer(job.cfg, trial.path, tracker=tracker, callbacks=[TuneReportCallback()], name=job.key)
    except BaseException as err:
        if ended():
            # Tune ended this function after the trial's last report or after an early stop (an HPO
            # study): its Ray Train job, if it had one, went down with it, as it should
            logger.catch_up()
            logger.finish("FINISHED")
            if isinstance(err, SystemExit):
                # Tune's way of ending a trial's thread (raised in its report): swallowed, the thread would
                # go on to Tune's closing report and wait there for ever, and a reused trial process
                # (in_process trials) would never take its next trial
                raise
            return
        logger.finish("FAILED", reason=f"{type(err).__name__}: {err}")
        raise
    logger.catch_up()
    logger.finish("FINISHED")


def _tune_function(config: dict) -> None:
    """What Tune runs: :func:`tune_trial` under the name Tune shows."""
    tune_trial(config)


_tune_function.__name__ = "isosweep_trial"


def tune_resources(config: dict) -> dict[str, float]:
    """What a Tune trial of ``config`` (a :meth:`TrialJob.to_tune` under ``"trial"``) reserves itself: its
    driver's share, and for an ``in_process`` trial the trainer's too (it trains in the trial's process).
    Ray Train workers and rollout actors reserve their own when they start."""
    cfg = TrialConfig.model_validate(config["trial"]["cfg"])
    profile = get_profile(cfg.profile)
    parts = [profile.driver] + ([profile.trainer] if launcher_choice(cfg)[0] == "in_process" else [])
    return {kind: sum(getattr(p, kind) for p in parts) for kind in ("CPU", "GPU")}


def max_concurrency(cfgs: list[TrialConfig], cluster: dict[str, float], source: str | Path,
                    limit: int | None = None) -> int:
    """How many of these trials fit at once on ``cluster`` (``ray.cluster_resources()``), at most ``limit``
    (default: their number), or a ConfigError if not even one does."""
    need = {"CPU": 0.0, "GPU": 0.0}
    for cfg in cfgs:
        for kind, amount in resources_of(cfg).items():
            need[kind] = max(need[kind], amount)
    fits = [math.floor(cluster.get(kind, 0.0) / amount + 1e-9) for kind, amount in need.items() if amount > 0]
    concurrency = min(fits) if fits else len(cfgs)
    if concurrency < 1:
        raise ConfigError(
            f"{source}: one trial needs {need['CPU']:g} CPU and {need['GPU']:g} GPU (profile "
            f"{cfgs[0].profile!r}: driver + trainer + rollout actors) but the Ray cluster has "
            f"{cluster.get('CPU', 0):g} CPU and {cluster.get('GPU', 0):g} GPU; choose a smaller profile or a bigger cluster")
    return min(concurrency, len(cfgs) if limit is None else limit)


BOOTSTRAP_CONFIG = Path.home() / "ray_bootstrap_config.yaml"
"""Where ``ray up`` leaves the cluster's autoscaler config on the head node (the driver of a submitted sweep)."""


def autoscaler_capacity(path: Path = BOOTSTRAP_CONFIG) -> dict[str, float]:
    """The resources an autoscaling cluster reaches with every node type at its ``max_workers`` (capped by the
    cluster's ``max_workers``), from its autoscaler config; empty where there is none (a local Ray, a
    fixed cluster). ``ray up`` clusters start with no GPU workers (``min_workers: 0``): sized by what is up
    when it starts, a sweep would find no room for one trial, where the autoscaler would have added nodes."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    total: dict[str, float] = {}
    cap = config.get("max_workers")
    for name, node in (config.get("available_node_types") or {}).items():
        count = 1 if name == config.get("head_node_type") else node.get("max_workers", 0)
        count = min(count, cap) if cap is not None and name != config.get("head_node_type") else count
        for kind, amount in (node.get("resources") or {}).items():
            total[kind] = total.get(kind, 0.0) + float(amount) * count
    return total


@contextmanager
def ray_session(address: str | None) -> Iterator[dict[str, float]]:
    """Ray for the length of a study: joins ``address`` or starts a local Ray (shut down at the end,
    if this call started it); yields the cluster's resources -- on an autoscaling cluster, what it reaches
    at full size (:func:`autoscaler_capacity`): trials wait for the nodes the autoscaler adds for them."""
    started = ray_init(address, log_to_driver=False)
    try:
        resources = dict(ray.cluster_resources())
        if address is not None:
            for kind, amount in autoscaler_capacity().items():
                resources[kind] = max(resources.get(kind, 0.0), amount)
        yield resources
    finally:
        if started:
            ray.shutdown()


def open_study(sweep_id: str, runs_root: str | Path, log: Callable[[str], None]) -> tuple[Path, str]:
    """The study's folder (created, its driver lock taken: see :func:`lock_study`) and the tracking URI (a
    local MLflow server started if needed). Refused, before any folder is made, when the sweep's MLflow
    parent run says its trials were written to another runs folder."""
    uri = ensure_server(log)  # a bad port or a foreign server stops the study before any folder is made
    sweep_out = (Path(runs_root) / sweep_id).resolve()
    parent = runs.find_parent(runs.client(uri), sweep_id)
    first = parent.data.tags.get(OUT_TAG) if parent is not None else None
    if first and Path(first).resolve() != sweep_out:
        raise ConfigError(f"{sweep_id} was run with its trials in {first} (tag {OUT_TAG} of its MLflow parent run), "
                          f"not {sweep_out}: run it again with --runs {Path(first).parent} to resume it there (or give "
                          "the sweep another name to start a new one)")
    sweep_out.mkdir(parents=True, exist_ok=True)
    lock_study(sweep_out, sweep_id)
    return sweep_out, uri


@dataclass(frozen=True)
class StudyStanding:
    """Where a whole study stands: what its status line and the live display's bar say."""

    done: float
    """Compute done, in ``unit`` (an int for a grid's rollouts)."""
    total: float
    unit: str
    """``rollouts`` (a grid), ``target-eq. rollouts`` (an HPO study's budget)."""
    rate: float | None
    """``unit`` per second this driver has done; None where no pace is estimated (an HPO study)."""
    left_s: float | None
    """The estimate of the time left; None until it settles."""
    trials: str
    """``1/2 trials done, 1 running, 0 failed``."""
    best: str
    """The best evaluation so far: ``best eval/mean@4 0.600 (n8-Bp8)``, ``no eval yet``."""

    def time_left(self) -> str:
        return f"~{duration(self.left_s)} left" if self.left_s is not None else "estimating time left"


@dataclass(frozen=True)
class TrialStanding:
    """Where one running trial stands: a line of the live display."""

    key: str
    rollouts: int
    """Rollouts trained so far (its ``steps.jsonl`` between evaluations)."""
    budget: int
    """Its budget, in rollouts."""
    value: str
    """Its last evaluation, ``mean@4 0.412`` (``no eval yet`` before the first)."""


class ProgressState(Protocol):
    """What a runner tells the progress callback: where the study and its trials stand, and the events that
    change it."""

    def result(self, key: str, result: dict) -> None: ...

    def complete(self, key: str) -> str | None:
        """Note trial ``key`` as finished; a line to log for it, if any."""

    def standing(self, running: int, failed: int, elapsed_s: float) -> StudyStanding:
        """Where the study stands (reading the unfinished trials' ``steps.jsonl``)."""

    def trial(self, key: str) -> TrialStanding:
        """Where running trial ``key`` stands, as of the last :meth:`standing`."""

    def status(self, running: int, failed: int, elapsed_s: float) -> str:
        """The plain status line."""


def live_wanted(stream: TextIO | None = None) -> bool:
    """Whether a study asked for the live display draws it: ``stream`` (stdout) is a terminal other than
    ``TERM=dumb``, and ``ISOSWEEP_PLAIN`` is unset (or ``0``). A pipe, CI or a log file gets the plain lines,
    which scripts and tests read."""
    stream = sys.stdout if stream is None else stream
    return (os.environ.get(PLAIN_ENV, "") in ("", "0") and getattr(stream, "isatty", lambda: False)()
            and os.environ.get("TERM") != "dumb")


@contextmanager
def ray_messages_to(path: Path) -> Iterator[None]:
    """Ray's and Tune's own messages go to ``path`` for the length of the block, not between the live display's
    redraws: the console handlers of the ``ray`` loggers (Ray's start and shutdown, Tune's and Train's notices and
    warnings) are swapped for the file, and Tune's console reporter is its legacy one, which prints nothing at
    ``verbose=0`` (the current one prints its tables and a TensorBoard hint at any verbosity; the results are in
    the study's ``tune/`` folder all the same). Workers' lines never reach the driver (``log_to_driver=False``)."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    swapped = {}
    loggers = [logging.getLogger("ray")] + [logger for name, logger in list(logging.root.manager.loggerDict.items())
                                            if name.startswith("ray.") and isinstance(logger, logging.Logger)]
    for logger in loggers:
        consoles = [h for h in logger.handlers
                    if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
        if consoles or logger.name == "ray":
            swapped[logger] = list(logger.handlers)
            logger.handlers = [h for h in logger.handlers if h not in consoles] + [handler]
    engine = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # read by Tune's driver alone (a local Ray's workers inherit it unread)
    try:
        yield
    finally:
        for logger, handlers in swapped.items():
            logger.handlers = handlers
        if engine is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT", None)
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = engine
        handler.close()


class LiveView:
    """A study's live display (rich): the study's bar (compute done of its total, pace, time left), under it a line
    per running trial (its key, rollouts done of its budget, its last evaluation), and a line of trials and the
    best evaluation so far. What is printed while it is up (``say``, ``print``) appears above it."""

    def __init__(self, console: Console, name: str) -> None:
        self.bars = Bars(TextColumn("{task.description}"), BarColumn(bar_width=30),
                         TextColumn("{task.fields[amount]}", justify="right"), TextColumn("{task.fields[info]}"),
                         console=console, auto_refresh=False)
        self.study = self.bars.add_task(name, total=1, amount="", info="")
        self.rows: dict[str, TaskID] = {}
        self.summary = Text("")
        # redrawn by the Tune callback (at its events, and every REDRAW_S between them), not by a thread of its own
        self.live = Live(self, console=console, auto_refresh=False, redirect_stdout=True, redirect_stderr=True)

    def __rich__(self) -> Group:
        return Group(self.bars, self.summary)

    def show(self, study: StudyStanding, trials: list[TrialStanding], elapsed_s: float) -> None:
        keys = {t.key for t in trials}
        for key in [k for k in self.rows if k not in keys]:
            self.bars.remove_task(self.rows.pop(key))
        for t in trials:
            if t.key not in self.rows:
                self.rows[t.key] = self.bars.add_task(f"  {t.key}", total=max(t.budget, 1), amount="", info="")
            self.bars.update(self.rows[t.key], completed=t.rollouts, amount=f"{t.rollouts:,}/{t.budget:,} rollouts",
                             info=t.value)
        pace = "" if study.rate is None else f"{study.rate:,.1f}/s" + (
            f", {study.time_left()}" if study.done < study.total else "")
        self.bars.update(self.study, total=max(study.total, 1), completed=study.done,
                         amount=f"{study.done:,.0f}/{study.total:,.0f} {study.unit}", info=pace)
        self.summary = Text(f"{study.trials} | {study.best} | elapsed {duration(elapsed_s)}")
        self.live.refresh()


class Progress(tune.Callback):
    """A line per finished or failed trial, and where the study stands: for any study, on a terminal (``live``) a
    live display redrawn at each event and every :data:`REDRAW_S` (shown for the length of :meth:`shown`),
    elsewhere a status line every ``every_s`` seconds."""

    def __init__(self, state: ProgressState, sweep_out: Path, log: Callable[[str], None], every_s: float,
                 prefix: str, uri: str | None = None, live: bool = False) -> None:
        """``uri``: the study's MLflow; every ``every_s`` a local server that stopped is restarted."""
        self.state, self.sweep_out, self.log, self.every_s, self.prefix = state, sweep_out, log, every_s, prefix
        self.uri, self.live = uri, live
        self.start, self.last, self.drawn = time.monotonic(), 0.0, 0.0
        self.redraw_s = REDRAW_S
        self.ended: set[str] = set()
        self.failed: set[str] = set()
        self.view: LiveView | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What Tune pickles with the experiment: everything but the live display (a terminal's)."""
        return {**self.__dict__, "view": None}

    @contextmanager
    def shown(self, console: Console | None = None) -> Iterator[None]:
        """The live display for the length of the block where ``live`` (on ``console``, default stdout's), with
        Ray's and Tune's own messages in ``<study folder>/ray.log`` meanwhile (:func:`ray_messages_to`); plain
        lines otherwise, as they always were."""
        if not self.live:
            yield
            return
        path = Path(self.sweep_out) / RAY_LOG
        self.log(f"[{self.prefix}] Ray's and Tune's own messages go to {path} while the live display is up")
        view = LiveView(console or Console(), self.prefix)
        with ray_messages_to(path), view.live:
            self.view = view
            try:
                self._draw([])
                yield
            finally:
                self.view = None

    def _running(self, trials) -> list[str]:
        return [job_key(t) for t in trials if t.status == "RUNNING" and job_key(t) not in self.ended]

    def _status(self, trials) -> str:
        return self.state.status(len(self._running(trials)), len(self.failed), time.monotonic() - self.start)

    def _draw(self, trials) -> None:
        running, elapsed = self._running(trials), time.monotonic() - self.start
        study = self.state.standing(len(running), len(self.failed), elapsed)  # first: it reads the trials' files
        self.view.show(study, [self.state.trial(key) for key in running], elapsed)
        self.drawn = time.monotonic()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.state.result(job_key(trial), result)
        if self.view is not None:
            self._draw(trials)

    def on_trial_complete(self, iteration, trials, trial, **info):
        key = job_key(trial)
        self.ended.add(key)
        line = self.state.complete(key)
        if line:
            self.log(line)
            if self.view is None:
                self.log(self._status(trials))
        if self.view is not None:
            self._draw(trials)

    def on_trial_error(self, iteration, trials, trial, **info):
        key = job_key(trial)
        self.ended.add(key)
        self.failed.add(key)
        self.log(f"[{self.prefix}] trial {key} FAILED (its checkpoints and MLflow run are kept; re-run to retry): "
                 f"see {trial_of(self.sweep_out, key).log_file} and {trial.local_path}")
        if self.view is not None:
            self._draw(trials)

    def on_step_end(self, iteration, trials, **info):
        now = time.monotonic()
        if self.view is not None and now - self.drawn >= self.redraw_s:
            self._draw(trials)
        if now - self.last >= self.every_s:
            self.last = now
            if self.view is None:
                self.log(self._status(trials))
            if self.uri:
                revive(self.uri, self.log)


def check_problem_sets(cfgs: list[TrialConfig], source: str | Path, log: Callable[[str], None]) -> None:
    """Before a study writes anything (folder, MLflow run) or starts Ray: every trial's easy or hard set holds at
    least ``Bp`` train problems and one eval problem, or a :class:`ConfigError` naming the sweep file (inside a
    trial the same error would be a trial failure, retried by Tune). Tiny base models are built (or found cached) here, once, rather than by the
    first trials at once; a real model's pass rates are measured by its trials, so its sets are checked there."""
    from isosweep.models.sizes import SIZES  # no torch
    from isosweep.models.warmup import resolve_model  # torch, transformers
    from isosweep.trial.loop import problem_sets  # torch, DeepSpeed

    largest: dict[tuple, TrialConfig] = {}
    for cfg in cfgs:
        if cfg.model.name in SIZES:
            key = (cfg.model.name, cfg.model.warmup_seed, cfg.task.name, tuple(cfg.task.levels), cfg.task.difficulty)
            if key not in largest or cfg.Bp > largest[key].Bp:
                largest[key] = cfg
    for (name, seed, task, _, _), cfg in largest.items():
        path = resolve_model(name, task, seed)
        try:
            problem_sets(cfg, path, engine=None)  # the probe is on disk beside a tiny model: no engine needed
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
    if largest:
        log(f"[sweep] problem sets checked for {len(largest)} base model / task / band combination(s)")


@dataclass(frozen=True)
class TrialsOutcome:
    """How a study's run of Tune ended (:func:`run_trials`), what its driver decides the study's state from.

    ``interrupted``: Tune was stopped (Ctrl-C) before it had ended every trial; ``failed``: the keys of the
    trials that ended in an error after their retries (sorted). A trial stopped early by an HPO study's rules
    ended: it is neither. Neither field says whether a trial reached its last step: the trial folders do
    (:func:`is_finished`), and a study with unfinished trials that was not interrupted ended short because
    of its failures."""

    interrupted: bool
    failed: tuple[str, ...] = ()


def trials_outcome(made: int, ended: int, failed: Iterable[str], expected: int | None = None) -> TrialsOutcome:
    """The outcome of a Tune run that made ``made`` trials (its ``ResultGrid``'s length), of which ``ended``
    completed or failed (as Tune's callbacks told them: :class:`Progress`), ``failed`` (their keys) in error.

    Tune returns from a Ctrl-C as from a finished run, and marks the trials it stops then ``TERMINATED`` like
    completed ones: the trials that never ended are what tell an interrupted run. ``expected``: how many trials
    the run makes in all, where that is known before it starts (a grid's points), so that a Ctrl-C between one
    trial's end and the next one's start counts too.

    >>> trials_outcome(made=2, ended=1, failed=[])
    TrialsOutcome(interrupted=True, failed=())
    >>> trials_outcome(made=3, ended=3, failed=["b", "a"], expected=4)
    TrialsOutcome(interrupted=True, failed=('a', 'b'))
    """
    return TrialsOutcome(interrupted=ended < made or (expected is not None and made < expected),
                         failed=tuple(sorted(failed)))


def run_trials(sweep_out: Path, cfgs: list[TrialConfig], source: str | Path, address: str | None,
               progress: Progress, log: Callable[[str], None], prefix: str, limit: int | None = None,
               param_space: dict | None = None, stop=None, expected: int | None = None,
               **tune_config) -> TrialsOutcome:
    """Run a study's trials on Ray Tune; returns how it ended (:class:`TrialsOutcome`: interrupted, failed trials).

    ``cfgs`` are the trials that size the concurrency (the largest of them decides); each trial
    reserves what :func:`tune_resources` says and is named by its key; each run of the same study
    is a new Tune experiment ``attempt-N`` under ``sweep_out/tune``. ``tune_config`` adds
    ``TuneConfig`` arguments (an HPO study's searcher and scheduler). ``expected``: how many trials the run
    makes in all, where that is known before (a grid's points; see :func:`trials_outcome`).

    With ``in_process`` trials Tune reuses a finished trial's process for the next (``reuse_actors``): the
    imports of torch, transformers and DeepSpeed are paid once per process, not once per trial. Such a trial
    has no Ray Train job to restart a dead worker, so Tune retries it instead, as often as Ray Train would
    (:data:`WORKER_RESTARTS`) plus the one retry every trial gets; each retry resumes from its checkpoint.
    """
    try:
        with progress.shown(), ray_session(address) as cluster:
            concurrency = max_concurrency(cfgs, cluster, source, limit=limit)
            in_process = all(launcher_choice(cfg)[0] == "in_process" for cfg in cfgs)
            log(f"[{prefix}] {concurrency} at a time (each trial: {resources_of(cfgs[0])} of Ray's "
                f"{cluster.get('CPU', 0):g} CPU; trainer {launcher_choice(cfgs[0])[0]})")
            tune_dir = sweep_out / "tune"
            attempt = len(list(tune_dir.glob("attempt-*"))) if tune_dir.exists() else 0
            tuner = tune.Tuner(
                tune.with_resources(_tune_function, tune_resources),
                param_space=param_space,
                tune_config=tune.TuneConfig(
                    max_concurrent_trials=concurrency, trial_name_creator=job_key, trial_dirname_creator=job_key,
                    reuse_actors=in_process, **tune_config),
                run_config=tune.RunConfig(
                    name=f"attempt-{attempt}", storage_path=str(tune_dir), verbose=0, stop=stop, callbacks=[progress],
                    failure_config=tune.FailureConfig(max_failures=1 + (WORKER_RESTARTS if in_process else 0))),
            )
            results = tuner.fit()  # on a Ctrl-C Tune stops its trials and returns
            return trials_outcome(len(results), len(progress.ended), progress.failed, expected)
    except KeyboardInterrupt:  # a second Ctrl-C, while Tune was stopping
        return TrialsOutcome(interrupted=True, failed=tuple(sorted(progress.failed)))
