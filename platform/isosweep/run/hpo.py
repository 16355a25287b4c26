"""Run an HPO study: a searcher proposes (hyperparameters, size, budget), Ray Tune runs the trials,
the dynamics stopper and ASHA stop them early, the study stops when its compute is spent.

    sweeps/jfhpo.yaml ─► HPOStudy (space, fidelities, study budget; validated before anything runs)
                      ─► MLflow parent run (incumbent over spent compute, the final summary)
                      ─► the runner core with StudySearch (wraps JFHPOSearcher or RandomSearcher):
                           each suggestion = one trial config at its fidelity, promoted from a
                           smaller-budget run of the same config when there is one
                           DynamicsStopper (+ ASHA for ``search: asha``) stop trials early
                           every trial = run.core.tune_trial (MLflow child run + TorchTrainer)
                      ─► summary: trials, incumbent trajectory, recommendation -> hpo.json, plots

The study's budget, fidelity cuts, promotions and incumbent are kept by its ledger
(:mod:`isosweep.hpo.ledger`); this module connects the ledger to Tune, the trial folders and MLflow.

Checkpoint promotion. Trials are registered by their configuration without the budget. When a
proposal repeats a configuration that finished at a smaller budget (same size and
hyperparameters), the new trial starts from a copy of that trial's last checkpoint and records
(files hard-linked where possible): the training loop resumes at the copied step, so only the
steps beyond it are trained and charged. With ``jfhpo.promote_within`` a proposal whose
hyperparameters lie that close to a finished trial's (same size, larger budget) is snapped to
them and promoted: the GP barely distinguishes such points, and continuing is far cheaper.

Resuming. The study's state (the searcher's observations and RNG, the ledger) is saved after
every suggestion and every finished trial in ``search.json``; a re-run of the same command
restores it, re-issues the trials that were running (they resume from their checkpoints) and
continues the search where it stopped.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from isosweep.hpo.ledger import StudyLedger, TrialEntry
from isosweep.hpo.searcher import JFHPOSearcher, RandomSearcher, asha_scheduler, read_json_state, write_json_state
from isosweep.hpo.stopping import DynamicsStopper
from isosweep.report.hpo import HPOSummary, ProxyVerdict, summary, table_text, verdict_text, write_summary
from isosweep.run.core import (
    Progress,
    StudyStanding,
    TrialJob,
    TrialsOutcome,
    TrialStanding,
    check_problem_sets,
    duration,
    live_wanted,
    open_study,
    run_trials,
    say,
    trial_of,
)
from isosweep.run.lock import release_study
from isosweep.spec.hpo import HPOStudy
from isosweep.spec.trial import TrialConfig
from isosweep.track import runs, server
from isosweep.track.tags import (
    FIDELITY_B_TAG,
    FIDELITY_BUDGET_TAG,
    FIDELITY_S_TAG,
    FIDELITY_SIZE_TAG,
    FINAL_TAG,
    HPO_STUDY,
    METRIC_TAG,
    NOTE_TAG,
    OUT_TAG,
    PROMOTED_AT_ROLLOUTS_TAG,
    PROMOTED_FROM_TAG,
    PROMOTED_TAG,
    SEARCH_TAG,
    STUDY_TAG,
    TARGET_TAG,
)

STATE_FILE = "search.json"


class StudySearch(Searcher):
    """The Tune searcher of a study: the JF-HPO or random searcher's proposals, the study ledger's rules.

    - Suggestions are :class:`isosweep.run.core.TrialJob` s (``{"trial": job}`` for Tune).
    - The ledger says what to do next (propose, wait, run the final recommendation, end) and keeps
      the spend; this class asks the inner searcher, prepares promoted trials' folders, stops
      trials Tune ends early and closes their MLflow runs.
    """

    def __init__(self, study: HPOStudy, inner, sweep_out: Path, uri: str, parent_id: str,
                 reasons: Callable[[str], Any] = lambda trial_id: None, log: Callable[[str], None] = say) -> None:
        super().__init__(metric=study.metric, mode="max")
        self.study, self.inner, self.sweep_out = study, inner, Path(sweep_out)
        self.uri, self.parent_id, self.reasons, self.log = uri, parent_id, reasons, log
        self.ledger = StudyLedger(study)
        self.tune_ids: dict[str, str] = {}  # Tune trial id -> our trial key
        self.queue: list[str] = []  # trials to re-issue after a restart
        self.unlogged: list[dict[str, Any]] = []
        """Finished trials MLflow has not taken yet (it did not answer): ``key``, ``point`` (their index in the
        ledger's trajectory), ``reason`` (the stop's detail); saved with the state, retried by :meth:`settle`."""
        self._client = None

    def __getstate__(self) -> dict[str, Any]:
        """What Tune pickles with the experiment: everything but the MLflow client (a connection)."""
        return {**self.__dict__, "_client": None}

    @property
    def client(self):
        if self._client is None:
            self._client = runs.client(self.uri)
        return self._client

    # -- state --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"inner": self.inner.get_state(), **self.ledger.state(), "unlogged": self.unlogged}

    def save_state(self) -> None:
        write_json_state(self.sweep_out / STATE_FILE, self.state())

    def load_state(self, state: dict[str, Any]) -> None:
        self.inner.set_state(state["inner"])
        self.ledger.load(state)
        self.queue = [t.key for t in self.ledger.running]
        self.unlogged = list(state.get("unlogged", []))  # a study saved before MLflow outages were kept

    def save(self, checkpoint_path: str) -> None:  # Tune's experiment checkpoint
        write_json_state(checkpoint_path, self.state())

    def restore(self, checkpoint_path: str) -> None:
        self.load_state(read_json_state(checkpoint_path))

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    # -- suggestions --------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict | str | None:
        if self.queue:
            key = self.queue.pop(0)
            self.tune_ids[trial_id] = key
            return {"trial": self.job(self.ledger.trials[key]).to_tune()}
        entry = self._next(len(self.ledger.trials))
        if entry is None:
            return None
        if entry == Searcher.FINISHED:
            self.ledger.finished = True
            self.save_state()
            return entry
        self.ledger.add(entry)
        self.tune_ids[trial_id] = entry.key
        self.save_state()
        return {"trial": self.job(entry).to_tune()}

    def _next(self, index: int) -> TrialEntry | str | None:
        action, room = self.ledger.next()
        if action == "wait":
            return None
        if action == "finished":
            return Searcher.FINISHED
        if action == "final":
            return self._final(index) or Searcher.FINISHED
        return self._propose(index, room)

    def _propose(self, index: int, room: float | None) -> TrialEntry:
        space, study = self.study.space, self.study
        key = f"t{index:03d}"
        config = self.inner.suggest(key)
        proposed = (config[space.size_key], int(config[space.budget_key]), space.hparams(config))
        size, budget, params = proposed
        if room is not None:  # JF-HPO: cut the budget (then the size) to what the study can still pay for
            size, budget = self.ledger.fit_budget(size, budget, room)
        if study.spec.search == "jfhpo" and study.spec.jfhpo.promote_within > 0:
            near = self.ledger.nearest(size, params, budget, study.spec.jfhpo.promote_within)
            if near is not None:
                params = dict(near.params)
        if (size, budget, params) != proposed:
            self.inner.replace_live(key, {**params, space.size_key: size, space.budget_key: budget})
        entry = self._entry(f"{key}-{size}-{budget}", size, budget, params)
        entry.inner_id = key
        return entry

    def _final(self, index: int) -> TrialEntry | None:
        """The recommendation at the target fidelity (promoted if it already ran there at a smaller budget),
        or None if it already ran there at the full budget."""
        self.ledger.final_issued = True
        space = self.study.space
        recommended = self.inner.recommend() or space.from_unit([0.5] * len(space.params) + [1.0, 1.0])
        params = space.hparams(recommended)
        ran = self.ledger.ran_at_target(params)
        if ran is not None:  # nothing to add
            self.log(f"[hpo] the recommended configuration already ran at the target fidelity ({ran.key})")
            return None
        entry = self._entry(f"t{index:03d}-{space.target}-{self.study.budget}-final", space.target, self.study.budget,
                            self.ledger.final_params(params))
        entry.final = True
        return entry

    def _entry(self, key: str, size: str, budget: int, params: dict[str, float]) -> TrialEntry:
        """A new trial, promoted from the furthest finished trial of its configuration if there is one."""
        entry = TrialEntry(key=key, size=size, budget=budget, params=params)
        source = self.ledger.promotion_source(
            entry, has_checkpoint=lambda k: trial_of(self.sweep_out, k).latest_checkpoint() is not None)
        if source is not None:
            entry.start_rollouts = trial_of(self.sweep_out, key).promote_from(trial_of(self.sweep_out, source.key))
            entry.promoted_from = source.key
            self.log(f"[hpo] {key}: promoted from {source.key}, resuming at {entry.start_rollouts:,} rollouts "
                     f"(only the {budget - entry.start_rollouts:,} beyond them are trained)")
        return entry

    def job(self, entry: TrialEntry) -> TrialJob:
        """The Tune trial job of ``entry``."""
        cfg = self.study.trial_config(entry.params, entry.size, entry.budget)
        tags = {FIDELITY_SIZE_TAG: entry.size, FIDELITY_BUDGET_TAG: str(entry.budget),
                FIDELITY_S_TAG: f"{self.study.size_fidelity(entry.size):.4g}",
                FIDELITY_B_TAG: f"{entry.budget / self.study.budget:.4g}",
                PROMOTED_TAG: str(entry.promoted_from is not None).lower(), SEARCH_TAG: self.study.spec.search}
        if entry.promoted_from:
            tags.update({PROMOTED_FROM_TAG: entry.promoted_from, PROMOTED_AT_ROLLOUTS_TAG: str(entry.start_rollouts)})
        if entry.final:
            tags[FINAL_TAG] = "true"
        return TrialJob(key=entry.key, config_key=entry.config_key, cfg=cfg,
                        out=str(trial_of(self.sweep_out, entry.key).path), sweep_id=self.study.sweep_id,
                        parent_run_id=self.parent_id, tracking_uri=self.uri, tags=tags)

    # -- MLflow --------------------------------------------------------------------------------
    def settle(self) -> bool:
        """Give MLflow the finished trials it lacks, in the order they finished: each trial's child run
        (created if MLflow was down when the trial started), caught up to its files, tagged and closed, and
        the study's progress at that trial's end on the parent run. A server that does not answer stops
        nothing: what is left is kept in the state and retried at the next finished trial, at the end of
        the study and by the next run of the same command. Returns whether MLflow holds every finished trial."""
        if self.unlogged and not server.answers(self.uri):  # at once, not after the client's minutes of retries
            self.log(f"[hpo] MLflow at {self.uri} does not answer; {len(self.unlogged)} finished trial(s) kept on "
                     f"disk, logged when it answers")
            return False
        while self.unlogged:
            item = self.unlogged[0]
            entry = self.ledger.trials[item["key"]]
            job = self.job(entry)
            try:
                runs.close_hpo_trial(self.client, self.uri, self.parent_id, job.sweep_id, job.cfg, job.config_key,
                                     job.tags, entry, item["reason"], trial_of(self.sweep_out, entry.key),
                                     self.study.k)
                runs.log_hpo_progress(self.client, self.parent_id, self.study.spec.metric, entry,
                                      self.ledger.trajectory[:item["point"] + 1])
            except runs.UNANSWERED as err:  # a server that does not answer, after the client's retries
                self.log(f"[hpo] MLflow at {self.uri} did not answer ({type(err).__name__}); {len(self.unlogged)} "
                         f"finished trial(s) kept on disk, logged when it answers")
                return False
            self.unlogged.pop(0)
            self.save_state()
        return True

    # -- results ------------------------------------------------------------------------------
    def on_trial_result(self, trial_id: str, result: dict) -> None:
        key = self.tune_ids.get(trial_id)
        # the searchers only use intermediate reports when asked to (JF-HPO's `intermediate`)
        if key is not None and self.ledger.trials[key].inner_id is not None and getattr(self.inner, "intermediate", 0):
            self.inner.on_trial_result(self.ledger.trials[key].inner_id, self._as_gain(key, result))

    def _as_gain(self, key: str, result: dict) -> dict:
        """``result`` with the metric replaced by its gain over the trial's base model (its record at rollouts 0).

        The searcher models gains, not raw evaluations: each size is evaluated on the problems
        its own base model finds easy (or hard), so raw values differ by size for reasons that
        have nothing to do with the hyperparameters, and a raw 0.60 on the smallest model would
        look like an improvement over a target at 0.55. Gains are comparable across sizes."""
        metric = self.study.metric
        if result.get(metric) is None:
            return result
        records = trial_of(self.sweep_out, key).records()
        if not records or records[0]["rollouts"] != 0:
            return {k: v for k, v in result.items() if k != metric}
        return {**result, metric: float(result[metric]) - float(records[0][metric])}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        key = self.tune_ids.pop(trial_id, None)
        if key is None or self.ledger.trials[key].status != "running":
            return
        entry = self.ledger.trials[key]
        trial = trial_of(self.sweep_out, key)
        records = trial.records()
        reason = self.reasons(trial_id)
        if not error and (not records or records[-1]["rollouts"] < entry.budget):
            # stopped early: Tune ends the trial's function, not the Ray Train job it started
            trial.request_stop(str(reason) if reason is not None else f"stopped by {self.study.spec.search}")
            trial.wait_for_stop()
        records = trial.records()
        trained_to = max([r["step"] for r in trial.steps()] + [r["step"] for r in records] + [0]) * self.study.batch
        entry = self.ledger.complete(key, records, trained_to, error=error,
                                     stop_rule=reason.rule if reason is not None else None,
                                     seconds=(result or {}).get("time_total_s"))
        if entry.inner_id is not None:
            final = {**(result or {}), "hpo/cost": entry.cost, "rollouts": entry.reached}
            if records:
                final[self.study.metric] = entry.value
            decided = getattr(self.inner, "proxy_verdict", None)
            self.inner.on_trial_complete(entry.inner_id, self._as_gain(key, final), error=error and not records)
            verdict = getattr(self.inner, "proxy_verdict", None)
            if verdict is not None and decided is None:
                self.log(f"[hpo] {verdict_text(ProxyVerdict.from_json(verdict), self.study.target)}")
        self.unlogged.append({"key": key, "point": len(self.ledger.trajectory) - 1,
                              "reason": str(reason)[:5000] if reason is not None else None})
        self.save_state()
        self.settle()
        incumbent = self.ledger.incumbent()
        shown = f"{entry.value:.3f}" if entry.value is not None else "no eval"
        study = self.study
        self.log(f"[hpo] {key} {entry.status} ({entry.stop_reason}) at {entry.reached:,}/{entry.budget:,} rollouts: "
                 f"{study.spec.metric}@{study.k} {shown} | cost {entry.cost:,.0f} | spent "
                 f"{self.ledger.spent:,.0f}/{study.study_budget:,.0f} ({self.ledger.spent / study.study_budget:.0%}) | "
                 f"incumbent at {study.target}: " + (f"{incumbent:.3f}" if incumbent is not None else "none yet"))


class StudyProgress:
    """The progress of an HPO study for the runner core: spent and committed budget, incumbent; each running trial's
    rollouts of its budget and last eval."""

    def __init__(self, search: StudySearch) -> None:
        self.search = search
        self.last: dict[str, float] = {}
        """Each trial's last evaluation of the study's metric."""

    def result(self, key: str, result: dict) -> None:
        if result.get(self.search.study.metric) is not None:
            self.last[key] = float(result[self.search.study.metric])

    def complete(self, key: str) -> None:
        return None  # StudySearch logs each finished trial with its cost and the incumbent

    def standing(self, running: int, failed: int, elapsed_s: float) -> StudyStanding:
        ledger, study = self.search.ledger, self.search.study
        incumbent = ledger.incumbent()
        done = sum(t.status != "running" for t in ledger.trials.values())
        # trials are charged when they end, and early stops make their length unknown: no pace, no time left
        return StudyStanding(done=ledger.spent, total=study.study_budget, unit="target-eq. rollouts", rate=None,
                             left_s=None, trials=f"{done} trials finished, {len(ledger.running)} running",
                             best=f"incumbent at {study.target}: "
                                  + (f"{incumbent:.3f}" if incumbent is not None else "none yet"))

    def trial(self, key: str) -> TrialStanding:
        entry = self.search.ledger.trials[key]
        rollouts = min(trial_of(self.search.sweep_out, key).last_step_rollouts(), entry.budget)
        value = self.last.get(key)
        return TrialStanding(key=key, rollouts=rollouts, budget=entry.budget,
                             value=f"{self.search.study.metric.split('/')[-1]} {value:.3f}" if value is not None
                             else "no eval yet")

    def status(self, running: int, failed: int, elapsed_s: float) -> str:
        ledger, study = self.search.ledger, self.search.study
        s = self.standing(running, failed, elapsed_s)
        return (f"[hpo] {s.trials} | spent {ledger.spent:,.0f} + {ledger.committed:,.0f} committed of "
                f"{study.study_budget:,.0f} | {s.best} | elapsed {duration(elapsed_s)}")


def make_searcher(study: HPOStudy):
    """The inner searcher of ``study.spec.search`` (the study budget is kept by the ledger)."""
    spec = study.spec
    common = dict(study_budget=None, cost_fn=lambda config, result: float(result["hpo/cost"]), seed=spec.seed)
    if spec.search == "jfhpo":
        share = spec.jfhpo.proxy_share
        return JFHPOSearcher(study.space, study.metric, "max", n_init=spec.jfhpo.n_init,
                             num_restarts=spec.jfhpo.num_restarts, raw_samples=spec.jfhpo.raw_samples,
                             proxy_check=spec.jfhpo.proxy_check, proxy_rho=spec.jfhpo.proxy_rho,
                             proxy_budget=None if share is None else share * study.study_budget, **common)
    if spec.search == "asha":  # its own random stream: not the configurations random search draws for this seed
        common["seed"] = asha_seed(spec.seed)
    return RandomSearcher(study.space, study.metric, "max", **common)


def asha_seed(seed: int) -> int:
    """The random-configuration seed of an ASHA study with searcher seed ``seed``: a stream of its own, so ASHA
    and random search at one seed are two draws, not one (a study started before this keeps its saved stream)."""
    return int.from_bytes(hashlib.sha256(f"asha:{seed}".encode()).digest()[:4], "little")


def make_stopper(study: HPOStudy) -> DynamicsStopper:
    s = study.spec.stopping
    return DynamicsStopper(tau1=s.tau1, k=s.k, tau2=s.tau2, grace=None if s.grace is None else s.grace * study.budget,
                           kl_floor=s.kl_floor)


def probe_config(study: HPOStudy) -> TrialConfig:
    """A full-fidelity trial of the study at the low end of every range: what sizes its concurrency and whose
    problem sets are checked before it starts."""
    return study.trial_config({k: r.low for k, r in study.spec.space.items()}, study.target, study.budget)


def run_hpo(study: HPOStudy, runs_root: str | Path = "runs/sweeps", dashboards: str | Path | None = "dashboards",
            address: str | None = None, log: Callable[[str], None] = say, progress_every_s: float = 30.0,
            live: bool = False) -> HPOSummary | None:
    """Run (or resume) ``study``; returns its :class:`~isosweep.report.hpo.HPOSummary` (what ``hpo.json`` holds), or
    None if interrupted.
    ``live``: the progress as a live display where stdout is a terminal (:func:`isosweep.run.core.live_wanted`)."""
    check_problem_sets([probe_config(study)], study.path, log)
    sweep_out, uri = open_study(study.sweep_id, runs_root, log)
    try:
        return _run_locked(study, sweep_out, uri, dashboards, address, log, progress_every_s, live)
    finally:
        release_study(sweep_out)


def _run_locked(study: HPOStudy, sweep_out: Path, uri: str, dashboards: str | Path | None, address: str | None,
                log: Callable[[str], None], progress_every_s: float, live: bool = False) -> HPOSummary | None:
    client = runs.client(uri)
    spec = study.spec
    tags = {STUDY_TAG: HPO_STUDY, SEARCH_TAG: spec.search, METRIC_TAG: study.metric, OUT_TAG: str(sweep_out),
            TARGET_TAG: study.target, NOTE_TAG: spec.description}
    params = {"sweep.file": str(study.path), "sweep.budget": study.budget, "hpo.study_budget": study.study_budget,
              "hpo.sizes": json.dumps(study.space.sizes), "hpo.budget_range": f"{study.space.budget_min}-{study.space.budget_max}",
              **runs.flatten(spec.model_dump(mode="json"), "spec.")}
    parent_id = runs.open_study_parent(client, study.sweep_id, tags, params)
    stopper = make_stopper(study)
    search = StudySearch(study, make_searcher(study), sweep_out, uri, parent_id, reasons=stopper.reason, log=log)
    state_file = sweep_out / STATE_FILE
    if not state_file.exists() and (sweep_out / "search.pkl").exists():
        raise RuntimeError(f"{sweep_out / 'search.pkl'} holds this study's state in the pickle format of an older "
                           f"isosweep, which is no longer read (a pickle can run code when loaded). Start the study "
                           f"afresh: move {sweep_out} away, or give the study another sweep_id.")
    if state_file.exists():
        search.restore(str(state_file))
        search.settle()  # trials an earlier run finished while MLflow was down
    ledger = search.ledger
    log(f"[hpo] {study.sweep_id}: {spec.search} over {', '.join(study.space.names)}; sizes "
        f"{' < '.join(study.space.sizes)} (target {study.target}), budgets {study.space.budget_min:,}..{study.budget:,} "
        f"rollouts; study budget {study.study_budget:,.0f} target-equivalent rollouts "
        f"({study.study_budget / study.cost(study.target, study.budget):.1f} full-fidelity trials)")
    log(f"[hpo] MLflow: {uri} (experiment '{runs.EXPERIMENT}', parent run {parent_id}); output {sweep_out}")
    if ledger.trials:
        log(f"[hpo] resuming: {len(ledger.trials)} trials so far, {len(search.queue)} to continue, "
            f"{ledger.spent:,.0f} spent")
    outcome = TrialsOutcome(interrupted=False)
    if not ledger.finished:
        probe = probe_config(study)
        scheduler = None
        if spec.search == "asha":
            scheduler = asha_scheduler(study.space, study.metric, "max", time_attr="rollouts",
                                       reduction_factor=spec.asha.reduction_factor)
        progress = Progress(StudyProgress(search), sweep_out, log, progress_every_s, "hpo", uri=uri,
                            live=live and live_wanted())
        outcome = run_trials(sweep_out, [probe], study.path, address, progress, log, "hpo", limit=spec.max_trials,
                             stop=stopper, search_alg=search, scheduler=scheduler, num_samples=-1)
    logged = search.settle()
    # A failed trial is one of the study's results (the ledger counts it, the search goes on), so the outcome's
    # failures stop nothing. Tune ends a study's run only once the search said it is finished and every trial ended:
    # short of that the run was stopped, even when no trial was left running (a Ctrl-C between two trials).
    if outcome.interrupted or not ledger.finished or ledger.running:
        search.save_state()
        if logged:
            client.update_run(parent_id, status="KILLED")
        log(f"[hpo] interrupted: {len(ledger.trials)} trials so far, {len(ledger.running)} unfinished, "
            f"{ledger.spent:,.0f} of {study.study_budget:,.0f} spent; run the same command again to continue")
        return None
    target_base = next((records[0][study.metric] for t in ledger.trials.values() if t.size == study.target
                        for records in [trial_of(sweep_out, t.key).records()] if records), None)
    result = summary(ledger, search.inner.recommend(), target_base, getattr(search.inner, "proxy_verdict", None))
    out = sweep_out / "hpo"
    copies = dashboards and Path(dashboards) / spec.name
    files = write_summary(result, out, copies)
    if logged:
        try:
            runs.log_hpo_summary(client, parent_id, result.to_json(), files)
            client.set_terminated(parent_id, status="FINISHED")
        except runs.UNANSWERED:  # a server that does not answer, after the client's retries
            logged = False
    log("")
    log(table_text(result))
    log("")
    log(f"[hpo] summary, table and plot: {out}" + (f" and {copies}" if copies else "")
        + (f"; in MLflow on parent run {parent_id} (artifacts/hpo, metric hpo/incumbent over spent compute)" if logged
           else f"; MLflow at {uri} did not answer, so the study is finished on disk only: run the same command "
                f"again once it answers to log it (no trial is rerun)"))
    if logged:
        log(f"[hpo] open it in MLflow's UI: {runs.run_url(uri, client, parent_id)}")
    return result
