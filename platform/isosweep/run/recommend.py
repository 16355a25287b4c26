"""``isosweep recommend --budget C``: which allocation to run at C, from the finished sweeps.

    finished grid sweeps (MLflow, or the curves.json of study folders with --from)
        ─► the ones of this task / difficulty / model (and, unless named with --sweeps, the newest
           sweep's method settings)
        ─► the planner (:mod:`isosweep.report.planner`): pooled fits, bootstrap, the answer at C
        ─► printed; logged to MLflow as a run (tags: budget, sweeps; artifacts: JSON, interval plot);
           with --suggest, the sweep that would most shrink its uncertainty, as a YAML for make sweep

Resources and GPU-hours of a sweep (the suggested one included) are ``isosweep sweep FILE --dry-run``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

from isosweep.report import planner as P
from isosweep.spec.values import parse_budget, short_count
from isosweep.spec.yamlio import ConfigError
from isosweep.track.curves import SweepData
from isosweep.track.tags import HPO_STUDY, STUDY_TAG, SWEEP_TAG


def say(line: str) -> None:
    print(line, flush=True)


def from_mlflow(uri: str, sweep_ids: list[str] | None) -> list[SweepData]:
    """The finished grid sweeps in MLflow at ``uri`` (or those named: an id or the start of one), newest first."""
    from isosweep.track import runs  # MLflow

    client = runs.client(uri)
    finished = runs.finished_grid_sweeps(client)
    if not sweep_ids:
        return [runs.read_sweep(client, parent) for parent in finished]
    out = []
    for sweep_id in sweep_ids:
        parent = runs.find_parent(client, sweep_id, prefix=True)
        if parent is None or parent.info.status != "FINISHED" or parent.data.tags.get(STUDY_TAG) == HPO_STUDY:
            there = ", ".join(p.data.tags[SWEEP_TAG] for p in finished) or "none"
            raise ConfigError(f"--sweeps {sweep_id!r}: no finished grid sweep with that id in MLflow at {uri}; "
                              f"finished grid sweeps: {there}")
        out.append(runs.read_sweep(client, parent))
    return out


def from_folders(root: str | Path, sweep_ids: list[str] | None) -> list[SweepData]:
    """The sweeps kept as ``<root>/*/curves.json`` (or those of them named)."""
    if not Path(root).is_dir():
        raise ConfigError(f"--from {str(root)!r}: no such folder")
    found = P.load_folders(root)
    if not sweep_ids:
        return found
    out = []
    for sweep_id in sweep_ids:
        match = [d for d in found if d.sweep_id.startswith(sweep_id)]
        if not match:
            raise ConfigError(f"--sweeps {sweep_id!r}: no such sweep under {root}; there: "
                              f"{[d.sweep_id for d in found] or 'none (no */curves.json)'}")
        out.append(match[0])
    return out


def same_method(sweeps: list[SweepData], log: Callable[[str], None]) -> list[SweepData]:
    """The sweeps run with the method settings of the first (the newest); the others are named and left out."""
    keep = [d for d in sweeps if P.method(d) == P.method(sweeps[0])]
    for d in sweeps:
        if d not in keep:
            diff = {k: (v, P.method(sweeps[0]).get(k)) for k, v in P.method(d).items() if P.method(sweeps[0]).get(k) != v}
            log(f"[recommend] left out {d.sweep_id}: other method settings than {sweeps[0].sweep_id} "
                f"({', '.join(f'{k} {a} vs {b}' for k, (a, b) in diff.items())}); name it with --sweeps to pool it")
    return keep


def recommend(budget: str | int | float, *, uri: str | None = None, folder: str | Path | None = None,
              sweep_ids: list[str] | None = None, task: str | None = None, difficulty: str | None = None,
              model: str | None = None, metric: str = "mean", bootstrap: int = 200, suggest: str | Path | None = None,
              log_to: str | None = None, log: Callable[[str], None] = say) -> P.Recommendation:
    """Plan at ``budget`` from the sweeps of MLflow at ``uri`` or of the study folders under ``folder``;
    print it; write the suggested sweep to ``suggest`` (a path, or a folder for ``next-<difficulty>-<C>.yaml``);
    log it to MLflow at ``log_to`` (None: not logged)."""
    C = parse_budget(budget)
    if metric not in P.METRICS:
        raise ConfigError(f"--metric {metric!r}: allowed {list(P.METRICS)}")
    sweeps = from_folders(folder, sweep_ids) if folder is not None else from_mlflow(uri, sweep_ids)
    kinds = {tuple(P.identity(d).values()) for d in sweeps}
    if not sweep_ids and task is None and difficulty is None and model is None and len(kinds) > 1:
        first = P.identity(sweeps[0])
        task, difficulty, model = first["task.name"], first["task.difficulty"], first["model.name"]
        log(f"[recommend] planning for task {task}, difficulty {difficulty}, model {model} (the newest sweep's, "
            f"{sweeps[0].sweep_id}); the sweeps are of {len(kinds)} kinds: choose with --task/--difficulty/--model")
    chosen = P.select(sweeps, task=task, difficulty=difficulty, model=model, explicit=bool(sweep_ids))
    if not sweep_ids:
        chosen = same_method(chosen, log)
    planner = P.Planner(chosen, metric, bootstrap=bootstrap)
    rec = planner.at(C)
    log(P.text(rec))
    files = []
    with tempfile.TemporaryDirectory() as tmp:
        if suggest is not None:
            spec, why = P.suggestion(planner, rec)
            target = Path(suggest)
            if target.is_dir() or not target.suffix:
                target = target / f"{spec['name']}.yaml"
            path = P.write_suggestion(spec, why, target)
            log("")
            log(f"[recommend] next sweep: {why}")
            log(f"[recommend] written to {path}: make sweep SWEEP={path}   (its resources and GPU-hours: "
                f"isosweep sweep {path} --dry-run)")
            files.append(path)
        if log_to is not None:
            from isosweep.track import runs  # MLflow

            data = Path(tmp) / f"recommendation-{short_count(int(C)) if C == int(C) else C}.json"
            data.write_text(json.dumps(rec.to_json(), indent=1))
            image = Path(tmp) / "recommendation.png"
            image.write_bytes(P.plot(rec))
            run_id = runs.log_recommendation(runs.client(log_to), rec.to_json(), [data, image, *files])
            log(f"[recommend] logged to MLflow at {log_to}: run {run_id} (experiment '{runs.EXPERIMENT}')")
    return rec
