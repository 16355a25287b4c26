"""The names of the MLflow tags isosweep writes and searches, one constant each (and the few tag values runs are
found by).

A tag name is part of the stored format: runs are found again by their tags (a resumed sweep continues its runs),
so a renamed constant strands every run logged before. ``platform/docs/mlflow.md`` lists them per run.

Plain strings only, no import: a module that must not load mlflow (a sweep's planner, the CLI) can name a tag.
"""

from __future__ import annotations

# ------------------------------------------------------------------------------- MLflow's own

PARENT_RUN_TAG = "mlflow.parentRunId"
"""A trial's child run: the run id of its sweep's (or HPO study's) parent run (MLflow nests the runs by it)."""
RUN_NAME_TAG = "mlflow.runName"
"""Every run isosweep makes: the name the UI shows (a sweep id, a trial key, ``recommend-<C>``)."""
NOTE_TAG = "mlflow.note.content"
"""A sweep's or study's parent run: its description; a recommendation run: its warnings."""
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""The ``isosweep`` experiment (an experiment tag): training or GenAI, which MLflow's UI opens it as."""
TRAINING_KIND = "custom_model_development"
"""The experiment kind MLflow's UI calls "Machine learning" (its other kind is ``genai_development``): the value its
experiment-kind selector writes to the :data:`EXPERIMENT_KIND_TAG` tag (mlflow/server/js, ``ExperimentKind``)."""

# ------------------------------------------------------------------------------- a sweep (parent run)

SWEEP_TAG = "isosweep.sweep_id"
"""The sweep (or HPO study) id: on its parent run, every child run, record checkpoint and its registered model."""
RUN_KIND_TAG = "isosweep.kind"
"""What a run is (:data:`SWEEP_KIND`, :data:`TRIAL_KIND`, :data:`RECOMMENDATION_KIND`) or a logged model
(:data:`RECORD_KIND`)."""
SWEEP_KIND = "sweep"
""":data:`RUN_KIND_TAG` of a sweep's or HPO study's parent run."""
TRIAL_KIND = "trial"
""":data:`RUN_KIND_TAG` of a trial's child run."""
RECORD_KIND = "record"
""":data:`RUN_KIND_TAG` of a record checkpoint (a logged model of a trial's run)."""
RECOMMENDATION_KIND = "recommendation"
""":data:`RUN_KIND_TAG` of an ``isosweep recommend`` run."""
STUDY_TAG = "isosweep.study"
"""A parent run: the study file's ``study:`` (``isocompute``, ``fixed-batch``, :data:`HPO_STUDY`)."""
HPO_STUDY = "hpo"
""":data:`STUDY_TAG` of an HPO study's parent run: not a grid sweep (it has no frontier)."""
DIFFICULTY_TAG = "isosweep.difficulty"
"""A parent run and its trials' child runs: the task's difficulty band (``easy``, ``hard``)."""
OUT_TAG = "isosweep.out"
"""A parent run: the folder its trials are written to (a resumed study must use the same)."""
METRIC_TAG = "isosweep.metric"
"""The metric ranked by: a parent run's primary metric (``eval/mean@4``); a record checkpoint's, a registered model's
and its versions' metric; a recommendation's."""
N_STAR_SATURATION_TAG = "isosweep.n_star_saturation"
"""A sweep's parent run after its analysis: the smallest C from which an interior n* wins untied (``none shown``,
``no fit``)."""
N_STAR_VERDICT_TAG = "isosweep.n_star_verdict"
"""A sweep's parent run after its analysis: the allocation verdict in words (grid edge, saturation, ties)."""
BEST_CONFIG_AT_BUDGET_TAG = "isosweep.best_config_at_budget"
"""A sweep's parent run after its analysis: the frontier's winner at the budget (``tie: a ~ b`` inside the noise)."""

# ------------------------------------------------------------------------------- a trial (child run)

TRIAL_TAG = "isosweep.trial"
"""A trial's key (``n8-Bp16``): on its child run, its record checkpoints and the registry versions made from them."""
CONFIG_TAG = "isosweep.config"
"""The allocation a trial runs, without its seed (``n8-Bp16``): on its child run, its record checkpoints and
the registry versions; seeds of one config share one fitted curve."""
BEST_ROLLOUTS_TAG = "isosweep.best_rollouts"
"""A trial's child run: the rollouts of its best record so far."""
BEST_VALUE_PREFIX = "isosweep.best_"
"""A trial's child run: its best record's value, under :func:`best_value_tag`."""
RECORD_CHECKPOINT_TAG = "isosweep.record_checkpoint"
"""A trial's child run: its latest record checkpoint, as a ``models:/<model id>`` URI."""
RECORDS_TAG = "isosweep.records"
"""A trial's child run: the rollouts of every record checkpoint logged, comma-separated."""
ERROR_TAG = "isosweep.error"
"""A failed trial's child run: why it failed."""

# ------------------------------------------------------------------------------- record checkpoints, the registry

ROLLOUTS_TAG = "isosweep.rollouts"
"""A record checkpoint (logged model) and a registry version: the rollouts the checkpoint was taken at."""
STEP_TAG = "isosweep.step"
"""A record checkpoint: the training step it was taken at."""
VALUE_TAG = "isosweep.value"
"""A record checkpoint: its record's :data:`METRIC_TAG` value; a registry version: the frontier's fitted value at C."""
C_TAG = "isosweep.C"
"""A registry version: the compute C (rollouts) of the frontier row it stands for."""
RECORD_VALUE_TAG = "isosweep.record_value"
"""A registry version: the value of the record checkpoint behind it."""
P_BEST_TAG = "isosweep.p_best"
"""A registry version: the bootstrap probability that its config is the best at C."""
TIE_TAG = "isosweep.tie"
"""A registry version whose lead at C is inside the noise: the runner-up config."""

# ------------------------------------------------------------------------------- HPO studies

SEARCH_TAG = "isosweep.search"
"""An HPO study's parent run and its trials' child runs: the search (``jfhpo``, ``random``, ``asha``)."""
TARGET_TAG = "isosweep.target"
"""An HPO study's parent run: the target model size."""
RECOMMENDED_TAG = "isosweep.recommended"
"""What is recommended: on a finished HPO study's parent run the configuration (JSON), on a recommendation run
the allocation (``none`` without one)."""
BEST_TARGET_TAG = "isosweep.best_target"
"""A finished HPO study's parent run: its best evaluation at the target size, and the trial."""
FIDELITY_SIZE_TAG = "isosweep.fidelity.size"
"""An HPO trial's child run: its model size."""
FIDELITY_BUDGET_TAG = "isosweep.fidelity.budget"
"""An HPO trial's child run: its budget in rollouts."""
FIDELITY_S_TAG = "isosweep.fidelity.s"
"""An HPO trial's child run: its size fidelity (0..1)."""
FIDELITY_B_TAG = "isosweep.fidelity.b"
"""An HPO trial's child run: its budget fidelity (budget / the study's full budget)."""
PROMOTED_TAG = "isosweep.promoted"
"""An HPO trial's child run: ``true`` if it continues another trial's checkpoint."""
PROMOTED_FROM_TAG = "isosweep.promoted_from"
"""A promoted HPO trial's child run: the key of the trial it continues."""
PROMOTED_AT_ROLLOUTS_TAG = "isosweep.promoted_at_rollouts"
"""A promoted HPO trial's child run: the rollouts it resumed at."""
FINAL_TAG = "isosweep.final"
"""The HPO trial that runs the study's recommendation at the target fidelity: ``true``."""
STOP_REASON_TAG = "isosweep.stop_reason"
"""A finished HPO trial's child run: why it ended (its budget, a stopping rule, a failure)."""
STOP_DETAIL_TAG = "isosweep.stop_detail"
"""A stopped HPO trial's child run: the stopping rule's detail."""
HPO_COST_TAG = "isosweep.hpo.cost"
"""A finished HPO trial's child run: the target-equivalent rollouts it cost the study."""
HPO_REACHED_TAG = "isosweep.hpo.reached_rollouts"
"""A finished HPO trial's child run: the rollouts it reached."""

# ------------------------------------------------------------------------------- recommendations

BUDGET_TAG = "isosweep.budget"
"""A recommendation run: the budget C (rollouts) it answers for."""
SWEEPS_TAG = "isosweep.sweeps"
"""A recommendation run: the ids of the sweeps it rests on, comma-separated."""
EXTRAPOLATED_TAG = "isosweep.extrapolated"
"""A recommendation run: ``true`` if C lies beyond the sweeps' budgets."""


def best_value_tag(metric: str) -> str:
    """The tag of a trial's best value of ``metric`` (MLflow's name of an eval metric, without ``eval/``).

    >>> best_value_tag("mean_at_4")
    'isosweep.best_mean_at_4'
    """
    return f"{BEST_VALUE_PREFIX}{metric}"
