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

(c) ``table``: the searchers replayed on a table of learning curves (``experiments.replay``):
    JF-HPO (two size scales), random search, ASHA and Hyperband, 20 searcher seeds each at two
    study budgets, plus the shuffled-proxy control (minutes; needs a finished table).

Every part writes to one JSON file (``bench/hpo.json``); running one part keeps the others' figures.
"""

from __future__ import annotations

import json
import platform as host
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from scipy.stats import mannwhitneyu

from isosweep.experiments.hartmann import SeedComparison, compare_on_hartmann
from isosweep.experiments.hpo_table import cell_trial, config_key, finished, load_table_spec
from isosweep.experiments.replay import Comparison, Curves, search_space, snap
from isosweep.experiments.replay import run as replay
from isosweep.report.hpo import HPOSummary, plot_trajectories
from isosweep.report.tables import fmt
from isosweep.run.core import say
from isosweep.run.hpo import run_hpo
from isosweep.spec.hpo import load_hpo
from isosweep.spec.yamlio import ConfigError
from isosweep.trial.files import TrialDir

METHODS = ("jfhpo", "random", "asha")
MARGINS = (0.01, 0.02)  # thresholds: the target base model's eval + each margin

SYNTHETIC_WHAT = ("cost (target-trial units) for JF-HPO and random search to reach regret <= threshold on the "
                  "two-fidelity Augmented Hartmann function; null = not reached within cost_budget")


@dataclass(frozen=True)
class Synthetic:
    """Part (a), the key ``synthetic`` of ``bench/hpo.json``: the settings, each seed's
    :class:`~isosweep.experiments.hartmann.SeedComparison` and the median cost ratio JF-HPO / random."""

    threshold: float
    cost_budget: float
    seeds: tuple[int, ...]
    per_seed: dict[int, SeedComparison]
    median_ratio: float
    what: str = SYNTHETIC_WHAT

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "threshold": self.threshold, "cost_budget": self.cost_budget,
                "seeds": list(self.seeds),
                "per_seed": {str(seed): row.to_json() for seed, row in self.per_seed.items()},
                "median_ratio": self.median_ratio}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Synthetic:
        return cls(data["threshold"], data["cost_budget"], tuple(data["seeds"]),
                   {int(seed): SeedComparison.from_json(row) for seed, row in data["per_seed"].items()},
                   data["median_ratio"], data["what"])


def synthetic(seeds: list[int], cost_budget: float, threshold: float, log: Callable[[str], None] = say) -> Synthetic:
    rows = compare_on_hartmann(seeds, cost_budget, threshold=threshold, log=log)
    ratios = sorted(row.ratio for row in rows.values())
    return Synthetic(threshold, cost_budget, tuple(seeds), rows, ratios[len(ratios) // 2])


def reach(trajectory: list[dict[str, Any]], threshold: float) -> float | None:
    """Spent compute at the first trial completion after which the incumbent is >= ``threshold``."""
    for point in trajectory:
        if point["incumbent"] is not None and point["incumbent"] >= threshold:
            return point["spent"]
    return None


def reevaluate(summaries: dict[str, list[HPOSummary]], table: dict[str, Any], spec_path: str | Path, seeds: list[int],
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
    picks = {config_key(r.recommended): r.recommended for rs in summaries.values() for r in rs
             if r.recommended is not None}
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


@dataclass(frozen=True)
class LivePick:
    """One live study's recommendation scored on the table: the grid point it snaps to (None: it recommended
    nothing), that point's true value and its regret; ``fresh``: its values retrained with fresh seeds (key:
    training seed; None: not retrained) and their mean's regret."""

    sweep_id: str
    recommended: dict[str, float] | None
    grid_point: str | None = None
    true_value: float | None = None
    regret: float | None = None
    fresh: dict[int, float] | None = None
    fresh_regret: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"sweep_id": self.sweep_id, "recommended": self.recommended,
                               "grid_point": self.grid_point}
        if self.recommended is not None:
            out["true_value"] = self.true_value
        out["regret"] = self.regret
        if self.fresh is not None:
            out["fresh"] = {str(seed): value for seed, value in self.fresh.items()}
            out["fresh_regret"] = self.fresh_regret
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LivePick:
        fresh = data.get("fresh")
        return cls(data["sweep_id"], data["recommended"], data["grid_point"], data.get("true_value"), data["regret"],
                   None if fresh is None else {int(seed): value for seed, value in fresh.items()},
                   data.get("fresh_regret"))


@dataclass(frozen=True)
class ReplayBeside:
    """The replayed studies of the same method at the live studies' budget (``study``, e.g. ``table@4x``): their
    median, mean and 95% interval of regret, and the Mann-Whitney p of live against replayed regrets (None: no
    replayed runs, or no live regret)."""

    study: str
    regret_median: float
    regret_mean: float
    regret_ci95: tuple[float, float]
    mann_whitney_p: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"study": self.study, "regret_median": self.regret_median,
                               "regret_mean": self.regret_mean, "regret_ci95": list(self.regret_ci95)}
        if self.mann_whitney_p is not None:
            out["mann_whitney_p"] = self.mann_whitney_p
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayBeside:
        low, high = data["regret_ci95"]
        return cls(data["study"], data["regret_median"], data["regret_mean"], (low, high), data.get("mann_whitney_p"))


@dataclass(frozen=True)
class ScoredMethod:
    """One method's live studies on the table: each pick, the median and mean regret of those with one (None:
    none), the mean regret of the retrained picks (None: none retrained), and the replay beside them (None: no
    replayed study of that budget and method)."""

    per_seed: tuple[LivePick, ...]
    regret_median: float | None
    regret_mean: float | None
    fresh_regret_mean: float | None = None
    replay: ReplayBeside | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"per_seed": [pick.to_json() for pick in self.per_seed],
                               "regret_median": self.regret_median, "regret_mean": self.regret_mean}
        if self.fresh_regret_mean is not None:
            out["fresh_regret_mean"] = self.fresh_regret_mean
        if self.replay is not None:
            out["replay"] = self.replay.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScoredMethod:
        return cls(tuple(LivePick.from_json(pick) for pick in data["per_seed"]), data["regret_median"],
                   data["regret_mean"], data.get("fresh_regret_mean"),
                   None if "replay" not in data else ReplayBeside.from_json(data["replay"]))


@dataclass(frozen=True)
class TableScore:
    """The live studies scored against a table (``against_table`` of a real part): the table, its best true value,
    each method's :class:`ScoredMethod`, and the fresh training seeds the picks were retrained with (None: none)."""

    table: str
    best: float
    methods: dict[str, ScoredMethod]
    fresh_seeds: tuple[int, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"table": self.table, "best": self.best,
                               "methods": {method: row.to_json() for method, row in self.methods.items()}}
        if self.fresh_seeds is not None:
            out["fresh_seeds"] = list(self.fresh_seeds)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TableScore:
        seeds = data.get("fresh_seeds")
        return cls(data["table"], data["best"],
                   {method: ScoredMethod.from_json(row) for method, row in data["methods"].items()},
                   None if seeds is None else tuple(seeds))


def against_table(results: dict[str, list[HPOSummary]], table: dict[str, Any], replayed: Comparison | None = None,
                  study_budget: float | None = None, fresh: dict[str, dict[int, float]] | None = None) -> TableScore:
    """Live studies scored like the replay: each recommendation at the table's nearest grid point (the replay's
    :func:`~isosweep.experiments.replay.snap`: log distance on log axes), its true value
    the table's mean over its training seeds at the target and C, its regret against the table's best; per
    method, those regrets beside the replayed studies' of the same method at ``study_budget`` (Nx; ``replayed``
    with its runs), with a Mann-Whitney test of the two samples (a small live sample: only a large disagreement
    can show). ``fresh`` (:func:`reevaluate`): each recommendation's own values retrained with fresh seeds, and
    their regret against the table's best (noisy: one curve per seed, off the grid)."""
    curves = Curves(table)
    space = search_space(curves)
    methods: dict[str, ScoredMethod] = {}
    for method, rs in results.items():
        picks = []
        for r in rs:
            if r.recommended is None:
                picks.append(LivePick(r.sweep_id, None))
                continue
            _, key, _ = snap(curves, space, space.at_target(r.recommended))  # as the replay snaps a proposal
            again = (fresh or {}).get(config_key(r.recommended))
            picks.append(LivePick(r.sweep_id, r.recommended, key, curves.true[key], curves.best - curves.true[key],
                                  dict(again) if again else None,
                                  curves.best - statistics.fmean(again.values()) if again else None))
        live = [pick.regret for pick in picks if pick.regret is not None]
        retrained = [pick.fresh_regret for pick in picks if pick.fresh_regret is not None]
        name = f"table@{study_budget:g}x" if study_budget else None
        study = None if replayed is None or name is None else replayed.studies.get(name)
        beside = None
        if study is not None and method in study.summary:
            row = study.summary[method]
            runs = study.runs.get(method)
            p = (float(mannwhitneyu(live, [r.regret for r in runs], alternative="two-sided").pvalue)
                 if runs and live else None)
            beside = ReplayBeside(name, row.regret_median, row.regret_mean, row.regret_ci95, p)
        methods[method] = ScoredMethod(tuple(picks), statistics.median(live) if live else None,
                                       statistics.fmean(live) if live else None,
                                       statistics.fmean(retrained) if retrained else None, beside)
    return TableScore(table["name"], curves.best, methods)


@dataclass(frozen=True)
class LiveSeed:
    """One live study of a method: its seed and sweep id, what it spent, the best target-size evaluation (None:
    no target trial), the compute at which it reached each threshold (None: never), its trials, trials per size,
    promotions, stops per reason, recommendation, and the seconds this invocation spent on it (None: not timed)."""

    seed: int
    sweep_id: str
    spent: float
    best_target: float | None
    compute_to_threshold: dict[str, float | None]
    trials: int
    by_size: dict[str, int]
    promoted: int
    stopped: dict[str, int]
    recommended: dict[str, float] | None
    wall_s_this_run: float | None

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "sweep_id": self.sweep_id, "spent": self.spent, "best_target": self.best_target,
                "compute_to_threshold": dict(self.compute_to_threshold), "trials": self.trials,
                "by_size": dict(self.by_size), "promoted": self.promoted, "stopped": dict(self.stopped),
                "recommended": self.recommended, "wall_s_this_run": self.wall_s_this_run}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LiveSeed:
        return cls(data["seed"], data["sweep_id"], data["spent"], data["best_target"],
                   dict(data["compute_to_threshold"]), data["trials"], dict(data["by_size"]), data["promoted"],
                   dict(data["stopped"]), data["recommended"], data["wall_s_this_run"])


@dataclass(frozen=True)
class LiveMethod:
    """One method's live studies: each seed's :class:`LiveSeed`, the mean best target evaluation (None: no study
    trained the target), per threshold how many seeds reached it (``"k/n"``) and their median compute (None:
    none did)."""

    per_seed: tuple[LiveSeed, ...]
    best_target_mean: float | None
    reached_threshold: dict[str, str]
    compute_to_threshold_median: dict[str, float | None]

    def to_json(self) -> dict[str, Any]:
        return {"per_seed": [row.to_json() for row in self.per_seed], "best_target_mean": self.best_target_mean,
                "reached_threshold": dict(self.reached_threshold),
                "compute_to_threshold_median": dict(self.compute_to_threshold_median)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LiveMethod:
        return cls(tuple(LiveSeed.from_json(row) for row in data["per_seed"]), data["best_target_mean"],
                   dict(data["reached_threshold"]), dict(data["compute_to_threshold_median"]))


@dataclass(frozen=True)
class LiveComparison:
    """Part (b), the key ``real`` (``real-<name>``) of ``bench/hpo.json``: the live studies compared at equal
    study budget (``what`` says how), the thresholds (the median target base evaluation + each margin; key
    ``"+0.01"`` and so on), each method's :class:`LiveMethod`, and the studies scored against the table (None:
    not scored). ``summaries``: every study's summary per method (not in the JSON: the studies' own files)."""

    what: str
    metric: str
    target_base: float | None
    thresholds: dict[str, float]
    seeds: tuple[int, ...]
    methods: dict[str, LiveMethod]
    against_table: TableScore | None = None
    summaries: dict[str, tuple[HPOSummary, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"what": self.what, "metric": self.metric, "target_base": self.target_base,
                               "thresholds": dict(self.thresholds), "seeds": list(self.seeds),
                               "methods": {method: row.to_json() for method, row in self.methods.items()}}
        if self.against_table is not None:
            out["against_table"] = self.against_table.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LiveComparison:
        scored = data.get("against_table")
        return cls(data["what"], data["metric"], data["target_base"], dict(data["thresholds"]), tuple(data["seeds"]),
                   {method: LiveMethod.from_json(row) for method, row in data["methods"].items()},
                   None if scored is None else TableScore.from_json(scored))


def real(spec: str | Path, seeds: list[int], methods: tuple[str, ...] = METHODS, budget: str | None = None,
         study_budget: str | None = None, margins: tuple[float, ...] = MARGINS, runs_root: str | Path = "runs/sweeps",
         dashboards: str | Path | None = "dashboards/hpo-bench", log: Callable[[str], None] = say,
         prefix: str = "real_study") -> LiveComparison:
    """Run (or resume) every ``method x seed`` study of ``spec`` and compare them at equal study budget
    (the plot and the studies' summaries go to ``dashboards/<prefix>.png`` and ``.json``)."""
    results: dict[str, list[HPOSummary]] = {m: [] for m in methods}
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
        top = max(table.thresholds.values(), default=None)
        plot_trajectories(results, out / f"{prefix}.png", threshold=top,
                          title=f"incumbent at {first.target} over spent compute ({len(seeds)} seeds per method)")
        (out / f"{prefix}.json").write_text(json.dumps({m: [r.to_json() for r in rs] for m, rs in results.items()},
                                                       indent=1, default=str))
    return replace(table, what=f"HPO studies of {spec}, " + table.what,
                   summaries={m: tuple(rs) for m, rs in results.items()})


def compare(results: dict[str, list[HPOSummary]], seeds: list[int], margins: tuple[float, ...] = MARGINS,
            walls: dict[str, list[float]] | None = None) -> LiveComparison:
    """The comparison of studies (``run_hpo`` summaries per method, one per seed) at equal study budget.

    The thresholds are the median target base evaluation over all studies plus each margin
    (keys ``"+0.01"`` and so on); for each study, the compute spent when its incumbent first
    reached each of them (None: never), and per method how many seeds got there and the median.
    """
    bases = [r.target_base for rs in results.values() for r in rs if r.target_base is not None]
    base = statistics.median(bases) if bases else None
    thresholds = {} if base is None else {f"+{m:g}": base + m for m in margins}
    first = next(iter(results.values()))[0]
    table = {}
    for method, rs in results.items():
        per_seed = tuple(
            LiveSeed(seed=seed, sweep_id=r.sweep_id, spent=r.spent,
                     best_target=None if r.best_target is None else r.best_target.value,
                     compute_to_threshold={name: reach(r.trajectory, t) for name, t in thresholds.items()},
                     trials=len(r.trials), by_size=r.by_size, promoted=r.promoted, stopped=r.stopped,
                     recommended=r.recommended,
                     wall_s_this_run=None if walls is None else round(walls[method][i], 1))
            for i, (seed, r) in enumerate(zip(seeds, rs)))
        best = [p.best_target for p in per_seed if p.best_target is not None]
        reached = {name: [p.compute_to_threshold[name] for p in per_seed
                          if p.compute_to_threshold[name] is not None] for name in thresholds}
        table[method] = LiveMethod(
            per_seed, statistics.fmean(best) if best else None,
            {name: f"{len(v)}/{len(per_seed)}" for name, v in reached.items()},
            {name: statistics.median(v) if v else None for name, v in reached.items()})
    return LiveComparison(
        what=f"target {first.target}, C = {first.budget:,} rollouts, each method at the same study budget "
             f"of {first.study_budget:,.0f} {first.cost_units}; best_target = the best eval of the metric "
             "reached by a target-size trial; compute_to_threshold = spent compute at the first trial completion "
             "after which that best is >= the threshold (target base eval + margin); wall_s_this_run = seconds "
             "this invocation spent on the study (about 0 for a study finished before)",
        metric=first.metric, target_base=base, thresholds=thresholds, seeds=tuple(seeds), methods=table)


def score_live(summaries: dict[str, tuple[HPOSummary, ...]], study_budget: float, table_path: str | Path,
               replayed: Comparison | None, log: Callable[[str], None] = say, reeval_seeds: list[int] | None = None,
               reeval_out: str | Path = "runs/hpo-reeval") -> TableScore | None:
    """The live studies scored against the table (:func:`against_table`) when they ran its setting -- the same
    sizes, C and searched keys -- else None. ``study_budget``: the studies' budget in full target trials (the
    replayed studies of that budget, ``replayed`` with their runs, are the comparison)."""
    path = Path(table_path)
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    first = next(iter(summaries.values()))[0]
    spec = table["spec"]
    if (first.budget != spec["budget"] or first.target != spec["sizes"][-1]
            or set(first.recommended or {}) != set(spec["grid"])):
        log(f"[hpo-bench] the live studies do not search {table['name']}'s setting: not scored against it")
        return None
    fresh = None
    if reeval_seeds:
        spec_path = Path("sweeps") / "tables" / f"{table['name']}.yaml"
        fresh = reevaluate(summaries, table, spec_path, reeval_seeds, Path(reeval_out) / table["name"], log)
    scored = against_table(summaries, table, replayed, round(study_budget, 3), fresh)
    if reeval_seeds:
        scored = replace(scored, fresh_seeds=tuple(reeval_seeds))
    for method, row in scored.methods.items():
        beside = row.replay
        log(f"[hpo-bench] live {method} scored on {table['name']}: regrets "
            + ", ".join("n/a" if r.regret is None else f"{r.regret:.4f} ({r.grid_point})" for r in row.per_seed)
            + (f"; replay at {beside.study}: median {beside.regret_median:.4f}, Mann-Whitney p "
               f"{float('nan') if beside.mann_whitney_p is None else beside.mann_whitney_p:.2f}" if beside else "")
            + (f"; retrained with fresh seeds: mean regret {row.fresh_regret_mean:.4f}"
               if row.fresh_regret_mean is not None else ""))
    return scored


def replayed_table(figures: dict[str, Any], runs_path: Path) -> Comparison | None:
    """The default table's replay as ``bench/hpo.json`` (``figures``, as read) holds it, with its runs from
    ``runs_path`` (``table_runs.json`` of the table part) where that exists; None where it has not run."""
    if "table" not in figures:
        return None
    return Comparison.from_json(figures["table"], json.loads(runs_path.read_text()) if runs_path.exists() else None)


def run(out: str | Path, part: str = "all", seeds: int = 3, cost_budget: float = 60.0, threshold: float = 0.8,
        spec: str | Path = "sweeps/jfhpo.yaml", real_seeds: int = 3, budget: str | None = None,
        study_budget: str | None = None, margins: tuple[float, ...] = MARGINS, runs_root: str | Path = "runs/sweeps",
        table: str | Path = "dashboards/hpo-table-mup/table.json", replay_seeds: int = 20,
        study_budgets: tuple[float, ...] = (4.0, 8.0), eps: float = 0.01, dashboards: str | Path = "dashboards/hpo-bench",
        force: bool = False, jobs: int = 1, reeval_seeds: list[int] | None = None,
        log: Callable[[str], None] = say) -> None:
    """Run ``part`` (``synthetic``, ``real``, ``table`` or ``all``) and merge its figures into ``out`` (the file is
    merged as plain JSON, the parts run written by their ``to_json``).

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
            return
    result = json.loads(out.read_text()) if out.exists() else {}  # the file boundary: the other parts as read
    if isinstance(result.get("real_study"), str):  # the placeholder written before part (b) existed
        del result["real_study"]
    if part in ("synthetic", "all"):
        found = synthetic(list(range(seeds)), cost_budget, threshold, log)
        result["synthetic"] = found.to_json()
        for key in ("what", "threshold", "cost_budget", "seeds", "per_seed", "median_ratio"):
            result.pop(key, None)  # the layout before part (b) existed
        log(f"[hpo-bench] synthetic: median cost ratio JF-HPO / random = {found.median_ratio:.3f} over {seeds} seeds")
    if part in ("real", "all"):
        study = load_hpo(spec, budget, study_budget)
        name = study.spec.name
        key = "real" if name == "jfhpo" else f"real-{name}"  # the shipped study keeps its key and files
        live = real(spec, list(range(real_seeds)), budget=budget, study_budget=study_budget, margins=margins,
                    runs_root=runs_root, log=log, dashboards=dashboards,
                    prefix="real_study" if name == "jfhpo" else f"{key}_study")
        scored = score_live(live.summaries, study.study_budget / study.cost(study.target, study.budget), table,
                            replayed_table(result, Path(dashboards) / "table_runs.json"), log,
                            reeval_seeds=reeval_seeds)
        live = replace(live, against_table=scored)
        result[key] = live.to_json()
        for method, row in live.methods.items():
            reached = ", ".join(f"{name}: {row.reached_threshold[name]} seeds, median compute "
                                f"{fmt(row.compute_to_threshold_median[name], ',.0f')}"
                                for name in row.reached_threshold)
            log(f"[hpo-bench] real, {method}: best target eval (mean over seeds) "
                f"{fmt(row.best_target_mean)}; reached base {reached}")
    result["host"] = {"machine": host.machine(), "python": host.python_version()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    log(f"[hpo-bench] figures -> {out}")
