"""Every method x study budget x searcher seed on a table, in one process or several, and the replay's entry point.

Each study (:func:`replay`) is its own seeded computation, so a comparison gives the same records in any
number of processes. Each method runs on the table as it is and on the **shuffled-proxy control**
(``Curves(shuffle_proxies=seed)``: each proxy size's curves given to the wrong configurations, a fixed
permutation per searcher seed), where the proxies carry no information about the target; a method that
trusts its proxies must not fall far below random search there.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from isosweep.experiments.hpo_table import Table, check_signal
from isosweep.experiments.replay.baselines import RUNNERS
from isosweep.experiments.replay.driver import run_jfhpo
from isosweep.experiments.replay.output import write
from isosweep.experiments.replay.records import DRIVEN, Comparison, ReplayRecord, StudyResult
from isosweep.experiments.replay.simulator import Curves, Study
from isosweep.experiments.replay.stats import summarize, unmet
from isosweep.spec.yamlio import ConfigError

METHODS = ("jfhpo", "jfhpo-log", "bo-target", "random", "asha", "hyperband")
"""Every method a comparison replays, in the order its tables list them."""


def replay(curves: Curves, method: str, study_budget: float, seed: int, fixed: float, eps: float,
           options: dict[str, Any] | None = None, collapse: float | None = None) -> ReplayRecord:
    """One study of ``method`` on ``curves`` with a budget of ``study_budget`` full target trials (trials
    that collapse by more than ``collapse`` below their base model stop there)."""
    study = Study(curves, study_budget * (1 + fixed), fixed, collapse)
    if method in DRIVEN:
        import torch  # reason: the GP's thread count, for the JF-HPO methods only

        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one thread in every process: a study's result does not depend on --jobs
        try:
            if method == "bo-target":
                options = {**(options or {}), "proxy_check": 0, "proxy_share": 0.0}
            run_jfhpo(curves, study, seed, options, size_scale="log" if method == "jfhpo-log" else "params")
        finally:
            torch.set_num_threads(threads)
    else:
        RUNNERS[method](curves, study, seed)
    return study.result(method, seed, eps)


@dataclasses.dataclass
class _Worker:
    """What every study of one comparison shares, in each process: the table's settings and its curves (key:
    the shuffled control's searcher seed, None for the table as it is)."""

    table: dict[str, Any]
    fixed: float
    eps: float
    options: dict[str, Any] | None
    collapse: float | None
    curves: dict[int | None, Curves]


_worker: _Worker | None = None
"""This process's worker state (set by :func:`_init_worker`)."""


def _init_worker(table: dict[str, Any], fixed: float, eps: float, options: dict[str, Any] | None,
                 collapse: float | None) -> None:
    global _worker
    _worker = _Worker(table, fixed, eps, options, collapse, {None: Curves(table)})


def _replay_task(task: tuple[bool | None, str, float, int]) -> ReplayRecord:
    """One study of a comparison (``(shuffled, method, study budget, seed)``) in this process's worker state."""
    shuffle, method, study_budget, seed = task
    worker = _worker
    key = seed if shuffle else None  # the control's permutation is drawn from the searcher seed
    if key not in worker.curves:
        worker.curves[key] = Curves(worker.table, shuffle_proxies=seed)
    return replay(worker.curves[key], method, study_budget, seed, worker.fixed, worker.eps, worker.options,
                  worker.collapse)


def compare(table: dict[str, Any], study_budgets: list[float], seeds: list[int], eps: float, fixed: float,
            methods: tuple[str, ...] = METHODS, shuffled: bool = True, options: dict[str, Any] | None = None,
            collapse: float | None = None, log: Callable[[str], None] = print, jobs: int = 1) -> Comparison:
    """Every method x study budget x searcher seed on the table (and on its shuffled-proxy control), in
    ``jobs`` processes (the same results for any number: each study is its own seeded computation)."""
    curves = Curves(table)
    if jobs < 1:
        raise ConfigError(f"jobs={jobs}: the studies need at least one process")
    variants = [("table", None)] + ([("shuffled", True)] if shuffled else [])
    tasks = [(shuffle, method, study_budget, seed) for _, shuffle in variants for study_budget in study_budgets
             for seed in seeds for method in methods]
    settings = (table, fixed, eps, options, collapse)
    if jobs > 1:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker,
                                 initargs=settings) as pool:
            done = dict(zip(tasks, pool.map(_replay_task, tasks)))
    else:
        _init_worker(*settings)
        done = {task: _replay_task(task) for task in tasks}
    studies = {}
    for variant, shuffle in variants:
        for study_budget in study_budgets:
            runs = {method: tuple(done[(shuffle, method, study_budget, seed)] for seed in seeds) for method in methods}
            name = f"{variant}@{study_budget:g}x"
            studies[name] = StudyResult(study_budget, variant, summarize(runs), runs)
            for method, row in studies[name].summary.items():
                log(f"[hpo-replay] {name} {method}: median regret {row.regret_median:.4f} "
                    f"[{row.regret_ci95[0]:.4f}, {row.regret_ci95[1]:.4f}], within eps {row.reached_eps}, "
                    f"median compute to eps {row.compute_to_eps_median}")
    return Comparison(
        table=table["name"], target=curves.target, sizes={s: curves.params[s] for s in curves.sizes},
        budget=curves.budget, points=tuple(curves.points), fixed=fixed, eps=eps, seeds=len(seeds), collapse=collapse,
        eval_variance=curves.eval_variance, true_values=curves.true, best=curves.best,
        best_configs=tuple(k for k, v in curves.true.items() if curves.best - v <= eps), studies=studies)


def measured_fixed(table: dict[str, Any]) -> float:
    """The per-trial fixed cost measured in the table, in full target trials: the median time a target
    curve took to its first evaluation (start-up, model load, base evaluation) over the median time
    of a whole target curve."""
    target = table["spec"]["sizes"][-1]
    cells = [c for c in table["cells"] if c["size"] == target and c["curve"][0].get("wall_s") is not None]
    if not cells:
        raise ValueError(f"the table's {target} curves carry no wall times: give the fixed cost")
    first = statistics.median(c["curve"][0]["wall_s"] for c in cells)
    whole = statistics.median(c["curve"][-1]["wall_s"] for c in cells)
    return first / whole


def wall_ratios(table: dict[str, Any]) -> dict[str, float]:
    """Median wall seconds of a whole curve per size over the target's (nominal cost: parameters)."""
    walls: dict[str, list[float]] = {}
    for cell in table["cells"]:
        if cell.get("run_wall_s"):
            walls.setdefault(cell["size"], []).append(cell["run_wall_s"])
    target = table["spec"]["sizes"][-1]
    if target not in walls:
        return {}
    top = statistics.median(walls[target])
    return {size: statistics.median(w) / top for size, w in walls.items()}


def run(table_path: str | Path, out_json: str | Path, dashboards: str | Path, seeds: int = 20,
        study_budgets: tuple[float, ...] = (4.0, 8.0), eps: float = 0.01, fixed: float | None = None,
        methods: tuple[str, ...] = METHODS, collapse: float | None = 0.05, force: bool = False,
        log: Callable[[str], None] = print, jobs: int = 1) -> Comparison:
    """Replay every method on the table; write the summary into ``out_json`` (key
    :func:`~isosweep.experiments.replay.output.output_name`, ``table`` for the default table) and the runs,
    tables and plots into ``dashboards`` (files named after the same key).

    ``fixed``: the cost every trial pays, in full target trials (None: measured in the table,
    :func:`measured_fixed`). A table that does not meet its signal check's preconditions is refused (a
    ConfigError that names them) unless ``force``: then the comparison runs and its report says that it is
    not a fair test.
    """
    table = json.loads(Path(table_path).read_text())
    check = check_signal(Table.from_json(table))
    missing = unmet(check)
    if missing and not force:
        raise ConfigError(
            f"{table_path}: the table does not meet {'; '.join(missing)} (its signal check: isosweep hpo-table), so "
            "a comparison of searchers on it would not say which is better. Build a table that meets them, or "
            "replay this one anyway with --force (FORCE=1 for make hpo-bench): its report then says it is not a "
            "fair test")
    if missing:
        log(f"[hpo-replay] --force: replaying a table that does not meet {'; '.join(missing)}")
    fixed = measured_fixed(table) if fixed is None else fixed
    result = compare(table, list(study_budgets), list(range(seeds)), eps, fixed, methods=methods,
                     collapse=collapse, log=log, jobs=jobs)
    result = dataclasses.replace(result, wall_ratios=wall_ratios(table), signal=check)
    write(result, out_json, dashboards, log)
    return result
