"""Run an HPO study: a searcher proposes (hyperparameters, size, budget), Ray Tune runs the trials,
the dynamics stopper and ASHA stop them early, the study stops when its compute is spent.

    sweeps/jfhpo.yaml ─► HPOStudy (space, fidelities, study budget; validated before anything runs)
                      ─► MLflow parent run (incumbent over spent compute, the final summary)
                      ─► Ray Tune with StudySearch (wraps JFHPOSearcher or RandomSearcher):
                           each suggestion = one trial config at its fidelity, promoted from a
                           smaller-budget run of the same config when there is one
                           DynamicsStopper (+ ASHA for ``search: asha``) stop trials early
                           every trial = sweep.tune_trial (MLflow child run + TorchTrainer)
                      ─► summary: trials, incumbent trajectory, recommendation -> hpo.json, plots

Checkpoint promotion. Trials are registered by their configuration without the budget. When a
proposal repeats a configuration that finished at a smaller budget (same size and
hyperparameters), the new trial starts from a copy of that trial's last checkpoint and records
(files hard-linked where possible): the training loop resumes at the copied step, so only the
steps beyond it are trained and charged. With ``jfhpo.promote_within`` a proposal whose
hyperparameters lie that close to a finished trial's (same size, larger budget) is snapped to
them and promoted: the GP barely distinguishes such points, and continuing is far cheaper.

Resuming. The study's state (the searcher's observations and RNG, every trial's status, the
spend) is saved after every suggestion and every finished trial in ``search.pkl``; a re-run of
the same command restores it, re-issues the trials that were running (they resume from their
checkpoints) and continues the search where it stopped.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray.tune.search import Searcher

from isosweep import tracking
from isosweep.hpospec import HPOStudy
from isosweep.sweep import _duration, resources_of, say, trial_dir
from isosweep.trial import STOP_FILE

STATE_FILE = "search.pkl"


@dataclass
class TrialEntry:
    """One trial of the study: what ran, at which fidelity, what it reached and cost."""

    key: str
    size: str
    budget: int
    params: dict[str, float]
    status: str = "running"
    """``running``, ``done`` (reached its budget), ``stopped`` (a dynamics rule or ASHA), ``failed``."""
    start_rollouts: int = 0
    """Rollouts already trained when it started (a promoted trial continues from them)."""
    promoted_from: str | None = None
    final: bool = False
    """The recommendation run at the target fidelity at the end of a JF-HPO study."""
    inner_id: str | None = None
    """The trial's id in the inner searcher (None for the final recommendation, which it did not propose)."""
    reached: int = 0
    value: float | None = None
    """The metric at the last evaluation."""
    best: float | None = None
    """The best evaluation of the metric along the trial after training started (its records, promoted
    ones included; not the base model's evaluation at rollouts 0)."""
    cost: float = 0.0
    stop_reason: str = ""
    seconds: float | None = None
    spent_after: float | None = None

    @property
    def config_key(self) -> str:
        """The registry key: size and hyperparameters, without the budget."""
        return json.dumps([self.size, sorted(self.params.items())])


class StudySearch(Searcher):
    """The Tune searcher of a study: wraps the JF-HPO or random searcher with the study's accounting.

    - Suggestions are trial points for :func:`isosweep.sweep.tune_trial` (``{"trial": point}``).
    - The study budget is spent by finished trials and committed by running ones; no suggestion is
      made that the rest cannot pay for (JF-HPO's budget is cut to fit), and for JF-HPO one
      full-fidelity trial's worth is kept for the final recommendation at the target.
    - Promotion (see the module docstring), cost charging and the incumbent trajectory live here;
      so does the MLflow bookkeeping of finished trials (stop reason, cost, parent metrics).
    """

    def __init__(self, study: HPOStudy, inner, sweep_out: Path, uri: str, parent_id: str,
                 reasons: Callable[[str], Any] = lambda trial_id: None, log: Callable[[str], None] = say) -> None:
        super().__init__(metric=study.metric, mode="max")
        self.study, self.inner, self.sweep_out = study, inner, Path(sweep_out)
        self.uri, self.parent_id, self.reasons, self.log = uri, parent_id, reasons, log
        self.trials: dict[str, TrialEntry] = {}
        self.spent = 0.0
        self.trajectory: list[dict[str, Any]] = []
        self.final_issued = False
        self.finished = False
        self._ids: dict[str, str] = {}  # Tune trial id -> our trial key
        self._queue: list[str] = []  # trials to re-issue after a restart
        self._client = None

    def __getstate__(self) -> dict[str, Any]:
        """What Tune pickles with the experiment: everything but the MLflow client (a connection)."""
        return {**self.__dict__, "_client": None}

    # -- state --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {"inner": self.inner.get_state(), "trials": [asdict(t) for t in self.trials.values()],
                "spent": self.spent, "trajectory": self.trajectory, "final_issued": self.final_issued,
                "finished": self.finished}

    def save_state(self) -> None:
        path = self.sweep_out / STATE_FILE
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            pickle.dump(self.state(), f)
        os.replace(tmp, path)

    def load_state(self, state: dict[str, Any]) -> None:
        self.inner.set_state(state["inner"])
        self.trials = {t["key"]: TrialEntry(**t) for t in state["trials"]}
        self.spent, self.trajectory = state["spent"], state["trajectory"]
        self.final_issued, self.finished = state["final_issued"], state["finished"]
        self._queue = [k for k, t in self.trials.items() if t.status == "running"]

    def save(self, checkpoint_path: str) -> None:  # Tune's experiment checkpoint
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.state(), f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.load_state(pickle.load(f))

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return True

    # -- accounting ---------------------------------------------------------------------------
    def nominal_cost(self, entry: TrialEntry) -> float:
        return self.study.cost(entry.size, entry.budget - entry.start_rollouts)

    @property
    def committed(self) -> float:
        return sum(self.nominal_cost(t) for t in self.trials.values() if t.status == "running")

    @property
    def running(self) -> list[TrialEntry]:
        return [t for t in self.trials.values() if t.status == "running"]

    def incumbent(self) -> float | None:
        """The best evaluation reached by any trial at the target size (None before the first)."""
        values = [t.best for t in self.trials.values() if t.size == self.study.target and t.best is not None]
        return max(values, default=None)

    # -- suggestions --------------------------------------------------------------------------
    def suggest(self, trial_id: str) -> dict | str | None:
        if self._queue:
            key = self._queue.pop(0)
            self._ids[trial_id] = key
            return {"trial": self.point(self.trials[key])}
        entry = self._next(len(self.trials))
        if entry in (None, Searcher.FINISHED):
            if entry == Searcher.FINISHED:
                self.finished = True
                self.save_state()
            return entry
        self.trials[entry.key] = entry
        self._ids[trial_id] = entry.key
        self.save_state()
        return {"trial": self.point(entry)}

    def _next(self, index: int) -> TrialEntry | str | None:
        study, spec = self.study, self.study.spec
        left = study.study_budget - self.spent - self.committed
        wait = None if self.running else Searcher.FINISHED
        if self.spent >= study.study_budget or len(self.trials) >= spec.max_trials:
            return wait
        jf = spec.search == "jfhpo"
        if jf:
            final = spec.jfhpo.final_at_target and not self.final_issued
            reserve = study.cost(study.target, study.budget) if final else 0.0
            cheapest = study.cost(study.space.ladder[0][0], study.space.budget_min)
            if left - reserve >= cheapest:
                return self._from_inner(index, left - reserve - spec.cost.per_trial * study.budget)
            if final:
                if self.running:
                    return None  # recommend once every running trial's result is in
                entry = self._final(index)
                return entry if entry is not None else Searcher.FINISHED
            return wait
        # random search and ASHA start every trial at the full fidelity: one starts only if the study can pay for
        # all of it, so the study never overspends (ASHA's early stops leave room for more trials)
        if left >= study.cost(study.target, study.budget) - 1e-6:
            return self._from_inner(index, None)
        return wait

    def _from_inner(self, index: int, room: float | None) -> TrialEntry:
        space, study = self.study.space, self.study
        key = f"t{index:03d}"
        config = self.inner.suggest(key)
        size, budget = config[space.size_key], int(config[space.budget_key])
        params = space.hparams(config)
        changed = False
        if room is not None:  # JF-HPO: cut the budget (then the size) to what the study can still pay for
            fit = int(room / study.size_fidelity(size)) // study.batch * study.batch
            if fit < space.budget_min:
                size = space.ladder[0][0]
                fit = int(room / study.size_fidelity(size)) // study.batch * study.batch
            if fit < budget:
                budget, changed = max(space.budget_min, fit), True
        if study.spec.search == "jfhpo" and study.spec.jfhpo.promote_within > 0:
            near = self._nearest(size, params, budget, study.spec.jfhpo.promote_within)
            if near is not None and near.params != params:
                params, changed = dict(near.params), True
        if changed:
            self.inner.replace_live(key, {**params, space.size_key: size, space.budget_key: budget})
        entry = self._entry(f"{key}-{size}-{budget}", size, budget, params)
        entry.inner_id = key
        return entry

    def _final(self, index: int) -> TrialEntry | None:
        """The recommendation at the target fidelity (promoted if it already ran there at a smaller budget),
        or None if it already ran there at the full budget."""
        self.final_issued = True
        space = self.study.space
        recommended = self.inner.recommend() or space.from_unit([0.5] * len(space.params) + [1.0, 1.0])
        params = space.hparams(recommended)
        same = self._nearest(space.target, params, self.study.budget, 1e-6)  # undo the unit-cube round trip
        done = [t for t in self.trials.values() if t.status == "done" and t.size == space.target
                and t.reached >= self.study.budget
                and max(abs(p.to_unit(params[p.name]) - p.to_unit(t.params[p.name])) for p in space.params) <= 1e-6]
        if done:  # the recommendation already ran at the target fidelity: nothing to add
            self.log(f"[hpo] the recommended configuration already ran at the target fidelity ({done[0].key})")
            return None
        entry = self._entry(f"t{index:03d}-{space.target}-{self.study.budget}-final", space.target, self.study.budget,
                            dict(same.params) if same else params)
        entry.final = True
        return entry

    def _nearest(self, size: str, params: dict[str, float], budget: int, radius: float) -> TrialEntry | None:
        """The finished trial at ``size`` with a smaller budget whose hyperparameters are nearest ``params``
        (unit cube, max norm), if within ``radius``."""
        space = self.study.space
        best, best_d = None, math.inf
        for t in self.trials.values():
            if t.status != "done" or t.size != size or t.reached >= budget:
                continue
            d = max(abs(p.to_unit(params[p.name]) - p.to_unit(t.params[p.name])) for p in space.params)
            if d <= radius and d < best_d:
                best, best_d = t, d
        return best

    def _entry(self, key: str, size: str, budget: int, params: dict[str, float]) -> TrialEntry:
        entry = TrialEntry(key=key, size=size, budget=budget, params=params)
        source = self._promotion_source(entry)
        if source is not None:
            entry.start_rollouts = promote(trial_dir(self.sweep_out, source.key), trial_dir(self.sweep_out, key))
            entry.promoted_from = source.key
            self.log(f"[hpo] {key}: promoted from {source.key}, resuming at {entry.start_rollouts:,} rollouts "
                     f"(only the {budget - entry.start_rollouts:,} beyond them are trained)")
        return entry

    def _promotion_source(self, entry: TrialEntry) -> TrialEntry | None:
        """The finished trial of the same configuration with the largest budget below ``entry``'s, if any."""
        found = [t for t in self.trials.values()
                 if t.config_key == entry.config_key and t.status == "done" and 0 < t.reached < entry.budget
                 and latest_checkpoint(trial_dir(self.sweep_out, t.key)) is not None]
        return max(found, key=lambda t: t.reached, default=None)

    def point(self, entry: TrialEntry) -> dict[str, Any]:
        """The Tune trial point of ``entry`` (what :func:`isosweep.sweep.tune_trial` takes)."""
        cfg = self.study.trial_config(entry.params, entry.size, entry.budget)
        tags = {"isosweep.fidelity.size": entry.size, "isosweep.fidelity.budget": entry.budget,
                "isosweep.fidelity.s": f"{self.study.size_fidelity(entry.size):.4g}",
                "isosweep.fidelity.b": f"{entry.budget / self.study.budget:.4g}",
                "isosweep.promoted": str(entry.promoted_from is not None).lower(),
                "isosweep.search": self.study.spec.search}
        if entry.promoted_from:
            tags.update({"isosweep.promoted_from": entry.promoted_from,
                         "isosweep.promoted_at_rollouts": entry.start_rollouts})
        if entry.final:
            tags["isosweep.final"] = "true"
        return {"key": entry.key, "config_key": entry.config_key, "cfg": cfg.model_dump(mode="json"),
                "out": str(trial_dir(self.sweep_out, entry.key)), "sweep_id": self.study.sweep_id,
                "parent_run_id": self.parent_id, "tracking_uri": self.uri, "tags": tags}

    # -- results ------------------------------------------------------------------------------
    def on_trial_result(self, trial_id: str, result: dict) -> None:
        key = self._ids.get(trial_id)
        # the searchers only use intermediate reports when asked to (JF-HPO's `intermediate`)
        if key is not None and self.trials[key].inner_id is not None and getattr(self.inner, "intermediate", 0):
            self.inner.on_trial_result(self.trials[key].inner_id, self._as_gain(key, result))

    def _as_gain(self, key: str, result: dict) -> dict:
        """``result`` with the metric replaced by its gain over the trial's base model (its record at rollouts 0).

        The searcher models gains, not raw evaluations: each size is evaluated on the problems
        its own base model finds easy (or hard), so raw values differ by size for reasons that
        have nothing to do with the hyperparameters, and a raw 0.60 on the smallest model would
        look like an improvement over a target at 0.55. Gains are comparable across sizes."""
        from isosweep.trial import read_records

        metric = self.study.metric
        if result.get(metric) is None:
            return result
        records = read_records(trial_dir(self.sweep_out, key))
        if not records or records[0]["rollouts"] != 0:
            return {k: v for k, v in result.items() if k != metric}
        return {**result, metric: float(result[metric]) - float(records[0][metric])}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        from isosweep.trial import read_records, read_steps

        key = self._ids.pop(trial_id, None)
        if key is None or self.trials[key].status != "running":
            return
        entry = self.trials[key]
        out = trial_dir(self.sweep_out, key)
        records = read_records(out)
        reason = self.reasons(trial_id)
        if not error and (not records or records[-1]["rollouts"] < entry.budget):
            # stopped early: Tune ends the trial's function, not the Ray Train job it started
            (out / STOP_FILE).write_text(str(reason) if reason is not None else f"stopped by {self.study.spec.search}")
            _wait_for_stop(out)
        records, steps = read_records(out), read_steps(out)
        metric = self.study.metric
        cfg_batch = self.study.batch
        trained_to = max([r["step"] for r in steps] + [r["step"] for r in records] + [0]) * cfg_batch
        entry.reached = records[-1]["rollouts"] if records else 0
        entry.value = records[-1][metric] if records else None
        entry.best = max((r[metric] for r in records if r["rollouts"] > 0), default=None)  # not the base model's
        entry.cost = self.study.cost(entry.size, max(0, trained_to - entry.start_rollouts))
        entry.seconds = (result or {}).get("time_total_s")
        if error:
            entry.status, entry.stop_reason = "failed", "error"
        elif entry.reached >= entry.budget:
            entry.status, entry.stop_reason = "done", "completed"
        else:
            entry.status = "stopped"
            entry.stop_reason = reason.rule if reason is not None else ("asha" if self.study.spec.search == "asha" else
                                                                        "stopped")
        self.spent += entry.cost
        entry.spent_after = self.spent
        if entry.inner_id is not None:
            final = {**(result or {}), "hpo/cost": entry.cost, "rollouts": entry.reached}
            if records:
                final[metric] = entry.value
            self.inner.on_trial_complete(entry.inner_id, self._as_gain(key, final), error=error and not records)
        point = {"trial": key, "spent": self.spent, "incumbent": self.incumbent(),
                 "best_any": max((t.best for t in self.trials.values() if t.best is not None), default=None)}
        self.trajectory.append(point)
        self.save_state()
        self._mlflow(entry, reason)
        incumbent = point["incumbent"]
        shown = f"{entry.value:.3f}" if entry.value is not None else "no eval"
        self.log(f"[hpo] {key} {entry.status} ({entry.stop_reason}) at {entry.reached:,}/{entry.budget:,} rollouts: "
                 f"{self.study.spec.metric}@{self.study.k} {shown} | cost {entry.cost:,.0f} | spent "
                 f"{self.spent:,.0f}/{self.study.study_budget:,.0f} ({self.spent / self.study.study_budget:.0%}) | "
                 f"incumbent at {self.study.target}: " + (f"{incumbent:.3f}" if incumbent is not None else "none yet"))

    def _mlflow(self, entry: TrialEntry, reason) -> None:
        """Tag the trial's child run (stop reason, cost) and close it; the incumbent on the parent run."""
        from mlflow.entities import Metric

        if self._client is None:
            self._client = tracking.client(self.uri)
        client = self._client
        run = tracking.find_child(client, self.study.sweep_id, entry.key)
        if run is not None:
            tags = {"isosweep.stop_reason": entry.stop_reason, "isosweep.hpo.cost": f"{entry.cost:.1f}",
                    "isosweep.hpo.reached_rollouts": str(entry.reached)}
            if reason is not None:
                tags["isosweep.stop_detail"] = str(reason)[:5000]
            for name, value in tags.items():
                client.set_tag(run.info.run_id, name, value)
            if run.info.status == "RUNNING":  # a stopped trial's function was ended before it could close its run
                tracking.TrialLogger(self.uri, run.info.run_id, trial_dir(self.sweep_out, entry.key), self.study.k).catch_up()
                client.set_terminated(run.info.run_id, status="FAILED" if entry.status == "failed" else "FINISHED")
        now = int(time.time() * 1000)
        step = int(round(self.spent))
        metrics = [Metric("hpo/spent", self.spent, now, len(self.trajectory)),
                   Metric("hpo/trial_cost", entry.cost, now, step)]
        if entry.value is not None:
            metrics.append(Metric(f"hpo/trial_{tracking.mlflow_name(self.study.spec.metric)}", entry.value, now, step))
        incumbent = self.incumbent()
        if incumbent is not None:
            metrics.append(Metric("hpo/incumbent", incumbent, now, step))
        best_any = self.trajectory[-1]["best_any"]
        if best_any is not None:
            metrics.append(Metric("hpo/best_any_size", best_any, now, step))
        client.log_batch(self.parent_id, metrics=metrics)


def _wait_for_stop(out: Path, timeout_s: float = 30.0, idle_s: float = 3.0) -> None:
    """Wait until the trial in ``out`` has seen its STOP file (its log says so), has trained nothing for
    ``idle_s`` (Tune's stop took its Ray Train job down with it) or ``timeout_s`` passed, so that the
    cost charged includes every step it trained."""
    from isosweep.trial import STEPS_FILE

    deadline = time.monotonic() + timeout_s
    log, steps = out / "trial.log", out / STEPS_FILE
    while time.monotonic() < deadline:
        if not log.exists() or "[trial] stopped at step" in log.read_text():
            return
        if not steps.exists() or time.time() - steps.stat().st_mtime > idle_s:
            return
        time.sleep(0.2)


# ------------------------------------------------------------------------------------- promotion


def latest_checkpoint(out: Path) -> Path | None:
    from isosweep.trial import _checkpoint_dirs

    found = _checkpoint_dirs(Path(out))
    return found[-1] if found else None


def promote(source: Path, dest: Path) -> int:
    """Start trial directory ``dest`` from ``source``'s latest checkpoint; returns the rollouts it holds.

    Copies (hard-links where the filesystem allows) the checkpoint and the records and per-step
    statistics up to it, so that the training loop resumes at that step in ``dest`` and the
    source trial stays as it was."""
    import torch

    from isosweep.trial import CHECKPOINTS, METRICS_FILE, STATE_FILE, STEPS_FILE, read_records, read_steps

    checkpoint = latest_checkpoint(source)
    if checkpoint is None:
        raise FileNotFoundError(f"{source}: no checkpoint to promote from")
    record = torch.load(checkpoint / STATE_FILE, weights_only=False)["record"]
    if dest.exists() and latest_checkpoint(dest) is not None:  # promoted before (a resumed study)
        return int(torch.load(latest_checkpoint(dest) / STATE_FILE, weights_only=False)["record"]["rollouts"])
    tmp = dest.with_name(f".{dest.name}.promote")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / CHECKPOINTS).mkdir(parents=True)
    shutil.copytree(checkpoint, tmp / CHECKPOINTS / checkpoint.name, copy_function=_link_or_copy)
    records = [r for r in read_records(source) if r["step"] <= record["step"]]
    steps = [r for r in read_steps(source) if r["step"] <= record["step"]]
    (tmp / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp / STEPS_FILE).write_text("".join(json.dumps(r) + "\n" for r in steps))
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return int(record["rollouts"])


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


# ------------------------------------------------------------------------------------- the run


def make_searcher(study: HPOStudy):
    """The inner searcher of ``study.spec.search`` (the study budget is kept by :class:`StudySearch`)."""
    from isosweep.hpo.searcher import JFHPOSearcher, RandomSearcher

    spec = study.spec
    common = dict(study_budget=None, cost_fn=lambda config, result: float(result["hpo/cost"]), seed=spec.seed)
    if spec.search == "jfhpo":
        return JFHPOSearcher(study.space, study.metric, "max", n_init=spec.jfhpo.n_init,
                             num_restarts=spec.jfhpo.num_restarts, raw_samples=spec.jfhpo.raw_samples, **common)
    return RandomSearcher(study.space, study.metric, "max", **common)


def make_stopper(study: HPOStudy):
    from isosweep.hpo.stopping import DynamicsStopper

    s = study.spec.stopping
    return DynamicsStopper(tau1=s.tau1, k=s.k, tau2=s.tau2, grace=None if s.grace is None else s.grace * study.budget,
                           kl_floor=s.kl_floor)


def run_hpo(study: HPOStudy, runs_root: str | Path = "runs/sweeps", dashboards: str | Path | None = "dashboards",
            address: str | None = None, log: Callable[[str], None] = say, progress_every_s: float = 30.0
            ) -> dict | None:
    """Run (or resume) ``study``; returns its summary (see :func:`summary`), or None if interrupted."""
    from isosweep.launch import ray_init
    from isosweep.profiles import get_profile
    from isosweep.sweep import fit_trials, max_concurrency

    sweep_out = (Path(runs_root) / study.sweep_id).resolve()
    sweep_out.mkdir(parents=True, exist_ok=True)
    uri = tracking.ensure_server(log)
    client = tracking.client(uri)
    spec = study.spec
    tags = {"isosweep.study": "hpo", "isosweep.search": spec.search, "isosweep.metric": study.metric,
            "isosweep.out": str(sweep_out), "isosweep.target": study.target, "mlflow.note.content": spec.description}
    params = {"sweep.file": str(study.path), "sweep.budget": study.budget, "hpo.study_budget": study.study_budget,
              "hpo.sizes": json.dumps(study.space.sizes), "hpo.budget_range": f"{study.space.budget_min}-{study.space.budget_max}",
              **tracking.flatten(spec.model_dump(mode="json"), "spec.")}
    parent_id = tracking.open_study_parent(client, study.sweep_id, tags, params)
    stopper = make_stopper(study)
    search = StudySearch(study, make_searcher(study), sweep_out, uri, parent_id, reasons=stopper.reason, log=log)
    state_file = sweep_out / STATE_FILE
    if state_file.exists():
        search.load_state(pickle.loads(state_file.read_bytes()))
    log(f"[hpo] {study.sweep_id}: {spec.search} over {', '.join(study.space.names)}; sizes "
        f"{' < '.join(study.space.sizes)} (target {study.target}), budgets {study.space.budget_min:,}..{study.budget:,} "
        f"rollouts; study budget {study.study_budget:,.0f} target-equivalent rollouts "
        f"({study.study_budget / study.cost(study.target, study.budget):.1f} full-fidelity trials)")
    log(f"[hpo] MLflow: {uri} (experiment '{tracking.EXPERIMENT}', parent run {parent_id}); output {sweep_out}")
    if search.trials:
        log(f"[hpo] resuming: {len(search.trials)} trials so far, {len(search._queue)} to continue, "
            f"{search.spent:,.0f} spent")
    if not search.finished:
        started = ray_init(address, log_to_driver=False)
        try:
            import ray

            probe = study.trial_config({k: r.low for k, r in spec.space.items()}, study.target, study.budget)
            concurrency = max_concurrency([probe], ray.cluster_resources(), study.path, limit=spec.max_trials)
            driver = get_profile(probe.profile).driver
            log(f"[hpo] up to {concurrency} trials at a time (each: {resources_of(probe)} of Ray's "
                f"{ray.cluster_resources().get('CPU', 0):g} CPU)")
            scheduler = None
            if spec.search == "asha":
                from isosweep.hpo.searcher import asha_scheduler

                scheduler = asha_scheduler(study.space, study.metric, "max", time_attr="rollouts",
                                           reduction_factor=spec.asha.reduction_factor)
            fit_trials(sweep_out, driver, concurrency, [_progress(search, log, progress_every_s)], stop=stopper,
                       search_alg=search, scheduler=scheduler, num_samples=-1)
        except KeyboardInterrupt:
            pass
        finally:
            if started:
                import ray

                ray.shutdown()
    if not search.finished or search.running:
        search.save_state()
        client.update_run(parent_id, status="KILLED")
        log(f"[hpo] interrupted: {len(search.trials)} trials so far, {len(search.running)} unfinished, "
            f"{search.spent:,.0f} of {study.study_budget:,.0f} spent; run the same command again to continue")
        return None
    result = summary(search)
    write_summary(result, sweep_out / "hpo", client, parent_id, dashboards and Path(dashboards) / spec.name, log)
    client.set_terminated(parent_id, status="FINISHED")
    return result


def _progress(search: StudySearch, log: Callable[[str], None], every_s: float):
    from ray import tune

    class Progress(tune.Callback):
        def __init__(self):
            self.start, self.last = time.monotonic(), 0.0

        def on_step_end(self, iteration, trials, **info):
            now = time.monotonic()
            if now - self.last < every_s:
                return
            self.last = now
            study = search.study
            incumbent = search.incumbent()
            done = sum(t.status != "running" for t in search.trials.values())
            log(f"[hpo] {done} trials finished, {len(search.running)} running | spent {search.spent:,.0f} + "
                f"{search.committed:,.0f} committed of {study.study_budget:,.0f} | incumbent at {study.target}: "
                + (f"{incumbent:.3f}" if incumbent is not None else "none yet")
                + f" | elapsed {_duration(now - self.start)}")

        def on_trial_error(self, iteration, trials, trial, **info):
            key = trial.config["trial"]["key"]
            log(f"[hpo] trial {key} FAILED (its checkpoints and MLflow run are kept): see "
                f"{trial.config['trial']['out']}/trial.log and {trial.local_path}")

    return Progress()


# ------------------------------------------------------------------------------------- summary


def summary(search: StudySearch) -> dict[str, Any]:
    """The study as data: every trial, the incumbent over spent compute, the recommendation."""
    study = search.study
    target_trials = [t for t in search.trials.values() if t.size == study.target and t.best is not None]
    best_target = max(target_trials, key=lambda t: t.best, default=None)
    recommended = search.inner.recommend()
    from isosweep.trial import read_records

    base = next((records[0][study.metric] for t in search.trials.values() if t.size == study.target
                 for records in [read_records(trial_dir(search.sweep_out, t.key))] if records), None)
    return {
        "sweep_id": study.sweep_id, "search": study.spec.search, "seed": study.spec.seed, "metric": study.metric,
        "target": study.target, "budget": study.budget, "study_budget": study.study_budget,
        "cost_units": "target-equivalent rollouts: rollouts x params / params(target), plus "
                      f"{study.spec.cost.per_trial:g} x C per trial",
        "spent": search.spent, "target_base": base, "trials": [asdict(t) for t in search.trials.values()],
        "trajectory": search.trajectory,
        "best_target": None if best_target is None else {"trial": best_target.key, "value": best_target.best,
                                                         "params": best_target.params},
        "recommended": None if recommended is None else study.space.hparams(recommended),
        "by_size": {size: sum(t.size == size for t in search.trials.values()) for size in study.space.sizes},
        "promoted": sum(t.promoted_from is not None for t in search.trials.values()),
        "stopped": {reason: sum(t.stop_reason == reason for t in search.trials.values())
                    for reason in sorted({t.stop_reason for t in search.trials.values()})},
    }


def table_text(result: dict[str, Any]) -> str:
    """The trials of a study as a fixed-width table, then the incumbent and the recommendation."""
    metric = result["metric"].split("/")[1]
    names = list(result["trials"][0]["params"]) if result["trials"] else []
    short = [n.split(".")[-1] for n in names]
    head = (f"{'trial':<28} {'size':<10} {'budget':>7} {'reached':>7} "
            + " ".join(f"{s:>10}" for s in short)
            + f" {metric:>9} {'best':>6} {'cost':>8} {'spent':>9}  stop / promoted from")
    lines = [f"HPO study {result['sweep_id']} ({result['search']}): {len(result['trials'])} trials, spent "
             f"{result['spent']:,.0f} of {result['study_budget']:,.0f} ({result['cost_units']})", head]
    for t in result["trials"]:
        value = "-" if t["value"] is None else f"{t['value']:.3f}"
        best = "-" if t["best"] is None else f"{t['best']:.3f}"
        lines.append(f"{t['key']:<28} {t['size']:<10} {t['budget']:>7} {t['reached']:>7} "
                     + " ".join(f"{t['params'][n]:>10.3g}" for n in names)
                     + f" {value:>9} {best:>6} {t['cost']:>8,.0f} {t['spent_after'] or 0:>9,.0f}  {t['stop_reason']}"
                     + (f" / {t['promoted_from']}" if t["promoted_from"] else ""))
    bt = result["best_target"]
    lines.append("")
    lines.append(f"best {metric} at the target ({result['target']}): "
                 + (f"{bt['value']:.3f} by {bt['trial']} " + ", ".join(f"{k}={v:.3g}" for k, v in bt['params'].items())
                    if bt else "none (no target-size trial evaluated)"))
    if result["recommended"]:
        lines.append("recommended configuration for the target: "
                     + ", ".join(f"{k}={v:.3g}" for k, v in result["recommended"].items()))
    return "\n".join(lines)


def write_summary(result: dict[str, Any], out: Path, client, parent_id: str, dashboards: Path | None,
                  log: Callable[[str], None] = say) -> None:
    """``hpo.json``, ``trials.txt`` and ``incumbent.png`` to ``out`` (and ``dashboards``), logged to the parent run."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = table_text(result)
    (out / "hpo.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "trials.txt").write_text(text + "\n")
    plot_trajectories({result["search"]: [result]}, out / "incumbent.png", title=result["sweep_id"])
    for path in sorted(out.iterdir()):
        client.log_artifact(parent_id, str(path), artifact_path="hpo")
    if result["recommended"]:
        client.set_tag(parent_id, "isosweep.recommended", json.dumps(result["recommended"]))
    if result["best_target"]:
        client.set_tag(parent_id, "isosweep.best_target", f"{result['best_target']['value']:.4f} "
                                                          f"({result['best_target']['trial']})")
    if dashboards:
        dashboards.mkdir(parents=True, exist_ok=True)
        for path in out.iterdir():
            shutil.copy2(path, dashboards / path.name)
    log("")
    log(text)
    log("")
    log(f"[hpo] summary, table and plot: {out}" + (f" and {dashboards}" if dashboards else "")
        + f"; in MLflow on parent run {parent_id} (artifacts/hpo, metric hpo/incumbent over spent compute)")


def plot_trajectories(studies: dict[str, list[dict[str, Any]]], path: Path, title: str = "",
                      threshold: float | None = None) -> Path:
    """Incumbent (best target-size eval so far) against spent compute, one line per study, a colour per method."""
    from isosweep.analysis import _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = {"jfhpo": "tab:blue", "random": "tab:orange", "asha": "tab:green"}
    for method, results in studies.items():
        for i, result in enumerate(results):
            xs, ys = [0.0], [math.nan]
            for point in result["trajectory"]:
                xs.append(point["spent"])
                ys.append(math.nan if point["incumbent"] is None else point["incumbent"])
            ax.step(xs, ys, where="post", color=colours.get(method), alpha=0.85,
                    label=method if i == 0 else None)
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle=":", label=f"threshold {threshold:.3f}")
    any_result = next(iter(next(iter(studies.values()))))
    ax.set_xlabel(f"spent compute (target-equivalent rollouts; C = {any_result['budget']:,})")
    ax.set_ylabel(f"best {any_result['metric']} at {any_result['target']}")
    ax.set_title(title or "incumbent over spent compute")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
