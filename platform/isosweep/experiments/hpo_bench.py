"""``make hpo-bench``: JF-HPO against its baselines, on a test function and on the tiny family.

(a) ``synthetic``: the two-fidelity Augmented Hartmann function (seconds; also a CI test):
    the cost for JF-HPO and for random search to reach a regret threshold, over seeds.
(b) ``real``: the HPO study of ``sweeps/jfhpo.yaml`` (tiny-5m as the target, tiny-0.3m and
    tiny-1m as proxies) run once per seed with each of ``jfhpo``, ``random`` and ``asha`` at the
    same study budget. For each run: the best target-size evaluation reached, the compute spent
    when the incumbent first reached each threshold (the target base model's eval + a margin),
    how the trials spread over sizes, how many were stopped early and promoted. Each run is an
    ordinary HPO study (its own sweep id, MLflow parent run and trial directories), so an
    interrupted bench re-run continues where it stopped and finished studies are not re-run.

(c) ``table``: the searchers replayed on a table of learning curves (``experiments.hpo_replay``):
    JF-HPO (two size scales), random search, ASHA and Hyperband, 20 searcher seeds each at two
    study budgets, plus the shuffled-proxy control (minutes; needs a finished table).

Every part writes to one JSON file (``bench/hpo.json``); running one part keeps the others' figures.
"""

from __future__ import annotations

import json
import math
import platform as host
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scipy.stats import mannwhitneyu

from isosweep.experiments.hartmann import compare_on_hartmann
from isosweep.experiments.hpo_replay import Curves, search_space, snap
from isosweep.experiments.hpo_replay import run as replay
from isosweep.experiments.hpo_table import cell_trial, config_key, finished, load_table_spec
from isosweep.report.hpo import plot_trajectories
from isosweep.report.tables import fmt
from isosweep.run.core import say
from isosweep.run.hpo import run_hpo
from isosweep.spec.hpo import load_hpo
from isosweep.spec.yamlio import ConfigError
from isosweep.trial.files import TrialDir

METHODS = ("jfhpo", "random", "asha")
MARGINS = (0.01, 0.02)  # thresholds: the target base model's eval + each margin


def synthetic(seeds: list[int], cost_budget: float, threshold: float, log: Callable[[str], None] = say) -> dict:
    rows = compare_on_hartmann(seeds, cost_budget, threshold=threshold, log=log)
    ratios = sorted(row["ratio"] for row in rows.values())
    return {
        "what": "cost (target-trial units) for JF-HPO and random search to reach regret <= threshold on the "
                "two-fidelity Augmented Hartmann function; null = not reached within cost_budget",
        "threshold": threshold, "cost_budget": cost_budget, "seeds": seeds,
        "per_seed": {str(k): {name: (v if math.isfinite(v) else None) for name, v in row.items()}
                     for k, row in rows.items()},
        "median_ratio": ratios[len(ratios) // 2],
    }


def reach(trajectory: list[dict[str, Any]], threshold: float) -> float | None:
    """Spent compute at the first trial completion after which the incumbent is >= ``threshold``."""
    for point in trajectory:
        if point["incumbent"] is not None and point["incumbent"] >= threshold:
            return point["spent"]
    return None


def reevaluate(summaries: dict[str, list[dict]], table: dict[str, Any], spec_path: str | Path, seeds: list[int],
               out: str | Path, log: Callable[[str], None] = say) -> dict[str, dict[int, float]]:
    """Each distinct recommendation of the live studies trained again at the target and C with the fresh
    training ``seeds``, in this process, the way the table's curves were trained (``spec_path``: the table's
    spec). Returns ``{config_key: {seed: final value}}``; a finished run in ``out`` is read back, not rerun."""
    from isosweep.trial.loop import train_loop  # reason: torch, DeepSpeed: only when recommendations are rerun

    spec_path = Path(spec_path)
    spec, _ = load_table_spec(spec_path)
    if spec.name != table["name"]:
        raise ConfigError(f"{spec_path}: the spec of table {spec.name!r}, not of {table['name']!r}")
    target = spec.sizes[-1]
    picks = {config_key(r["recommended"]): r["recommended"] for rs in summaries.values() for r in rs
             if r["recommended"] is not None}
    values: dict[str, dict[int, float]] = {}
    for key, config in picks.items():
        values[key] = {}
        for seed in seeds:
            cfg = cell_trial(spec, spec_path.parent / spec.trial, target, dict(config), seed)
            folder = Path(out) / f"{key},seed={seed}"
            if not finished(cfg, folder):
                log(f"[hpo-bench] re-evaluating {key} on {target} with training seed {seed}")
                folder.mkdir(parents=True, exist_ok=True)
                train_loop(cfg, folder, log=log)
            values[key][seed] = float(TrialDir(folder).records()[-1][f"eval/mean@{cfg.eval.k}"])
    return values


def against_table(results: dict[str, list[dict]], table: dict[str, Any], replayed: dict[str, Any] | None = None,
                  study_budget: float | None = None, fresh: dict[str, dict[int, float]] | None = None
                  ) -> dict[str, Any]:
    """Live studies scored like the replay: each recommendation at the table's nearest grid point (the replay's
    :func:`~isosweep.experiments.hpo_replay.snap`: log distance on log axes), its true value
    the table's mean over its training seeds at the target and C, its regret against the table's best; per
    method, those regrets beside the replayed studies' of the same method at ``study_budget`` (Nx), with a
    Mann-Whitney test of the two samples (a small live sample: only a large disagreement can show). ``fresh``
    (:func:`reevaluate`): each recommendation's own values retrained with fresh seeds, and their regret
    against the table's best (noisy: one curve per seed, off the grid)."""
    curves = Curves(table)
    space = search_space(curves)
    out: dict[str, Any] = {"table": table["name"], "best": curves.best, "methods": {}}
    for method, rs in results.items():
        rows = []
        for r in rs:
            if r["recommended"] is None:
                rows.append({"sweep_id": r["sweep_id"], "recommended": None, "grid_point": None, "regret": None})
                continue
            _, key, _ = snap(curves, space, space.at_target(r["recommended"]))  # as the replay snaps a proposal
            row = {"sweep_id": r["sweep_id"], "recommended": r["recommended"], "grid_point": key,
                   "true_value": curves.true[key], "regret": curves.best - curves.true[key]}
            again = (fresh or {}).get(config_key(r["recommended"]))
            if again:
                row["fresh"] = {str(seed): value for seed, value in again.items()}
                row["fresh_regret"] = curves.best - statistics.fmean(again.values())
            rows.append(row)
        live = [row["regret"] for row in rows if row["regret"] is not None]
        entry: dict[str, Any] = {"per_seed": rows, "regret_median": statistics.median(live) if live else None,
                                 "regret_mean": statistics.fmean(live) if live else None}
        retrained = [row["fresh_regret"] for row in rows if "fresh_regret" in row]
        if retrained:
            entry["fresh_regret_mean"] = statistics.fmean(retrained)
        study = (replayed or {}).get("studies", {}).get(f"table@{study_budget:g}x") if study_budget else None
        if study is not None and method in study.get("summary", {}):
            row = study["summary"][method]
            entry["replay"] = {"study": f"table@{study_budget:g}x", "regret_median": row["regret_median"],
                               "regret_mean": row["regret_mean"], "regret_ci95": row["regret_ci95"]}
            runs = replayed.get("runs", {}).get(f"table@{study_budget:g}x", {}).get(method)
            if runs and live:
                entry["replay"]["mann_whitney_p"] = float(
                    mannwhitneyu(live, [r["regret"] for r in runs], alternative="two-sided").pvalue)
        out["methods"][method] = entry
    return out


def real(spec: str | Path, seeds: list[int], methods: tuple[str, ...] = METHODS, budget: str | None = None,
         study_budget: str | None = None, margins: tuple[float, ...] = MARGINS, runs_root: str | Path = "runs/sweeps",
         dashboards: str | Path | None = "dashboards/hpo-bench", log: Callable[[str], None] = say,
         prefix: str = "real_study") -> dict:
    """Run (or resume) every ``method x seed`` study of ``spec`` and compare them at equal study budget
    (the plot and the studies' summaries go to ``dashboards/<prefix>.png`` and ``.json``)."""
    results: dict[str, list[dict]] = {m: [] for m in methods}
    walls: dict[str, list[float]] = {m: [] for m in methods}
    for seed in seeds:
        for method in methods:
            study = load_hpo(spec, budget, study_budget, overrides={"search": method, "seed": seed})
            log(f"[hpo-bench] {method}, seed {seed}: {study.sweep_id}")
            started = time.monotonic()
            result = run_hpo(study, runs_root=runs_root, dashboards=None, log=log, progress_every_s=60)
            if result is None:
                raise SystemExit(130)
            walls[method].append(time.monotonic() - started)
            results[method].append(result)
    table = compare(results, seeds, margins, walls)
    if dashboards:
        out = Path(dashboards)
        out.mkdir(parents=True, exist_ok=True)
        first = results[methods[0]][0]
        top = max(table["thresholds"].values(), default=None)
        plot_trajectories(results, out / f"{prefix}.png", threshold=top,
                          title=f"incumbent at {first['target']} over spent compute ({len(seeds)} seeds per method)")
        (out / f"{prefix}.json").write_text(json.dumps({m: rs for m, rs in results.items()}, indent=1, default=str))
    return {"what": f"HPO studies of {spec}, " + table.pop("what"), **table, "summaries": results}


def compare(results: dict[str, list[dict]], seeds: list[int], margins: tuple[float, ...] = MARGINS,
            walls: dict[str, list[float]] | None = None) -> dict:
    """The comparison of studies (``run_hpo`` summaries per method, one per seed) at equal study budget.

    The thresholds are the median target base evaluation over all studies plus each margin
    (keys ``"+0.01"`` and so on); for each study, the compute spent when its incumbent first
    reached each of them (None: never), and per method how many seeds got there and the median.
    """
    bases = [r["target_base"] for rs in results.values() for r in rs if r["target_base"] is not None]
    base = statistics.median(bases) if bases else None
    thresholds = {} if base is None else {f"+{m:g}": base + m for m in margins}
    first = next(iter(results.values()))[0]
    table = {}
    for method, rs in results.items():
        per_seed = []
        for i, (seed, r) in enumerate(zip(seeds, rs)):
            per_seed.append({
                "seed": seed, "sweep_id": r["sweep_id"], "spent": r["spent"],
                "best_target": None if r["best_target"] is None else r["best_target"]["value"],
                "compute_to_threshold": {name: reach(r["trajectory"], t) for name, t in thresholds.items()},
                "trials": len(r["trials"]), "by_size": r["by_size"], "promoted": r["promoted"],
                "stopped": r["stopped"], "recommended": r["recommended"],
                "wall_s_this_run": None if walls is None else round(walls[method][i], 1),
            })
        best = [p["best_target"] for p in per_seed if p["best_target"] is not None]
        reached = {name: [p["compute_to_threshold"][name] for p in per_seed
                          if p["compute_to_threshold"][name] is not None] for name in thresholds}
        table[method] = {
            "per_seed": per_seed,
            "best_target_mean": statistics.fmean(best) if best else None,
            "reached_threshold": {name: f"{len(v)}/{len(per_seed)}" for name, v in reached.items()},
            "compute_to_threshold_median": {name: statistics.median(v) if v else None for name, v in reached.items()},
        }
    return {
        "what": f"target {first['target']}, C = {first['budget']:,} rollouts, each method at the same study budget "
                f"of {first['study_budget']:,.0f} {first['cost_units']}; best_target = the best eval of the metric "
                "reached by a target-size trial; compute_to_threshold = spent compute at the first trial completion "
                "after which that best is >= the threshold (target base eval + margin); wall_s_this_run = seconds "
                "this invocation spent on the study (about 0 for a study finished before)",
        "metric": first["metric"], "target_base": base, "thresholds": thresholds, "seeds": seeds, "methods": table,
    }


def score_live(summaries: dict[str, list[dict]], study_budget: float, table_path: str | Path,
               replayed: dict[str, Any] | None, runs_path: Path, log: Callable[[str], None] = say,
               reeval_seeds: list[int] | None = None, reeval_out: str | Path = "runs/hpo-reeval"
               ) -> dict[str, Any] | None:
    """The live studies scored against the table (:func:`against_table`) when they ran its setting -- the same
    sizes, C and searched keys -- else None. ``study_budget``: the studies' budget in full target trials (the
    replayed studies of that budget are the comparison). The replayed runs are read from ``runs_path``
    (``table_runs.json`` of the table part)."""
    path = Path(table_path)
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    first = next(iter(summaries.values()))[0]
    spec = table["spec"]
    if (first["budget"] != spec["budget"] or first["target"] != spec["sizes"][-1]
            or set(first["recommended"] or {}) != set(spec["grid"])):
        log(f"[hpo-bench] the live studies do not search {table['name']}'s setting: not scored against it")
        return None
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else {}
    fresh = None
    if reeval_seeds:
        spec_path = Path("sweeps") / "tables" / f"{table['name']}.yaml"
        fresh = reevaluate(summaries, table, spec_path, reeval_seeds, Path(reeval_out) / table["name"], log)
    scored = against_table(summaries, table, {**(replayed or {}), "runs": runs}, round(study_budget, 3), fresh)
    if reeval_seeds:
        scored["fresh_seeds"] = list(reeval_seeds)
    for method, row in scored["methods"].items():
        replay_row = row.get("replay", {})
        log(f"[hpo-bench] live {method} scored on {table['name']}: regrets "
            + ", ".join("n/a" if r["regret"] is None else f"{r['regret']:.4f} ({r['grid_point']})"
                        for r in row["per_seed"])
            + (f"; replay at {replay_row['study']}: median {replay_row['regret_median']:.4f}, Mann-Whitney p "
               f"{replay_row.get('mann_whitney_p', float('nan')):.2f}" if replay_row else "")
            + (f"; retrained with fresh seeds: mean regret {row['fresh_regret_mean']:.4f}"
               if "fresh_regret_mean" in row else ""))
    return scored


def run(out: str | Path, part: str = "all", seeds: int = 3, cost_budget: float = 60.0, threshold: float = 0.8,
        spec: str | Path = "sweeps/jfhpo.yaml", real_seeds: int = 3, budget: str | None = None,
        study_budget: str | None = None, margins: tuple[float, ...] = MARGINS, runs_root: str | Path = "runs/sweeps",
        table: str | Path = "dashboards/hpo-table-mup/table.json", replay_seeds: int = 20,
        study_budgets: tuple[float, ...] = (4.0, 8.0), eps: float = 0.01, dashboards: str | Path = "dashboards/hpo-bench",
        force: bool = False, jobs: int = 1, reeval_seeds: list[int] | None = None,
        log: Callable[[str], None] = say) -> dict:
    """Run ``part`` (``synthetic``, ``real``, ``table`` or ``all``) and merge its figures into ``out``.

    The table part refuses a table that does not meet its signal check (a ConfigError) unless ``force``;
    with ``all`` it says so and the other parts run."""
    out = Path(out)
    if part in ("table", "all"):
        try:
            replay(table, out, dashboards, seeds=replay_seeds, study_budgets=study_budgets, eps=eps, force=force,
                   log=log, jobs=jobs)
        except ConfigError as err:
            if part == "table":
                raise
            log(f"[hpo-bench] table part skipped: {err}")
        if part == "table":
            return json.loads(out.read_text())
    result = json.loads(out.read_text()) if out.exists() else {}
    if isinstance(result.get("real_study"), str):  # the placeholder written before part (b) existed
        del result["real_study"]
    if part in ("synthetic", "all"):
        result["synthetic"] = synthetic(list(range(seeds)), cost_budget, threshold, log)
        for key in ("what", "threshold", "cost_budget", "seeds", "per_seed", "median_ratio"):
            result.pop(key, None)  # the layout before part (b) existed
        log(f"[hpo-bench] synthetic: median cost ratio JF-HPO / random = {result['synthetic']['median_ratio']:.3f} "
            f"over {seeds} seeds")
    if part in ("real", "all"):
        study = load_hpo(spec, budget, study_budget)
        name = study.spec.name
        key = "real" if name == "jfhpo" else f"real-{name}"  # the shipped study keeps its key and files
        live = real(spec, list(range(real_seeds)), budget=budget, study_budget=study_budget, margins=margins,
                    runs_root=runs_root, log=log, dashboards=dashboards,
                    prefix="real_study" if name == "jfhpo" else f"{key}_study")
        summaries = live.pop("summaries")
        scored = score_live(summaries, study.study_budget / study.cost(study.target, study.budget), table,
                            result.get("table"), Path(dashboards) / "table_runs.json", log,
                            reeval_seeds=reeval_seeds)
        if scored is not None:
            live["against_table"] = scored
        result[key] = live
        for method, row in result[key]["methods"].items():
            reached = ", ".join(f"{name}: {row['reached_threshold'][name]} seeds, median compute "
                                f"{fmt(row['compute_to_threshold_median'][name], ',.0f')}"
                                for name in row["reached_threshold"])
            log(f"[hpo-bench] real, {method}: best target eval (mean over seeds) "
                f"{fmt(row['best_target_mean'])}; reached base {reached}")
    result["host"] = {"machine": host.machine(), "python": host.python_version()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    log(f"[hpo-bench] figures -> {out}")
    return result
