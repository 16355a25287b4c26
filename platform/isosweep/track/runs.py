"""MLflow: the local tracking server, a sweep's parent run, each trial's child run, batched logging.

Layout in MLflow: one experiment (``isosweep``); a sweep is a parent run tagged
``isosweep.sweep_id``; each trial is a child run (``mlflow.parentRunId``) tagged
``isosweep.trial``, whose params are the trial's full config (dotted keys). Every metric is
logged with ``step`` = rollouts consumed, so MLflow's charts overlay configs on one compute
axis: eval metrics (``eval/*``, ``system/*``; ``@`` spelled ``_at_``, e.g. ``eval/mean_at_4``,
as MLflow refuses ``@`` in names) at each evaluation, per-step training statistics
(``train/*``, ``rollout/*``, ``mismatch/*``, ``ais/*``, ``time/*``) in batches at each
evaluation. A checkpoint that breaks the trial's record is a logged model of its run (the Hugging Face
folder: :func:`log_record_model`); a finished sweep's frontier winners are versions of one registered
model per sweep (:func:`register_frontier`).

The tags' names are the constants of :mod:`isosweep.track.tags`. The experiment is a training experiment
(:data:`~isosweep.track.tags.TRAINING_KIND`); MLflow 3.17's UI still opens every
experiment on its GenAI pages unless the browser asked for model training, so the UI's address is
:func:`experiment_url` (and a run's, :func:`run_url`), which asks for it; MLflow's own run links are turned off
(:data:`QUIET_URLS`).

Runs are found again by their tags, so a resumed sweep continues its runs instead of
creating new ones, and a trial's logger starts after the last step already in MLflow (the
trial's ``metrics.jsonl``/``steps.jsonl`` are the source of truth; MLflow is caught up to them).

This is the only module of isosweep that imports mlflow. The local server is
:mod:`isosweep.track.server`; the null tracker (no MLflow) is :mod:`isosweep.track.null`.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from isosweep.spec.trial import entropy_coef, kl_coef, learning_rate, steps
from isosweep.spec.yamlio import flatten
from isosweep.track.curves import (
    COUNTS_ARTIFACT,
    COUNTS_KEY,
    EVAL_SET_KEY,
    SAMPLES_KEY,
    ZERO_SIGNAL_KEYS,
    Curve,
    SweepData,
    ZeroSignalCheck,
    zero_signal_of,
)
from isosweep.track.server import EXPERIMENT
from isosweep.track.tags import (
    BEST_CONFIG_AT_BUDGET_TAG,
    BEST_ROLLOUTS_TAG,
    BEST_TARGET_TAG,
    BUDGET_TAG,
    C_TAG,
    CONFIG_TAG,
    DIFFICULTY_TAG,
    ERROR_TAG,
    EXPERIMENT_KIND_TAG,
    EXTRAPOLATED_TAG,
    HPO_COST_TAG,
    HPO_REACHED_TAG,
    HPO_STUDY,
    METRIC_TAG,
    N_STAR_SATURATION_TAG,
    N_STAR_VERDICT_TAG,
    NOTE_TAG,
    OUT_TAG,
    P_BEST_TAG,
    PARENT_RUN_TAG,
    RECOMMENDATION_KIND,
    RECOMMENDED_TAG,
    RECORD_CHECKPOINT_TAG,
    RECORD_KIND,
    RECORD_VALUE_TAG,
    RECORDS_TAG,
    ROLLOUTS_TAG,
    RUN_KIND_TAG,
    RUN_NAME_TAG,
    STEP_TAG,
    STOP_DETAIL_TAG,
    STOP_REASON_TAG,
    STUDY_TAG,
    SWEEP_KIND,
    SWEEP_TAG,
    SWEEPS_TAG,
    TIE_TAG,
    TRAINING_KIND,
    TRIAL_KIND,
    TRIAL_TAG,
    VALUE_TAG,
    best_value_tag,
)

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # one bar per trial's counts read back

UNANSWERED = (MlflowException, OSError)
"""What the MLflow client raises when its server does not answer, after its retries (requests' errors are
``OSError`` s): the one place callers outside this module learn it, so they need not import mlflow."""
RECORD_FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                "tokenizer_config.json", "special_tokens_map.json")
"""What a record checkpoint logs to MLflow: the model and tokenizer, not the optimizer state (a sharded
model's shards and index too: :func:`record_files`)."""
def record_files(folder: Path) -> list[Path]:
    """What a record checkpoint logs from ``folder``: the model's weights -- ``model.safetensors``, or every
    shard ``model-0000k-of-0000n.safetensors`` with its ``model.safetensors.index.json`` as
    ``save_pretrained`` writes a large model -- and the config and tokenizer files of :data:`RECORD_FILES`;
    never the optimizer or trainer state."""
    if not folder.is_dir():
        return []
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    index = folder / "model.safetensors.index.json"
    named = [folder / name for name in RECORD_FILES if (folder / name).exists()]
    return named + shards + ([index] if index.exists() else [])


STEP_PREFIXES = ("train/", "rollout/", "mismatch/", "ais/", "time/")
EVAL_PREFIXES = ("eval/", "watch/", "system/", "time/eval_s", "check/")
"""What an eval record logs to MLflow at its step (its rollouts): the eval metrics, those of the watched sets
(``eval.watch``), the system figures, the evaluation's seconds and the step-0 zero-signal check
(:data:`~isosweep.track.curves.ZERO_SIGNAL_KEYS`).
The per-step statistics it averages (``train/``...) are logged from ``steps.jsonl`` at their own steps."""


def mlflow_name(key: str) -> str:
    """MLflow's name for a metric key: ``eval/mean@4`` -> ``eval/mean_at_4`` (MLflow refuses '@')."""
    return key.replace("@", "_at_")


QUIET_URLS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
"""MLflow's switch for the "View run ... at" and "View experiment at" lines it prints when a run ends: their links
open the GenAI pages in a browser that has not chosen "Model training". isosweep turns them off (unless the
environment sets the switch) and prints :func:`run_url` instead."""


def client(uri: str) -> MlflowClient:
    """A client of the tracking server at ``uri``; from here on, in this process, MLflow prints no run links of its
    own (:data:`QUIET_URLS`)."""
    os.environ.setdefault(QUIET_URLS, "true")
    return MlflowClient(tracking_uri=uri)


def experiment_id(mlflow_client) -> str:
    """The id of :data:`EXPERIMENT`, created as a training experiment (:data:`TRAINING_KIND`) if it does not
    exist; one created before (without a kind, or marked GenAI) is marked a training experiment."""
    found = mlflow_client.get_experiment_by_name(EXPERIMENT)
    if found is None:
        try:
            return mlflow_client.create_experiment(EXPERIMENT, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
        except MlflowException:  # created concurrently by another trial
            found = mlflow_client.get_experiment_by_name(EXPERIMENT)
    kind = found.tags.get(EXPERIMENT_KIND_TAG, "")
    if not kind or kind.startswith("genai"):  # another training kind (finetuning, ...) someone chose is left
        mlflow_client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    return found.experiment_id


def experiment_url(uri: str, mlflow_client) -> str:
    """The experiment's page in MLflow's UI, on its runs table: MLflow 3.17's UI shows an experiment's GenAI
    pages (traces) whatever its kind unless the browser chose "Model training" (its sidebar switch, kept per
    browser) or the address asks for it with ``workflowType=machine_learning``."""
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id(mlflow_client)}/runs?workflowType=machine_learning"


def run_url(uri: str, mlflow_client, run_id: str) -> str:
    """A run's page in MLflow's UI, in its training view (as :func:`experiment_url`): what a sweep prints at its
    end for its parent run, where the frontier plots are."""
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id(mlflow_client)}/runs/{run_id}?workflowType=machine_learning"


def _find(mlflow_client, filter_string: str):
    runs = mlflow_client.search_runs([experiment_id(mlflow_client)], filter_string=filter_string,
                                     order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def find_parent(mlflow_client, sweep_id: str, prefix: bool = False):
    """The parent run of ``sweep_id`` (or of the newest sweep whose id starts with it), or None."""
    op = "LIKE" if prefix else "="
    value = f"{sweep_id}%" if prefix else sweep_id
    return _find(mlflow_client, f"tags.`{SWEEP_TAG}` {op} '{value}' and tags.`{RUN_KIND_TAG}` = '{SWEEP_KIND}'")


def finished_grid_sweeps(mlflow_client) -> list:
    """The parent run of every finished grid sweep (not HPO studies), newest first."""
    return mlflow_client.search_runs(
        [experiment_id(mlflow_client)], order_by=["attributes.start_time DESC"], max_results=10_000,
        filter_string=f"tags.`{RUN_KIND_TAG}` = '{SWEEP_KIND}' and attributes.status = 'FINISHED' "
                      f"and tags.`{STUDY_TAG}` != '{HPO_STUDY}'")


def find_child(mlflow_client, sweep_id: str, key: str):
    """The child run of trial ``key`` in sweep ``sweep_id``, or None."""
    return _find(mlflow_client, f"tags.`{SWEEP_TAG}` = '{sweep_id}' and tags.`{TRIAL_TAG}` = '{key}'")


def open_parent(mlflow_client, sweep, out) -> str:
    """Find or create the sweep's parent run and mark it running; returns its run id."""
    spec = sweep.spec
    tags = {STUDY_TAG: spec.study, DIFFICULTY_TAG: sweep.trials[0].cfg.task.difficulty,
            OUT_TAG: str(out), METRIC_TAG: sweep.metric, NOTE_TAG: spec.description}
    params = {"sweep.file": str(sweep.path), "sweep.budget": sweep.budget, "sweep.trials": len(sweep.trials),
              **flatten(spec.model_dump(mode="json"), "spec.")}
    return open_study_parent(mlflow_client, sweep.sweep_id, tags, params)


def open_study_parent(mlflow_client, sweep_id: str, tags: dict[str, str], params: dict) -> str:
    """Find the parent run tagged ``sweep_id`` or create it with ``tags`` and ``params``; mark it running."""
    found = find_parent(mlflow_client, sweep_id)
    if found is not None:
        mlflow_client.update_run(found.info.run_id, status="RUNNING")
        return found.info.run_id
    tags = {SWEEP_TAG: sweep_id, RUN_KIND_TAG: SWEEP_KIND, RUN_NAME_TAG: sweep_id, **tags}
    run = mlflow_client.create_run(experiment_id(mlflow_client), tags=tags, run_name=sweep_id)
    _log_params(mlflow_client, run.info.run_id, params)
    return run.info.run_id


def _log_params(mlflow_client, run_id: str, params: dict) -> None:
    """One ``log_batch`` call (MLflow's client splits it into requests of at most 100 params)."""
    if params:
        mlflow_client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])


def trial_params(cfg) -> dict:
    """A trial run's params: the full trial config, flattened, and what follows from it (``derived.*``)."""
    return {**flatten(cfg.model_dump(mode="json")), "derived.M": steps(cfg), "derived.lr": learning_rate(cfg),
            "derived.kl_coef": kl_coef(cfg), "derived.entropy_coef": entropy_coef(cfg)}


def open_child(mlflow_client, parent_id: str, sweep_id: str, key: str, cfg, config_key: str) -> str:
    """Find or create a trial's child run (params = the full trial config); returns its run id. A run found
    without all its params (a crash between creating it and logging them) gets the missing ones."""
    params = trial_params(cfg)
    found = find_child(mlflow_client, sweep_id, key)
    if found is not None:
        mlflow_client.update_run(found.info.run_id, status="RUNNING")
        _log_params(mlflow_client, found.info.run_id, {k: v for k, v in params.items() if k not in found.data.params})
        return found.info.run_id
    tags = {PARENT_RUN_TAG: parent_id, SWEEP_TAG: sweep_id, TRIAL_TAG: key, RUN_KIND_TAG: TRIAL_KIND,
            CONFIG_TAG: config_key, DIFFICULTY_TAG: cfg.task.difficulty, RUN_NAME_TAG: key}
    run = mlflow_client.create_run(experiment_id(mlflow_client), tags=tags, run_name=key)
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

    def __init__(self, uri: str, run_id: str, trial, k: int, warn=print,
                 between_requests: Callable[[], None] | None = None):
        """``trial`` is the trial's :class:`isosweep.trial.files.TrialDir` (records, steps, checkpoints);
        ``warn`` gets one line when MLflow stops answering and one when it is caught up again;
        ``between_requests`` is called between two requests of one record's metrics (a test's kill point)."""
        self.client = client(uri)
        self.uri = uri
        self.run_id = run_id
        self.trial = trial
        self.k = k
        self.metric = f"eval/mean@{k}"
        self.warn = warn
        self.between_requests = between_requests
        self.behind = False
        """MLflow missed a call: the files hold what it lacks; the next :meth:`log` catches it up first."""
        self.best, self.steps_logged = float("-inf"), 0
        self.evals_logged: set[int] = set()
        """The rollouts of every eval record the run holds."""
        self._tolerant(self.refresh)

    @property
    def eval_logged(self) -> int:
        """The rollouts of the last eval record the run holds (-1: none)."""
        return max(self.evals_logged, default=-1)

    def _tolerant(self, call, *args, **kwargs) -> bool:
        """``call`` against MLflow; if the server does not answer (after the MLflow client's own retries) the
        trial goes on: warn once, mark the logger behind, return False. The trial's files stay the source of
        truth, so nothing is lost, only late."""
        try:
            call(*args, **kwargs)
            return True
        except UNANSWERED as err:
            if not self.behind:
                self.warn(f"[mlflow] {self.uri} did not answer ({type(err).__name__}: {str(err)[:200]}); training "
                          f"goes on, its records are kept in {self.trial.path} and logged when MLflow is back")
            self.behind = True
            return False

    def refresh(self) -> None:
        """Read what the run already holds (another process may have logged since)."""
        history = self.client.get_metric_history(self.run_id, mlflow_name(self.metric))
        self.evals_logged = {m.step for m in history}
        self.best = max((m.value for m in history), default=float("-inf"))
        steps = self.client.get_metric_history(self.run_id, "train/reward")
        self.steps_logged = max((m.step for m in steps), default=0)

    def catch_up(self) -> int:
        """Log the records and steps of the trial's files that the run lacks (record checkpoints too, where the
        trial still has them); returns how many records, or -1 if MLflow did not answer."""
        was_behind = self.behind
        self.behind = False
        if not self._tolerant(self.refresh):
            return -1
        # every record the run lacks, not only those after its last: a crash between a checkpoint and its record's
        # append puts the record back in the files on resume, after later ones were logged
        missing = [r for r in self.trial.records() if r["rollouts"] not in self.evals_logged]
        for record in missing:
            self.log(record)
            if self.behind:
                return -1
        if not self._tolerant(self._settle):
            return -1
        if was_behind:
            self.warn(f"[mlflow] {self.uri} answers again: {len(missing)} record(s) of {self.trial.path} caught up")
        return len(missing)

    def log(self, record: dict, checkpoint: bool = True) -> None:
        """Log ``record`` (and the steps before it); if MLflow missed earlier calls, catch it up first. Never
        raises for an MLflow that does not answer (see :meth:`_tolerant`)."""
        if self.behind:
            self.catch_up()  # logs ``record`` too once it is in the files
            return
        self._tolerant(self._log, record, checkpoint)

    def _log(self, record: dict, checkpoint: bool) -> None:
        if record["rollouts"] in self.evals_logged:
            return
        now = int(time.time() * 1000)
        step = int(record["rollouts"])
        metrics = []
        for row in self.trial.steps():
            if self.steps_logged < row["rollouts"] <= step:
                metrics.extend(Metric(mlflow_name(key), float(value), now, int(row["rollouts"])) for key, value in row.items()
                               if key.startswith(STEP_PREFIXES) and value is not None)
        # The record's eval metrics go last: refresh() reads the last logged eval as "done up to here", so a
        # record cut off between two batches is logged again whole rather than taken as done.
        metrics += [Metric(mlflow_name(key), float(value), now, step) for key, value in record.items()
                    if key.startswith(EVAL_PREFIXES) and value is not None]
        metrics.append(Metric("tokens", float(record["tokens"]), now, step))
        log_metrics(self.client, self.run_id, metrics, between=self.between_requests)
        if COUNTS_KEY in record:
            self._log_counts(max(step, self.eval_logged))
        self.steps_logged = max(self.steps_logged, step)
        self.evals_logged.add(step)
        value = record[self.metric]
        if value > self.best:
            self.best = value
            self._mark_best(record, checkpoint)

    def _mark_best(self, record: dict, checkpoint: bool = True) -> None:
        """``record`` is the run's best so far: its checkpoint logged (where the trial still has it), then the tags."""
        if checkpoint:
            self._log_record_checkpoint(record)
        self.client.set_tag(self.run_id, BEST_ROLLOUTS_TAG, str(int(record["rollouts"])))
        self.client.set_tag(self.run_id, best_value_tag(mlflow_name(self.metric.split('/')[1])),
                            f"{record[self.metric]:.4f}")

    def _settle(self) -> None:
        """After an outage or a crash: the counts artifact rewritten whole, and the best record marked (with its
        checkpoint) if the call that should have marked it was the one MLflow missed."""
        logged = [r for r in self.trial.records() if r["rollouts"] <= self.eval_logged]
        if not logged:
            return
        if any(COUNTS_KEY in r for r in logged):
            self._log_counts(self.eval_logged)
        top = max(logged, key=lambda r: r[self.metric])  # the first of equals, as log() marks them
        if self.client.get_run(self.run_id).data.tags.get(BEST_ROLLOUTS_TAG) != str(int(top["rollouts"])):
            self._mark_best(top)

    def _log_counts(self, up_to: int) -> None:
        """The per-problem correct counts of every evaluation so far, as the run's :data:`COUNTS_ARTIFACT`
        (rewritten whole at each evaluation: one small file per trial)."""
        self.client.log_text(self.run_id, json.dumps(counts_table(self.trial.records(), up_to)), COUNTS_ARTIFACT)

    def _log_record_checkpoint(self, record: dict) -> None:
        """``record``'s checkpoint as a logged model of the run (:func:`log_record_model`), named in the run's
        tags: :data:`~isosweep.track.tags.RECORD_CHECKPOINT_TAG` (its ``models:/`` URI) and
        :data:`~isosweep.track.tags.RECORDS_TAG` (the rollouts of every record logged)."""
        files = record_files(self.trial.checkpoint_at(record["step"]))
        if not files:
            return  # no checkpoint at this step (it was replaced before we got to it)
        model_id = log_record_model(self.client, self.run_id, files, record, self.metric)
        self.client.set_tag(self.run_id, RECORD_CHECKPOINT_TAG, f"models:/{model_id}")
        logged = [r for r in self.client.get_run(self.run_id).data.tags.get(RECORDS_TAG, "").split(",") if r]
        if str(int(record["rollouts"])) not in logged:
            self.client.set_tag(self.run_id, RECORDS_TAG, ",".join([*logged, str(int(record["rollouts"]))]))

    def finish(self, status: str, reason: str | None = None) -> None:
        """Mark the run ended (after catching it up if it is behind); an MLflow that does not answer leaves the
        run as it is, and the next run of the study catches it up and ends it."""
        if self.behind and self.catch_up() < 0:
            return
        if reason:
            self._tolerant(self.client.set_tag, self.run_id, ERROR_TAG, reason[:5000])
        self._tolerant(self.client.set_terminated, self.run_id, status=status)


MODEL_NAME_REFUSED = re.compile(r"[/:.%'\"]")
"""Characters MLflow refuses in a logged model's name (a tiny-0.3m trial's key holds a '.')."""


def record_model_name(trial_key: str, rollouts: int) -> str:
    """``<trial>-rollouts-NNNNNNNNN``, with the characters MLflow refuses in a model name as ``_``.

    >>> record_model_name("t002-tiny-0.3m-256", 128)
    't002-tiny-0_3m-256-rollouts-000000128'
    """
    return f"{MODEL_NAME_REFUSED.sub('_', trial_key)}-rollouts-{rollouts:09d}"


def log_record_model(mlflow_client, run_id: str, files: list[Path], record: dict, metric: str) -> str:
    """A record checkpoint (``files``: :func:`record_files` of its folder) as an MLflow logged model of the
    trial's run ``run_id``; returns its model id.

    The model holds the Hugging Face folder as ``save_pretrained`` wrote it (every shard and the index of a
    sharded model), no MLflow flavour: with ``MLFLOW_TRACKING_URI`` set to the server (MLflow resolves
    ``models:/`` URIs there, whatever ``tracking_uri`` is passed), load it with ``path =
    mlflow.artifacts.download_artifacts("models:/<model id>")`` then
    ``AutoModelForCausalLM.from_pretrained(path)`` (``AutoTokenizer`` likewise). It is named
    ``<trial>-rollouts-NNNNNNNNN`` (:func:`record_model_name`), tagged with the sweep, trial, config, rollouts, step and the record's
    ``metric`` value, and is an output of the run at step = rollouts (MLflow's run page lists it).

    A record is logged once: one already READY is found again by its run and rollouts and returned; one left
    PENDING (an upload cut off by an outage or a crash) has its files uploaded again and is finalized."""
    run = mlflow_client.get_run(run_id)
    rollouts = int(record["rollouts"])
    found = mlflow_client.search_logged_models(
        [run.info.experiment_id], max_results=1,
        filter_string=f"source_run_id = '{run_id}' AND tags.`{ROLLOUTS_TAG}` = '{rollouts}'")
    if found and found[0].status == LoggedModelStatus.READY:
        return found[0].model_id
    tags = run.data.tags
    model = found[0] if found else mlflow_client.create_logged_model(
        run.info.experiment_id, name=record_model_name(tags.get(TRIAL_TAG, "trial"), rollouts), source_run_id=run_id,
        params={k: v for k, v in run.data.params.items() if k in ("n", "Bp", "derived.M", "seed")},
        tags={SWEEP_TAG: tags.get(SWEEP_TAG, ""), TRIAL_TAG: tags.get(TRIAL_TAG, ""),
              CONFIG_TAG: tags.get(CONFIG_TAG, ""), RUN_KIND_TAG: RECORD_KIND,
              ROLLOUTS_TAG: str(rollouts), STEP_TAG: str(int(record["step"])),
              METRIC_TAG: metric, VALUE_TAG: repr(float(record[metric]))})
    if model.model_id not in {o.model_id for o in (run.outputs.model_outputs if run.outputs else [])}:
        mlflow_client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=rollouts)])
    for file in files:
        mlflow_client.log_model_artifact(model.model_id, str(file))
    mlflow_client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    return model.model_id


def settle_finished(mlflow_client, uri: str, parent_id: str, sweep_id: str, key: str, cfg, config_key: str, trial,
                    log=print) -> None:
    """A trial finished on disk: its child run caught up to its files and marked FINISHED, if it is not already,
    created first if it has none (MLflow was down when the trial started), and given the params it lacks (MLflow
    failed between creating the run and logging them, and the trial trained without it)."""
    found = find_child(mlflow_client, sweep_id, key)
    if found is not None and found.info.status == "FINISHED" and set(trial_params(cfg)) <= set(found.data.params):
        return
    run_id = open_child(mlflow_client, parent_id, sweep_id, key, cfg, config_key)
    logger = TrialLogger(uri, run_id, trial, cfg.eval.k, warn=log)
    if logger.catch_up() >= 0:
        logger.finish("FINISHED")


@dataclass(frozen=True)
class MlflowTracker:
    """Where a trial's records go in a sweep: its child run ``run_id`` on the server at ``uri``.

    Passed to the trial's Ray Train job (it pickles as two strings); rank 0 opens the logger."""

    uri: str
    run_id: str

    def trial_logger(self, trial, k: int, between_requests: Callable[[], None] | None = None) -> TrialLogger:
        return TrialLogger(self.uri, self.run_id, trial, k, between_requests=between_requests)


# ------------------------------------------------------------------------------- reading back


def counts_table(records: list[dict], up_to: float = math.inf) -> dict:
    """The counts of ``records`` (those that have them, at rollouts <= ``up_to``) as :data:`COUNTS_ARTIFACT` holds them."""
    kept = [r for r in records if COUNTS_KEY in r and r["rollouts"] <= up_to]
    return {"samples": kept[-1][SAMPLES_KEY] if kept else None, "eval_set": kept[-1][EVAL_SET_KEY] if kept else None,
            "rollouts": [r["rollouts"] for r in kept], "correct": [r[COUNTS_KEY] for r in kept]}


def attach_counts(curve: Curve, table: dict | None) -> Curve:
    """``curve`` with the counts of ``table`` (a :func:`counts_table`) where they cover every evaluation of
    the curve with one eval set; otherwise ``curve`` unchanged (its statistics then fall back to the values)."""
    if not table or not table.get("correct"):
        return curve
    by_rollouts = dict(zip(table["rollouts"], table["correct"]))
    if any(c not in by_rollouts for c in curve.compute) or len({len(v) for v in table["correct"]}) != 1:
        return curve
    curve.counts = np.asarray([by_rollouts[c] for c in curve.compute], dtype=float)
    curve.samples, curve.eval_set = int(table["samples"]), table["eval_set"]
    return curve


def _run_counts(mlflow_client, run_id: str) -> dict | None:
    """The run's :data:`COUNTS_ARTIFACT`, or None if it has none (a trial of an older isosweep)."""
    if not any(a.path == COUNTS_ARTIFACT for a in mlflow_client.list_artifacts(run_id)):
        return None
    with tempfile.TemporaryDirectory() as folder:
        return json.loads(Path(mlflow_client.download_artifacts(run_id, COUNTS_ARTIFACT, folder)).read_text())


def _run_zero_signal(mlflow_client, run_id: str) -> ZeroSignalCheck | None:
    """The run's step-0 zero-signal check (:data:`~isosweep.track.curves.ZERO_SIGNAL_KEYS`, logged with its first
    eval record after step 0), or None if it has none (a trial of an earlier isosweep: one request finds that)."""
    first = {}
    for key in ZERO_SIGNAL_KEYS:
        history = mlflow_client.get_metric_history(run_id, mlflow_name(key))
        if not history:
            return None
        first[key] = min(history, key=lambda m: m.step).value
    return zero_signal_of([first])


def read_curves(mlflow_client, sweep_id: str, k: int) -> list[Curve]:
    """Every child run of ``sweep_id`` as a :class:`Curve` (eval metrics at step = rollouts), with its counts
    (:data:`COUNTS_ARTIFACT`) and its zero-signal check where the run holds them."""
    found = mlflow_client.search_runs(
        [experiment_id(mlflow_client)],
        filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_id}' and tags.`{RUN_KIND_TAG}` = '{TRIAL_KIND}'",
        max_results=10_000)
    curves = []
    for run in sorted(found, key=lambda r: r.data.tags[TRIAL_TAG]):
        params = run.data.params
        values, compute = {}, None
        for name in ("mean", "best", "worst"):
            history = sorted(mlflow_client.get_metric_history(run.info.run_id, mlflow_name(f"eval/{name}@{k}")),
                             key=lambda m: m.step)
            if not history:
                break
            at = [m.step for m in history]
            if compute is None:
                compute = at
            elif at != compute:
                raise RuntimeError(f"run {run.info.run_id}: eval metrics logged at different steps")
            values[f"{name}@{k}"] = [m.value for m in history]
        if not values:
            continue
        curves.append(Curve(
            key=run.data.tags[TRIAL_TAG], config=run.data.tags[CONFIG_TAG],
            fields={"n": int(params["n"]), "Bp": int(params["Bp"]), "M": int(params["derived.M"]),
                    "seed": int(params["seed"])},
            compute=np.asarray(compute, dtype=float),
            values={name: np.asarray(v, dtype=float) for name, v in values.items()},
            zero_signal=_run_zero_signal(mlflow_client, run.info.run_id)))
        attach_counts(curves[-1], _run_counts(mlflow_client, run.info.run_id))
    return curves


def read_sweep(mlflow_client, parent) -> SweepData:
    """A finished sweep's parent run (from :func:`find_parent` or :func:`finished_grid_sweeps`) with its
    trials' curves and one trial's config, as :class:`SweepData`."""
    sweep_id = parent.data.tags[SWEEP_TAG]
    k = int(parent.data.tags[METRIC_TAG].split("@")[1])
    child = mlflow_client.search_runs(
        [experiment_id(mlflow_client)], max_results=1,
        filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_id}' and tags.`{RUN_KIND_TAG}` = '{TRIAL_KIND}'")
    return SweepData(sweep_id=sweep_id, budget=int(parent.data.params["sweep.budget"]),
                     trial_params=dict(child[0].data.params) if child else {},
                     sweep_params=dict(parent.data.params), curves=read_curves(mlflow_client, sweep_id, k))


BATCH_METRICS = 1000
"""The most metrics of one ``log_batch`` request (MLflow's limit; its client would split a longer list anywhere)."""


def log_metrics(mlflow_client, run_id: str, metrics: list[Metric], between: Callable[[], None] | None = None) -> None:
    """Log ``metrics`` in as few ``log_batch`` requests as MLflow takes, each ending at a change of step.

    A crash between two requests then leaves MLflow holding whole steps, a prefix of ``metrics`` in the order
    given: a trial's logger, which reads back the last step it holds, logs exactly the rest on resume (a split
    inside a step would lose or repeat part of it). A step with more than :data:`BATCH_METRICS` metrics is the
    only one split. ``between`` is called between two requests (a test's kill point)."""
    batches: list[list[Metric]] = [[]]
    for _, group in itertools.groupby(metrics, key=lambda m: m.step):
        group = list(group)
        for i in range(0, len(group), BATCH_METRICS):  # more than one piece only for a step over the limit
            piece = group[i:i + BATCH_METRICS]
            if len(batches[-1]) + len(piece) > BATCH_METRICS:
                batches.append([])
            batches[-1].extend(piece)
    batches = [b for b in batches if b]
    for n, batch in enumerate(batches):
        if n and between is not None:
            between()
        mlflow_client.log_batch(run_id, metrics=batch)


def log_frontier(mlflow_client, run_id: str, analysis) -> None:
    """A sweep's frontier (an :class:`isosweep.report.analysis.Analysis`) as metrics of its parent run
    (step = C), so MLflow charts it too, and its n* saturation and best config as tags."""
    now = int(time.time() * 1000)
    metrics = []
    for name, m in analysis.metrics.items():
        for row in m.rows:
            if row.config is None:
                continue
            step = int(row.C)
            metrics.append(Metric(mlflow_name(f"frontier/{name}"), row.value, now, step))
            if name == analysis.primary:
                metrics += [Metric("frontier/n_star", row.n, now, step), Metric("frontier/Bp_star", row.Bp, now, step)]
                if not math.isnan(row.p_best):
                    metrics.append(Metric("frontier/p_best", row.p_best, now, step))
    seen = {(m.key, m.step, m.value) for key in {m.key for m in metrics}
            for m in mlflow_client.get_metric_history(run_id, key)}
    log_metrics(mlflow_client, run_id, [m for m in metrics if (m.key, m.step, m.value) not in seen])  # `frontier` run again
    primary = analysis.metrics[analysis.primary]
    saturation = primary.saturation
    mlflow_client.set_tag(run_id, N_STAR_SATURATION_TAG,
                          "none shown" if saturation is None else
                          ("no fit" if math.isnan(saturation) else f"{saturation:.0f}"))
    if primary.verdict:
        mlflow_client.set_tag(run_id, N_STAR_VERDICT_TAG, primary.verdict[:5000])
    if primary.rows and primary.rows[-1].config:
        last = primary.rows[-1]
        mlflow_client.set_tag(run_id, BEST_CONFIG_AT_BUDGET_TAG,
                              f"tie: {last.config} ~ {last.runner_up}" if last.tie else last.config)


def registered_model_name(sweep_id: str) -> str:
    """The registered model holding a sweep's frontier winners."""
    return f"isosweep-{sweep_id}"


def sweep_records(mlflow_client, sweep_id: str) -> list[dict]:
    """Every READY record checkpoint (:func:`log_record_model`) of the sweep's trials, as dicts: ``model_id``,
    ``run_id``, ``trial``, ``config``, ``rollouts``, ``metric``, ``value``."""
    found, token, experiment = [], None, experiment_id(mlflow_client)
    while True:
        page = mlflow_client.search_logged_models(
            [experiment], page_token=token, max_results=1000,
            filter_string=f"tags.`{SWEEP_TAG}` = '{sweep_id}' AND tags.`{RUN_KIND_TAG}` = '{RECORD_KIND}'")
        found += [m for m in page if m.status == LoggedModelStatus.READY]
        token = page.token
        if not token:
            break
    return [{"model_id": m.model_id, "run_id": m.source_run_id, "trial": m.tags[TRIAL_TAG],
             "config": m.tags[CONFIG_TAG], "rollouts": int(m.tags[ROLLOUTS_TAG]),
             "metric": m.tags[METRIC_TAG], "value": float(m.tags[VALUE_TAG])} for m in found]


def frontier_checkpoint(records: list[dict], config: str, C: float) -> dict | None:
    """The record checkpoint that stands for the frontier's winner ``config`` at compute ``C`` (rollouts):
    of the config's records (:func:`sweep_records`, every seed) at rollouts <= C, the one of highest value
    (the earliest of equals); None if the config logged none by C.

    Why this one: the frontier's value at C is a fitted seed mean, which no single checkpoint produced. What
    that fit stands on is each seed's running best at C, and a trial's running best at C is its last record
    at or below C (a record is logged each time the running best improves). The best of those is the best
    model the winning config had actually produced within C rollouts: the one to take at C. (Records are
    broken on the trials' mean@k: for a frontier of best@k or worst@k this is still the best mean@k record.)"""
    mine = sorted((r for r in records if r["config"] == config and r["rollouts"] <= C),
                  key=lambda r: (r["rollouts"], r["trial"]))
    return max(mine, key=lambda r: r["value"], default=None)  # max() keeps the first of equals


def register_frontier(mlflow_client, sweep_id: str, analysis) -> list[dict]:
    """Each winner of the primary metric's frontier (``analysis``: an :class:`isosweep.report.analysis.Analysis`)
    as a version of the sweep's registered model (:func:`registered_model_name`): for each row with a winner,
    its :func:`frontier_checkpoint` at that C, tagged with C, config, metric, the frontier's value (and
    P(best), a tie), the trial, rollouts and the checkpoint's own value, and aliased ``c<C>`` (``budget`` too
    for the table's last row, C = the budget). So the best model at C is
    ``mlflow.artifacts.download_artifacts("models:/isosweep-<sweep id>@c<C>")`` (see :func:`log_record_model`
    for loading it).

    Run again (``isosweep frontier``, ``make report``) it adds no version: a C whose checkpoint is already
    registered keeps its version (a C whose pick changed gets a new one, and its alias moves to it). Returns
    one dict per registered row: ``C``, ``config``, ``version``, ``model_id``, ``trial``, ``rollouts``,
    ``aliases``, ``new`` (False if it was there); rows without a winner (no identified fit) or without a
    checkpoint (a sweep logged before records were models) are left out, and nothing at all is registered
    for a sweep with none."""
    name, metric = registered_model_name(sweep_id), f"eval/{analysis.primary}"
    records = sweep_records(mlflow_client, sweep_id)
    table = analysis.metrics[analysis.primary].rows
    rows = [row for row in table if row.config]
    picks = [(row, frontier_checkpoint(records, row.config, row.C)) for row in rows]
    picks = [(row, pick) for row, pick in picks if pick is not None]
    if not picks:
        return []
    try:
        mlflow_client.create_registered_model(
            name, tags={SWEEP_TAG: sweep_id, METRIC_TAG: metric},
            description=f"The frontier winners of sweep {sweep_id}: one version per compute C of its frontier table "
                        f"(tag {C_TAG}, alias c<C>; `budget` for the largest C), best {metric} checkpoint of the "
                        "winning config within C rollouts.")
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    # a version's source is the logged model's URI (its model_id field does not come back from the server)
    have = {(v.tags.get(C_TAG), v.source): v.version
            for v in mlflow_client.search_model_versions(f"name = '{name}'", max_results=10_000)}
    done = []
    for row, pick in picks:
        C = f"{row.C:.0f}"
        source = f"models:/{pick['model_id']}"
        version = have.get((C, source))
        if version is None:
            tags = {C_TAG: C, CONFIG_TAG: row.config, METRIC_TAG: metric, VALUE_TAG: f"{row.value:.4f}",
                    TRIAL_TAG: pick["trial"], ROLLOUTS_TAG: str(pick["rollouts"]),
                    RECORD_VALUE_TAG: f"{pick['value']:.4f}"}
            if not math.isnan(row.p_best):
                tags[P_BEST_TAG] = f"{row.p_best:.2f}"
            if row.tie:
                tags[TIE_TAG] = row.runner_up
            version = mlflow_client.create_model_version(
                name, source, run_id=pick["run_id"], model_id=pick["model_id"], tags=tags, await_creation_for=0,
                description=f"Best of sweep {sweep_id} at C = {row.C:,.0f} rollouts: {row.config} "
                            f"({metric} {row.value:.4f} on the frontier); checkpoint of trial {pick['trial']} "
                            f"at {pick['rollouts']:,} rollouts ({pick['metric']} {pick['value']:.4f}).").version
        aliases = [f"c{C}", *(["budget"] if row is table[-1] else [])]
        for alias in aliases:
            mlflow_client.set_registered_model_alias(name, alias, version)
        done.append({"C": row.C, "config": row.config, "version": str(version), "model_id": pick["model_id"],
                     "trial": pick["trial"], "rollouts": pick["rollouts"], "aliases": aliases,
                     "new": (C, source) not in have})
    return done


# ------------------------------------------------------------------------------- HPO studies


def close_hpo_trial(mlflow_client, uri: str, parent_id: str, sweep_id: str, cfg, config_key: str, tags: dict,
                    entry, reason: str | None, trial, k: int) -> None:
    """Tag a finished HPO trial's child run (stop reason, cost; ``entry`` is its
    :class:`isosweep.hpo.ledger.TrialEntry`) and close it, caught up to its files (``trial``) first:
    a stopped trial's function was ended before it could close its run itself. A trial that never
    opened its run (MLflow was down when it started) gets one here: ``cfg``, ``config_key`` and ``tags``
    (its fidelity and promotion) are what its trial function would have given it."""
    run = find_child(mlflow_client, sweep_id, entry.key)
    if run is None:
        run_id = open_child(mlflow_client, parent_id, sweep_id, entry.key, cfg, config_key)
        for name, value in tags.items():
            mlflow_client.set_tag(run_id, name, value)
        run = mlflow_client.get_run(run_id)
    stop = {STOP_REASON_TAG: entry.stop_reason, HPO_COST_TAG: f"{entry.cost:.1f}", HPO_REACHED_TAG: str(entry.reached)}
    if reason is not None:
        stop[STOP_DETAIL_TAG] = str(reason)[:5000]
    for name, value in stop.items():
        mlflow_client.set_tag(run.info.run_id, name, value)
    if run.info.status == "RUNNING":
        logger = TrialLogger(uri, run.info.run_id, trial, k)
        if logger.catch_up() < 0:
            raise OSError(f"MLflow at {uri} did not take the records of {entry.key}")
        mlflow_client.set_terminated(run.info.run_id, status="FAILED" if entry.status == "failed" else "FINISHED")


def log_hpo_progress(mlflow_client, parent_id: str, metric: str, entry, trajectory: list[dict]) -> None:
    """The study's spend, the finished trial's cost and value and the incumbent, on the parent run
    (step = spent compute, so MLflow charts the incumbent over spent compute)."""
    point = trajectory[-1]
    now, step = int(time.time() * 1000), int(round(point["spent"]))
    metrics = [Metric("hpo/spent", point["spent"], now, len(trajectory)), Metric("hpo/trial_cost", entry.cost, now, step)]
    if entry.value is not None:
        metrics.append(Metric(f"hpo/trial_{mlflow_name(metric)}", entry.value, now, step))
    if point["incumbent"] is not None:
        metrics.append(Metric("hpo/incumbent", point["incumbent"], now, step))
    if point["best_any"] is not None:
        metrics.append(Metric("hpo/best_any_size", point["best_any"], now, step))
    log_metrics(mlflow_client, parent_id, metrics)


def log_hpo_summary(mlflow_client, parent_id: str, result: dict, files: list) -> None:
    """A finished study's summary files under ``hpo/`` of its parent run, the recommendation and best as tags."""
    for path in files:
        mlflow_client.log_artifact(parent_id, str(path), artifact_path="hpo")
    if result["recommended"]:
        mlflow_client.set_tag(parent_id, RECOMMENDED_TAG, json.dumps(result["recommended"]))
    if result["best_target"]:
        best = result["best_target"]
        mlflow_client.set_tag(parent_id, BEST_TARGET_TAG, f"{best['value']:.4f} ({best['trial']})")


# ------------------------------------------------------------------------------- recommendations


def log_recommendation(mlflow_client, rec: dict, files: list[Path]) -> str:
    """A planner's recommendation (``Recommendation.to_json()``) as a run of the experiment: tagged with its
    budget, the sweeps it rests on and the allocation; the predicted value, interval and P(best) as metrics
    (step = C); ``files`` (the JSON, the interval plot, a suggested sweep) as artifacts. Returns the run id."""
    sweeps = ",".join(s["sweep_id"] for s in rec["sources"])
    tags = {RUN_KIND_TAG: RECOMMENDATION_KIND, BUDGET_TAG: f"{rec['C']:.0f}", SWEEPS_TAG: sweeps[:5000],
            METRIC_TAG: rec["metric"], RECOMMENDED_TAG: rec["config"] or "none",
            EXTRAPOLATED_TAG: str(rec["extrapolated"]).lower(), RUN_NAME_TAG: f"recommend-{rec['C']:.0f}",
            NOTE_TAG: "\n".join(rec["warnings"]) or "no warnings"}
    run = mlflow_client.create_run(experiment_id(mlflow_client), tags=tags, run_name=tags[RUN_NAME_TAG])
    run_id = run.info.run_id
    _log_params(mlflow_client, run_id, {"budget": f"{rec['C']:.0f}", "n": rec["n"], "Bp": rec["Bp"], "M": rec["M"],
                                        "metric": rec["metric"], "replicates": rec["replicates"]})
    now, step = int(time.time() * 1000), int(rec["C"])
    values = {"predicted": rec["value"], "predicted_low": rec["low"], "predicted_high": rec["high"],
              "p_best": rec["p_best"], "warnings": len(rec["warnings"])}
    log_metrics(mlflow_client, run_id, [Metric(f"recommend/{k}", float(v), now, step) for k, v in values.items()
                                        if v is not None and not math.isnan(float(v))])
    for path in files:
        mlflow_client.log_artifact(run_id, str(path))
    mlflow_client.set_terminated(run_id, status="FINISHED")
    return run_id

