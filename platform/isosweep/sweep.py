"""Run a sweep: Ray Tune over the grid, one Ray Train trial per point, MLflow runs, the frontier at the end.

    sweep file ─► Sweep (validated, one TrialConfig per grid point)
               ─► MLflow parent run (found again by its sweep id on a re-run)
               ─► Ray Tune grid over the unfinished points, at most `concurrency` at once
                    each Tune trial = tune_trial(): open/continue the child run, then a
                    TorchTrainer (Train V2) whose rank-0 worker logs every eval to it;
                    TuneReportCallback forwards the evals to Tune (progress line)
               ─► frontier analysis read back from MLflow alone (as `isosweep frontier` does)
               ─► table printed, CSV/JSON/PNG/HTML on the parent run and in dashboards/<name>/

Resuming. A sweep's state is its trial directories (``runs/sweeps/<sweep-id>/trials/<key>``:
checkpoints and ``metrics.jsonl``) and its MLflow runs, not Tune's experiment snapshot: a
re-run of the same command skips trials whose metrics reach their last step, restarts the
others from their latest checkpoint (no eval point repeated or lost) and continues their
MLflow runs. That holds after Ctrl-C and after a killed driver alike.

Concurrency. In the Train V2 pattern a Tune trial only holds its driver's share (a fraction
of a CPU); its Ray Train workers and rollout actors ask for theirs when the trial starts. So
the number of trials Tune runs at once is set from the cluster's resources and one trial's
total (the hardware profile's driver + trainer + rollout actors): more would start trials
that then wait for workers that cannot be placed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

from isosweep import config as C
from isosweep import tracking
from isosweep.analysis import Analysis, Curve, analyse, table_text, write_outputs
from isosweep.config import ConfigError, TrialConfig
from isosweep.profiles import get_profile, trial_resources
from isosweep.sweepspec import Sweep

TRIALS = "trials"
def say(*args, **kwargs) -> None:
    """``print`` that flushes: progress lines reach a log file or a pipe as they happen, not when a buffer
    fills. A module-level function, so Tune can pickle what refers to it (a ``partial`` of ``print``
    cannot be pickled once Ray has swapped ``builtins.print`` in the driver)."""
    print(*args, flush=True, **kwargs)


def trial_dir(sweep_out: Path, key: str) -> Path:
    return Path(sweep_out) / TRIALS / key


def is_finished(out: Path, cfg: TrialConfig) -> bool:
    """Whether the trial in ``out`` has evaluated at its last step."""
    from isosweep.trial import read_records

    records = read_records(out)
    return bool(records) and records[-1]["step"] == C.steps(cfg)


def resources_of(cfg: TrialConfig) -> dict[str, float]:
    """One trial's Ray resources in total: driver + trainer + its vLLM actors (none with hf)."""
    profile = get_profile(cfg.profile)
    actors = cfg.rollout.actors if cfg.rollout.engine == "vllm" else 0
    return trial_resources(profile, cfg.trainer.num_workers, actors)


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


def tune_trial(config: dict) -> None:
    """The Tune function of one grid point: continue its MLflow run, then run its TorchTrainer.

    A point that already reached its last step (an earlier run of the sweep) only catches its
    MLflow run up and reports its last record: nothing is trained again.
    """
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    from isosweep.launch import make_torch_trainer
    from isosweep.trial import STOP_FILE, read_records

    cfg = TrialConfig.model_validate(config["cfg"])
    out = Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    uri = config["tracking_uri"]
    client = tracking.client(uri)
    run_id = tracking.open_child(client, config["parent_run_id"], config["sweep_id"], config["key"], cfg,
                                 config["config_key"])
    for name, value in config.get("tags", {}).items():  # an HPO trial's fidelity and promotion
        client.set_tag(run_id, name, str(value))
    logger = tracking.TrialLogger(uri, run_id, out, cfg.eval.k)
    logger.catch_up()
    if is_finished(out, cfg) or (out / STOP_FILE).exists():  # finished, or stopped early by an HPO study
        records = read_records(out)
        tune.report({**(records[-1] if records else {}), "isosweep/skipped": 1})
        logger.finish("FINISHED")
        return
    trainer = make_torch_trainer(cfg, out, tracking={"uri": uri, "run_id": run_id},
                                 callbacks=[TuneReportCallback()], name=config["key"])
    try:
        trainer.fit()
    except BaseException as err:
        if is_finished(out, cfg) or (out / STOP_FILE).exists():
            # Tune ended this function after the trial's last report or after an early stop (an HPO
            # study): its Ray Train job went down with it, as it should
            logger.catch_up()
            logger.finish("FINISHED")
            return
        logger.finish("FAILED", reason=f"{type(err).__name__}: {err}")
        raise
    logger.catch_up()
    logger.finish("FINISHED")


def _progress_callback(sweep: Sweep, sweep_out: Path, log: Callable[[str], None], every_s: float):
    from ray import tune

    metric = sweep.metric
    total = {p.key: C.steps(p.cfg) * p.cfg.Bp * p.cfg.n for p in sweep.trials}

    class Progress(tune.Callback):
        """One line per finished trial or error, and a status line every ``every_s`` seconds."""

        def __init__(self):
            from isosweep.trial import read_records

            self.start = time.monotonic()
            self.last = 0.0
            self.rollouts = {}
            self.best = (None, -math.inf)
            for point in sweep.trials:
                records = read_records(trial_dir(sweep_out, point.key))
                self.rollouts[point.key] = records[-1]["rollouts"] if records else 0
                for r in records:
                    if r[metric] > self.best[1]:
                        self.best = (point.key, r[metric])
            self.at_start = sum(self.rollouts.values())
            self.done = {p.key for p in sweep.trials if is_finished(trial_dir(sweep_out, p.key), p.cfg)}
            self.failed = set()

        def status(self, running: int) -> str:
            elapsed = time.monotonic() - self.start
            done_rollouts = sum(self.rollouts.values())
            rate = (done_rollouts - self.at_start) / elapsed if elapsed > 0 else 0
            left = sum(total.values()) - done_rollouts
            # the first evaluations come before most of a trial's start-up cost: no estimate from them
            settled = done_rollouts - self.at_start >= 0.05 * sum(total.values())
            eta = f"~{_duration(left / rate)} left" if settled and rate > 0 and left > 0 else "estimating time left"
            best = f"best {metric} {self.best[1]:.3f} ({self.best[0]})" if self.best[0] else "no eval yet"
            return (f"[sweep] {len(self.done)}/{len(total)} trials done, {running} running, "
                    f"{len(self.failed)} failed | {done_rollouts:,}/{sum(total.values()):,} rollouts | {best} | "
                    f"elapsed {_duration(elapsed)}, {eta}")

        def on_trial_result(self, iteration, trials, trial, result, **info):
            key = trial.config["trial"]["key"]
            if "rollouts" in result:
                self.rollouts[key] = max(self.rollouts[key], int(result["rollouts"]))
            if result.get(metric, -math.inf) > self.best[1]:
                self.best = (key, result[metric])

        def on_trial_complete(self, iteration, trials, trial, **info):
            key = trial.config["trial"]["key"]
            self.done.add(key)
            self.rollouts[key] = total[key]
            log(f"[sweep] trial {key} finished")
            log(self.status(self.running(trials)))

        def running(self, trials) -> int:
            return sum(t.status == "RUNNING" and t.config["trial"]["key"] not in self.done | self.failed for t in trials)

        def on_trial_error(self, iteration, trials, trial, **info):
            key = trial.config["trial"]["key"]
            self.failed.add(key)
            log(f"[sweep] trial {key} FAILED (its checkpoints and MLflow run are kept; re-run to retry): "
                f"see {trial_dir(sweep_out, key)}/trial.log and {trial.local_path}")

        def on_step_end(self, iteration, trials, **info):
            now = time.monotonic()
            if now - self.last >= every_s:
                self.last = now
                log(self.status(self.running(trials)))

    return Progress()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def run_sweep(sweep: Sweep, runs_root: str | Path = "runs/sweeps", dashboards: str | Path | None = "dashboards",
              address: str | None = None, log: Callable[[str], None] = say, progress_every_s: float = 30.0
              ) -> Analysis | None:
    """Run (or resume) ``sweep``; returns the frontier analysis, or None if it was interrupted."""
    from ray import tune

    from isosweep.launch import ray_init

    sweep_out = (Path(runs_root) / sweep.sweep_id).resolve()
    sweep_out.mkdir(parents=True, exist_ok=True)
    uri = tracking.ensure_server(log)
    client = tracking.client(uri)
    parent_id = tracking.open_parent(client, sweep, sweep_out)
    pending = [p for p in sweep.trials if not is_finished(trial_dir(sweep_out, p.key), p.cfg)]
    log(f"[sweep] {sweep.sweep_id}: {sweep.spec.study} study, {len(sweep.trials)} trials at C = {sweep.budget:,} "
        f"rollouts each ({len(sweep.trials) - len(pending)} already finished); output {sweep_out}")
    log(f"[sweep] MLflow: {uri} (experiment '{tracking.EXPERIMENT}', parent run {parent_id})")
    interrupted = False
    if pending:
        started = ray_init(address, log_to_driver=False)
        try:
            import ray

            concurrency = max_concurrency([p.cfg for p in sweep.trials], ray.cluster_resources(), sweep.path)
            driver = get_profile(sweep.trials[0].cfg.profile).driver
            log(f"[sweep] {len(pending)} trials to run, {concurrency} at a time "
                f"(each: {resources_of(pending[0].cfg)} of Ray's {ray.cluster_resources().get('CPU', 0):g} CPU)")
            points = [{"key": p.key, "config_key": p.config_key, "cfg": p.cfg.model_dump(mode="json"),
                       "out": str(trial_dir(sweep_out, p.key)), "sweep_id": sweep.sweep_id,
                       "parent_run_id": parent_id, "tracking_uri": uri} for p in pending]
            results = fit_trials(sweep_out, driver, concurrency,
                                 [_progress_callback(sweep, sweep_out, log, progress_every_s)],
                                 param_space={"trial": tune.grid_search(points)})
            interrupted = not results.errors  # Tune stops gracefully on Ctrl-C and returns
        except KeyboardInterrupt:
            interrupted = True
        finally:
            if started:
                import ray

                ray.shutdown()
    unfinished = [p.key for p in sweep.trials if not is_finished(trial_dir(sweep_out, p.key), p.cfg)]
    if unfinished:
        client.update_run(parent_id, status="KILLED" if interrupted else "FAILED")
        log(f"[sweep] {'interrupted' if interrupted else 'incomplete'}: {len(unfinished)} of "
            f"{len(sweep.trials)} trials not finished ({', '.join(unfinished)}); run the same command again to "
            "resume them from their checkpoints")
        return None
    analysis = frontier_report(uri, sweep.sweep_id, sweep_out / "frontier", dashboards and Path(dashboards) / sweep.spec.name,
                               log=log)
    client.set_terminated(parent_id, status="FINISHED")
    return analysis


def fit_trials(sweep_out: Path, driver, concurrency: int, callbacks: list, param_space: dict | None = None,
               stop=None, **tune_config):
    """Run :func:`tune_trial` on Ray Tune for a sweep or an HPO study; returns Tune's results.

    Each trial reserves ``driver`` (its hardware profile's driver resources) and is named by its key;
    each run of the same sweep is a new Tune experiment ``attempt-N`` under ``sweep_out/tune``.
    ``tune_config`` adds ``TuneConfig`` arguments (an HPO study's searcher and scheduler).
    """
    from ray import tune

    attempt = len(list((sweep_out / "tune").glob("attempt-*"))) if (sweep_out / "tune").exists() else 0
    tuner = tune.Tuner(
        tune.with_resources(_flat(tune_trial), {"CPU": driver.CPU, "GPU": driver.GPU}),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            max_concurrent_trials=concurrency,
            trial_name_creator=lambda t: t.config["trial"]["key"],
            trial_dirname_creator=lambda t: t.config["trial"]["key"], **tune_config),
        run_config=tune.RunConfig(
            name=f"attempt-{attempt}", storage_path=str(sweep_out / "tune"), verbose=0, stop=stop,
            callbacks=callbacks, failure_config=tune.FailureConfig(max_failures=1)),
    )
    return tuner.fit()


def _flat(fn):
    """Tune passes ``{"trial": point}``; the trial function takes the point."""
    def trial(config: dict) -> None:
        fn(config["trial"])

    trial.__name__ = "isosweep_trial"
    return trial


# --------------------------------------------------------------------------------- analysis


def curves_from_mlflow(client, sweep_id: str, k: int) -> list[Curve]:
    """Every child run of ``sweep_id`` as a :class:`Curve` (eval metrics at step = rollouts)."""
    runs = client.search_runs([tracking.experiment_id(client)],
                              filter_string=f"tags.`{tracking.SWEEP_TAG}` = '{sweep_id}' and tags.`isosweep.kind` = 'trial'",
                              max_results=10_000)
    curves = []
    for run in sorted(runs, key=lambda r: r.data.tags[tracking.TRIAL_TAG]):
        params = run.data.params
        values, compute = {}, None
        for name in ("mean", "best", "worst"):
            history = sorted(client.get_metric_history(run.info.run_id, tracking.mlflow_name(f"eval/{name}@{k}")), key=lambda m: m.step)
            if not history:
                break
            steps = [m.step for m in history]
            if compute is None:
                compute = steps
            elif steps != compute:
                raise RuntimeError(f"run {run.info.run_id}: eval metrics logged at different steps")
            values[f"{name}@{k}"] = [m.value for m in history]
        if not values:
            continue
        import numpy as np

        curves.append(Curve(
            key=run.data.tags[tracking.TRIAL_TAG], config=run.data.tags["isosweep.config"],
            fields={"n": int(params["n"]), "Bp": int(params["Bp"]), "M": int(params["derived.M"]),
                    "seed": int(params["seed"])},
            compute=np.asarray(compute, dtype=float),
            values={name: np.asarray(v, dtype=float) for name, v in values.items()}))
    return curves


def frontier_report(uri: str, sweep_id: str, out: str | Path | None, dashboards: str | Path | None = None,
                    log: Callable[[str], None] = say, prefix: bool = False,
                    runs_root: str | Path = "runs/sweeps") -> Analysis:
    """The frontier analysis of a sweep from its MLflow runs alone: fit, print, write, log to the parent run.

    ``sweep_id`` may be a prefix of the id (the newest matching sweep) with ``prefix=True``;
    ``out=None`` writes to ``runs_root/<sweep id>/frontier``.
    """
    client = tracking.client(uri)
    parent = tracking.find_parent(client, sweep_id, prefix=prefix)
    if parent is None:
        raise ConfigError(f"no sweep {sweep_id!r} in MLflow at {uri} (experiment '{tracking.EXPERIMENT}')")
    tags, params = parent.data.tags, parent.data.params
    sweep_id = tags[tracking.SWEEP_TAG]
    if tags.get("isosweep.study") == "hpo":
        raise ConfigError(f"{sweep_id} is an HPO study, not a grid sweep: it has no frontier; its summary is the "
                          f"artifact hpo/trials.txt of parent run {parent.info.run_id} (and runs/sweeps/{sweep_id}/hpo/)")
    out = Path(runs_root) / sweep_id / "frontier" if out is None else Path(out)
    metric = tags["isosweep.metric"]
    k = int(metric.split("@")[1])
    curves = curves_from_mlflow(client, sweep_id, k)
    analysis = analyse(curves, title=sweep_id, study=tags["isosweep.study"], budget=int(params["sweep.budget"]),
                       primary=metric.split("/")[1], points=int(params["spec.frontier.points"]),
                       bootstrap=int(params["spec.frontier.bootstrap"]))
    paths = write_outputs(analysis, out)
    for path in paths.values():
        client.log_artifact(parent.info.run_id, str(path), artifact_path="frontier")
    _log_frontier_metrics(client, parent.info.run_id, analysis)
    if dashboards:
        write_outputs(analysis, dashboards)
    log("")
    log(table_text(analysis))
    log("")
    log(f"[sweep] frontier table, fits and plots: {Path(out)}"
        + (f" and {Path(dashboards) / 'report.html'}" if dashboards else "")
        + f"; in MLflow on parent run {parent.info.run_id} (artifacts/frontier)")
    return analysis


def _log_frontier_metrics(client, run_id: str, analysis: Analysis) -> None:
    """The frontier as metrics of the parent run (step = C), so MLflow charts it too."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = []
    for name, m in analysis.metrics.items():
        for row in m.rows:
            if row["config"] is None:
                continue
            step = int(row["C"])
            metrics.append(Metric(tracking.mlflow_name(f"frontier/{name}"), row["value"], now, step))
            if name == analysis.primary:
                metrics += [Metric("frontier/n_star", row["n"], now, step), Metric("frontier/Bp_star", row["Bp"], now, step)]
    seen = {(m.key, m.step, m.value) for key in {m.key for m in metrics} for m in client.get_metric_history(run_id, key)}
    metrics = [m for m in metrics if (m.key, m.step, m.value) not in seen]  # `isosweep frontier` run again
    for i in range(0, len(metrics), tracking.BATCH):
        client.log_batch(run_id, metrics=metrics[i:i + tracking.BATCH])
    primary = analysis.metrics[analysis.primary]
    saturation = primary.saturation
    client.set_tag(run_id, "isosweep.n_star_saturation",
                   "none (still changing)" if saturation is None else
                   ("no fit" if math.isnan(saturation) else f"{saturation:.0f}"))
    if primary.rows and primary.rows[-1]["config"]:
        client.set_tag(run_id, "isosweep.best_config_at_budget", primary.rows[-1]["config"])
