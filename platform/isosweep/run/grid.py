"""Run a grid sweep: Ray Tune over the grid, one Ray Train trial per point, MLflow runs, the frontier at the end.

    sweep file ─► Sweep (validated, one TrialConfig per grid point)
               ─► MLflow parent run (found again by its sweep id on a re-run)
               ─► the runner core (:mod:`isosweep.run.core`): Ray Tune's grid over the unfinished
                  points, at most as many at once as the cluster fits
               ─► frontier analysis read back from MLflow alone (as `isosweep frontier` does)
               ─► table printed, CSV/JSON/PNG/HTML on the parent run and in runs/sweeps/<sweep id>/frontier/
                  (with ``dashboards``, e.g. `isosweep sweep --dashboards dashboards`, also in
                  dashboards/<name>/), the winner's record checkpoint at each C registered (one registered model
                  per sweep)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from ray import tune

from isosweep.report import planner as P
from isosweep.report.analysis import Analysis, analyse
from isosweep.report.planner import write_sweep_data
from isosweep.report.render import table_text, write_outputs
from isosweep.run.adaptive import run_phases, stopped_trials
from isosweep.run.core import (
    Progress,
    StudyStanding,
    TrialJob,
    TrialsOutcome,
    TrialStanding,
    check_problem_sets,
    duration,
    is_finished,
    live_wanted,
    open_study,
    ray_session,
    run_trials,
    say,
    trial_of,
)
from isosweep.run.lock import release_study
from isosweep.run.plan import check_memory
from isosweep.spec.grid import Sweep
from isosweep.spec.trial import steps
from isosweep.spec.yamlio import ConfigError
from isosweep.track import runs
from isosweep.track.curves import CURVES_FILE, SweepData
from isosweep.track.tags import DIFFICULTY_TAG, HPO_STUDY, METRIC_TAG, STUDY_TAG, SWEEP_TAG


class GridProgress:
    """The progress of a grid sweep: trials done, rollouts done of all, the best eval so far, time left; each
    running trial's rollouts and last eval."""

    def __init__(self, sweep: Sweep, sweep_out: Path, stopped: set[str] = frozenset()) -> None:
        self.metric = sweep.metric
        self.total = {p.key: steps(p.cfg) * p.cfg.Bp * p.cfg.n for p in sweep.trials}
        self.configs = {p.key: p.cfg for p in sweep.trials}
        self.rollouts: dict[str, int] = {}
        self.best: tuple[str | None, float] = (None, -math.inf)
        self.last: dict[str, float] = {}
        """Each trial's last evaluation of ``metric``."""
        self.done: set[str] = set()
        self.trials = {p.key: trial_of(sweep_out, p.key) for p in sweep.trials}
        for point in sweep.trials:
            trial = self.trials[point.key]
            records = trial.records()
            self.rollouts[point.key] = max(records[-1]["rollouts"] if records else 0, trial.last_step_rollouts())
            for r in records:
                self._beat(point.key, r)
            if is_finished(trial, point.cfg):
                self.done.add(point.key)
            elif point.key in stopped:  # an adaptive sweep stopped it: done where it ended
                self.total[point.key] = self.rollouts[point.key]
                self.done.add(point.key)
        self.at_start = sum(self.rollouts.values())

    def _beat(self, key: str, result: dict) -> None:
        if self.metric in result:
            self.last[key] = result[self.metric]
        if result.get(self.metric, -math.inf) > self.best[1]:
            self.best = (key, result[self.metric])

    def result(self, key: str, result: dict) -> None:
        if "rollouts" in result:
            self.rollouts[key] = max(self.rollouts[key], int(result["rollouts"]))
        self._beat(key, result)

    def complete(self, key: str) -> str:
        trial = self.trials[key]
        if not is_finished(trial, self.configs[key]) and trial.pause_at() is not None:
            self.rollouts[key] = max(self.rollouts[key], trial.last_step_rollouts())
            return f"[sweep] trial {key} paused at {self.rollouts[key]:,} rollouts (its rung: {trial.pause_at():,})"
        self.done.add(key)
        self.rollouts[key] = self.total[key]
        return f"[sweep] trial {key} finished"

    def _read_steps(self) -> None:
        """Trials report to Tune only at their evaluations, which are log-spaced: the last interval is half a
        trial. Between them a running trial's own ``steps.jsonl`` says how far it is (where the driver can read
        the trial folders: always on one machine, on a cluster when the runs folder is shared)."""
        for key, trial in self.trials.items():
            if key not in self.done:
                self.rollouts[key] = max(self.rollouts[key], min(trial.last_step_rollouts(), self.total[key]))

    def standing(self, running: int, failed: int, elapsed_s: float) -> StudyStanding:
        self._read_steps()
        total = sum(self.total.values())
        done_rollouts = sum(self.rollouts.values())
        rate = (done_rollouts - self.at_start) / elapsed_s if elapsed_s > 0 else 0
        left = total - done_rollouts
        # the first evaluations come before most of a trial's start-up cost: no estimate from them
        settled = done_rollouts - self.at_start >= 0.05 * total
        return StudyStanding(
            done=done_rollouts, total=total, unit="rollouts", rate=rate,
            left_s=left / rate if settled and rate > 0 and left > 0 else None,
            trials=f"{len(self.done)}/{len(self.total)} trials done, {running} running, {failed} failed",
            best=f"best {self.metric} {self.best[1]:.3f} ({self.best[0]})" if self.best[0] else "no eval yet")

    def trial(self, key: str) -> TrialStanding:
        value = self.last.get(key)
        return TrialStanding(key=key, rollouts=self.rollouts[key], budget=self.total[key],
                             value=f"{self.metric.split('/')[-1]} {value:.3f}" if value is not None else "no eval yet")

    def status(self, running: int, failed: int, elapsed_s: float) -> str:
        s = self.standing(running, failed, elapsed_s)
        return (f"[sweep] {s.trials} | {s.done:,}/{s.total:,} rollouts | {s.best} | elapsed {duration(elapsed_s)}, "
                f"{s.time_left()}")


def run_sweep(sweep: Sweep, runs_root: str | Path = "runs/sweeps", dashboards: str | Path | None = None,
              address: str | None = None, log: Callable[[str], None] = say, progress_every_s: float = 30.0,
              concurrency: int | None = None, live: bool = False) -> Analysis | None:
    """Run (or resume) ``sweep``; returns the frontier analysis, or None if it was interrupted. ``concurrency``:
    at most this many trials at once (default: as many as the cluster fits). A grid point that does not fit its
    profile's GPUs stops it before anything is written (:func:`isosweep.run.plan.check_memory`). ``live``: the
    progress as a live display where stdout is a terminal (:func:`isosweep.run.core.live_wanted`; ``isosweep sweep``
    asks for it unless ``--plain``), else plain lines.

    The report goes beside the trials (``runs_root/<sweep id>/frontier``) and to MLflow; the committed studies
    change only when ``dashboards`` is given (``dashboards/<sweep name>`` then gets it too)."""
    check_memory(sweep)
    check_problem_sets([p.cfg for p in sweep.trials], sweep.path, log)
    sweep_out, uri = open_study(sweep.sweep_id, runs_root, log)
    try:
        return _run_locked(sweep, sweep_out, uri, dashboards, address, log, progress_every_s, concurrency, live)
    finally:
        release_study(sweep_out)


def _run_locked(sweep: Sweep, sweep_out: Path, uri: str, dashboards: str | Path | None, address: str | None,
                log: Callable[[str], None], progress_every_s: float, concurrency: int | None,
                live: bool = False) -> Analysis | None:
    client = runs.client(uri)
    parent_id = runs.open_parent(client, sweep, sweep_out)
    pending = [p for p in sweep.trials if not is_finished(trial_of(sweep_out, p.key), p.cfg)]

    def settle() -> None:  # finished on disk: MLflow may have missed their end (an outage, a killed driver)
        for point in sweep.trials:
            if is_finished(trial_of(sweep_out, point.key), point.cfg):
                runs.settle_finished(client, uri, parent_id, sweep.sweep_id, point.key, point.cfg, point.config_key,
                                     trial_of(sweep_out, point.key), log)

    settle()
    log(f"[sweep] {sweep.sweep_id}: {sweep.spec.study} study, {len(sweep.trials)} trials at C = {sweep.budget:,} "
        f"rollouts each ({len(sweep.trials) - len(pending)} already finished); output {sweep_out}")
    log(f"[sweep] MLflow: {uri} (experiment '{runs.EXPERIMENT}', parent run {parent_id})")
    outcomes: list[TrialsOutcome] = []

    def launch(points: list) -> bool:
        jobs = [TrialJob(key=p.key, config_key=p.config_key, cfg=p.cfg, out=str(trial_of(sweep_out, p.key).path),
                         sweep_id=sweep.sweep_id, parent_run_id=parent_id, tracking_uri=uri) for p in points]
        stopped_now = stopped_trials(sweep, sweep_out) if sweep.spec.adaptive is not None else set()
        progress = Progress(GridProgress(sweep, sweep_out, stopped_now), sweep_out, log, progress_every_s, "sweep",
                            uri=uri, live=live and live_wanted())
        outcomes.append(run_trials(sweep_out, [p.cfg for p in sweep.trials], sweep.path, address, progress, log,
                                   "sweep", limit=concurrency, expected=len(jobs),
                                   param_space={"trial": tune.grid_search([j.to_tune() for j in jobs])}))
        settle()  # trials that ran while MLflow was down: their runs created and caught up now that it answers
        return not outcomes[-1].interrupted

    stopped: set[str] = set()
    if sweep.spec.adaptive is not None:
        with ray_session(address):  # one Ray for every phase: each would start and stop its own
            run_phases(sweep, sweep_out, sweep.spec.adaptive, launch, client, parent_id, log)
        stopped = stopped_trials(sweep, sweep_out)
    elif pending:
        for point in pending:  # a sweep run adaptively before: its trials now run to C
            trial_of(sweep_out, point.key).clear_pause()
        launch(pending)
    outcome = TrialsOutcome(interrupted=any(o.interrupted for o in outcomes))
    # the trial folders say what is done; the outcome says why the rest is not: stopped by the user (KILLED, even
    # if some trials had failed by then), else failed trials (FAILED)
    unfinished = [p.key for p in sweep.trials
                  if not is_finished(trial_of(sweep_out, p.key), p.cfg) and p.key not in stopped]
    if unfinished:
        client.update_run(parent_id, status="KILLED" if outcome.interrupted else "FAILED")
        log(f"[sweep] {'interrupted' if outcome.interrupted else 'incomplete'}: {len(unfinished)} of "
            f"{len(sweep.trials)} trials not finished ({', '.join(unfinished)}); run the same command again to "
            "resume them from their checkpoints")
        return None
    analysis = frontier_report(uri, sweep.sweep_id, sweep_out / "frontier", dashboards and Path(dashboards) / sweep.spec.name,
                               log=log)
    client.set_terminated(parent_id, status="FINISHED")
    return analysis


def check_report_folder(folder: Path, sweep_id: str) -> None:
    """A :class:`ConfigError`, before anything is written, when ``folder`` (``isosweep frontier --dashboards``: the
    sweep's own report folder, where ``isosweep sweep --dashboards`` names the folder above it) holds what the report
    would overwrite: the study report and other studies' folders, or another sweep's or a pooled analysis."""
    others = sorted(p.parent.name for p in folder.glob("*/fits.json"))
    if (folder / "REPORT.md").exists() or others:
        held = ", ".join(["REPORT.md"] * (folder / "REPORT.md").exists() + [f"{o}/" for o in others[:3]])
        raise ConfigError(f"--dashboards {folder} holds the study report and other studies' folders ({held}"
                          f"{', ...' if len(others) > 3 else ''}), which this sweep's report would overwrite: give the "
                          f"sweep's own folder, e.g. --dashboards {folder}/<study>")
    if (folder / "fits.json").exists():
        held = json.loads((folder / "fits.json").read_text())
        pooled = held.get("pooled_from", [])
        if held.get("title") != sweep_id or len(pooled) > 1:
            what = (f"the pooled analysis of {', '.join(pooled)}" if len(pooled) > 1
                    else f"the report of sweep {held.get('title')}")
            raise ConfigError(f"--dashboards {folder} holds {what}, which this sweep's report ({sweep_id}) would "
                              "overwrite: give another folder" + (" (`isosweep report --refresh` redoes pooled "
                                                                 "analyses)" if len(pooled) > 1 else ""))


def frontier_report(uri: str, sweep_id: str, out: str | Path | None, dashboards: str | Path | None = None,
                    log: Callable[[str], None] = say, prefix: bool = False,
                    runs_root: str | Path = "runs/sweeps", data: SweepData | None = None,
                    guard_dashboards: bool = False) -> Analysis:
    """The frontier analysis of a sweep from its MLflow runs alone: fit, print, write, log to the parent run,
    register the winners' checkpoints (:func:`isosweep.track.runs.register_frontier`).

    ``guard_dashboards`` (``isosweep frontier``, where the folder is the user's to name): refuse a ``dashboards``
    folder that holds what the report would overwrite (:func:`check_report_folder`). A sweep's own end writes to
    ``<dashboards>/<sweep name>`` and replaces the report of an earlier budget there.

    ``sweep_id`` may be a prefix of the id (the newest matching sweep) with ``prefix=True``;
    ``out=None`` writes to ``runs_root/<sweep id>/frontier``.
    """
    client = runs.client(uri)
    parent = runs.find_parent(client, sweep_id, prefix=prefix)
    if parent is None:
        raise ConfigError(f"no sweep {sweep_id!r} in MLflow at {uri} (experiment '{runs.EXPERIMENT}')")
    tags, params = parent.data.tags, parent.data.params
    sweep_id = tags[SWEEP_TAG]
    if tags.get(STUDY_TAG) == HPO_STUDY:
        raise ConfigError(f"{sweep_id} is an HPO study, not a grid sweep: it has no frontier; its summary is the "
                          f"artifact hpo/trials.txt of parent run {parent.info.run_id} (and runs/sweeps/{sweep_id}/hpo/)")
    if dashboards and guard_dashboards:
        check_report_folder(Path(dashboards), sweep_id)
    out = Path(runs_root) / sweep_id / "frontier" if out is None else Path(out)
    metric = tags[METRIC_TAG]
    data = data or runs.read_sweep(client, parent)  # the caller may have read it already
    curves = data.curves
    analysis = analyse(curves, title=sweep_id, study=tags[STUDY_TAG], budget=int(params["sweep.budget"]),
                       primary=metric.split("/")[1], points=int(params["spec.frontier.points"]),
                       bootstrap=int(params["spec.frontier.bootstrap"]), difficulty=tags.get(DIFFICULTY_TAG, ""))
    paths = write_outputs(analysis, out)
    paths[CURVES_FILE] = write_sweep_data(data, out)
    for path in paths.values():
        client.log_artifact(parent.info.run_id, str(path), artifact_path="frontier")
    runs.log_frontier(client, parent.info.run_id, analysis)
    registered = runs.register_frontier(client, sweep_id, analysis)
    if dashboards:
        write_outputs(analysis, dashboards)
        write_sweep_data(data, dashboards)
    log("")
    log(table_text(analysis.saved()))
    log("")
    log(f"[sweep] frontier table, fits and plots: {Path(out)} (report {Path(out) / 'report.html'})"
        + (f" and {Path(dashboards) / 'report.html'}" if dashboards else "")
        + f"; in MLflow on parent run {parent.info.run_id} (artifacts/frontier)")
    log(f"[sweep] open it in MLflow's UI: {runs.run_url(uri, client, parent.info.run_id)}")
    if registered:
        name = runs.registered_model_name(sweep_id)
        last = registered[-1]
        log(f"[sweep] the winner's best checkpoint at each C of the table is a version of the registered model {name} "
            f"(alias c<C>, {sum(r['new'] for r in registered)} new); at C = {last['C']:,.0f}: "
            f"models:/{name}@{last['aliases'][-1]} ({last['config']}, trial {last['trial']} at {last['rollouts']:,} "
            "rollouts)")
    return analysis


def folder_sweeps(dashboards: str | Path) -> dict[Path, tuple[str, ...]]:
    """Each study folder directly under ``dashboards`` and the ids of the sweeps its ``fits.json`` was analysed
    from: ``pooled_from`` for a study pooled from parts, else its ``title`` (folders without one are left out)."""
    held = {}
    for fits in sorted(Path(dashboards).glob("*/fits.json")):
        try:
            saved = json.loads(fits.read_text())
        except (OSError, ValueError):
            continue
        ids = saved.get("pooled_from") or ([saved["title"]] if saved.get("title") else [])
        if ids:
            held[fits.parent] = tuple(ids)
    return held


def refresh_dashboards(uri: str, dashboards: str | Path, log: Callable[[str], None] = say) -> list[Path]:
    """Redo, from MLflow, the study folders under ``dashboards`` (what the study report reads); returns the
    folders written.

    A folder is redone from the sweeps its ``fits.json`` names (:func:`folder_sweeps`), so another finished sweep
    of the same name (an older run, or one written to other dashboards) never replaces what it holds; a folder
    whose sweeps MLflow does not hold is left as it is, and says so. A finished sweep whose name has no folder
    yet, and that no folder holds, goes to ``dashboards/<name>/`` (the newest of each name). Then the parts of a
    study run seed by seed that no folder pools yet are pooled (:func:`pool_dashboards`)."""
    client = runs.client(uri)
    dashboards = Path(dashboards)
    finished = {parent.data.tags[SWEEP_TAG]: parent for parent in runs.finished_grid_sweeps(client)}
    todo = folder_sweeps(dashboards)
    claimed = {sweep_id for ids in todo.values() for sweep_id in ids}
    for sweep_id, parent in finished.items():  # newest first
        folder = dashboards / parent.data.params.get("spec.name", sweep_id)
        if folder not in todo and sweep_id not in claimed:
            todo[folder] = (sweep_id,)
    written, single = [], {}
    for folder, ids in sorted(todo.items()):
        missing = [sweep_id for sweep_id in ids if sweep_id not in finished]
        if missing:
            log(f"[report] {folder.name}: left as it was: its sweep(s) {', '.join(missing)} are not among the "
                f"finished sweeps in MLflow at {uri}")
            continue
        try:
            read = {sweep_id: (finished[sweep_id], runs.read_sweep(client, finished[sweep_id])) for sweep_id in ids}
            if len(ids) == 1:
                frontier_report(uri, ids[0], folder, log=lambda _: None, data=read[ids[0]][1])
                single.update(read)
            else:
                groups = P.pool_groups([data for _, data in read.values()])
                if len(groups) != 1 or len(groups[0]) != len(ids):
                    raise ValueError(f"its sweeps {', '.join(ids)} are no longer parts of one study")
                write_sweep_data(read[groups[0][0].sweep_id][1], folder)
                pool_into(groups[0], read, folder)
        except (ValueError, KeyError, RuntimeError, ConfigError) as e:  # one unreadable sweep does not block the rest
            log(f"[report] {folder.name}: sweep(s) {', '.join(ids)} skipped, its folder left as it was "
                f"({type(e).__name__}: {e})")
            continue
        log(f"[report] {folder.name}: sweep(s) {', '.join(ids)} redone from MLflow into {folder}")
        written.append(folder)
    unpooled = {sweep_id: part for sweep_id, part in single.items()
                if not any(sweep_id in ids for ids in todo.values() if len(ids) > 1)}
    return written + pool_dashboards(unpooled, dashboards, log)


def pool_into(group: list[SweepData], read: dict[str, tuple], folder: str | Path) -> Analysis:
    """The frontier analysis of all trials of ``group`` (one study's parts, lowest seed first:
    :func:`isosweep.report.planner.pool_groups`) written to ``folder``, its ``fits.json`` naming the parts
    (``pooled_from``) so the study report counts them once. ``read``: sweep id -> (its parent run, its data)."""
    home, _ = read[group[0].sweep_id]
    tags, params = home.data.tags, home.data.params
    ids = tuple(d.sweep_id for d in group)
    analysis = analyse(P.pooled_curves(group), title=ids[0], study=tags[STUDY_TAG], budget=group[0].budget,
                       primary=tags[METRIC_TAG].split("/")[1], points=int(params["spec.frontier.points"]),
                       bootstrap=int(params["spec.frontier.bootstrap"]), difficulty=tags.get(DIFFICULTY_TAG, ""))
    analysis.pooled_from = ids
    write_outputs(analysis, folder)
    return analysis


def pool_dashboards(read: dict[str, tuple], dashboards: str | Path, log: Callable[[str], None] = say) -> list[Path]:
    """Sweeps that are one study run in parts (another seed run later, as its own sweep: the same study kind,
    budget, grid, task, model and method; :func:`isosweep.report.planner.pool_groups`) analysed as one: the
    frontier of all their trials into the folder of the part with the lowest seed (:func:`pool_into`).
    ``read``: sweep id -> (its parent run, its :class:`SweepData`), as the caller read them. Returns the
    folders written."""
    written = []
    for group in P.pool_groups([d for _, d in read.values()]):
        home, _ = read[group[0].sweep_id]
        folder = Path(dashboards) / home.data.params.get("spec.name", home.data.tags[SWEEP_TAG])
        analysis = pool_into(group, read, folder)
        log(f"[report] {folder.name}: sweeps {', '.join(analysis.pooled_from)} pooled ({len(analysis.curves)} "
            f"trials, seeds {analysis.seeds()}) into {folder}")
        written.append(folder)
    return written
