"""The HPO benchmark's table of learning curves, built in process, and the check that it has signal.

A *tabular* HPO benchmark (the way HPOBench, YAHPO Gym and LCBench are built) precomputes, once,
the learning curve of every configuration of a grid x every model size x several training seeds;
searchers then replay it instead of training. Before any searcher is compared on a table, the
table must have something to find. This module builds a table and checks that first.

**Building** (``build``): every cell (size, grid configuration, seed) is an ordinary trial
(``train_loop``) run in this process, one after another, into ``<out>/runs/<cell>``: no Ray Train
job per curve (whose start-up would dominate short curves), the
same training, evaluation and checkpoint code as a sweep's trials. A finished cell is not run
again and an interrupted one resumes from its checkpoint, so a long build is split into runs
that each continue the last. Every curve keeps its evaluations' per-problem correct counts
(the trial's ``metrics.jsonl``), so each value comes with its noise. ``table.json`` is the
record: a curve it holds whose run folder is gone (a fresh clone of the repository, where the
runs are not committed) is kept as it is and not run again.

**Signal** (``check_signal``), at the target size (the last of ``sizes``) and the full budget, each
configuration's value is its final mean@k averaged over seeds. Differences between two
configurations are paired: the same eval problems (a fixed eval set per task, difficulty and
base model) and the same seeds. A difference's standard error is the larger of

- the eval noise: the standard error over problems of the per-problem difference (the
  per-problem mean@k is the pass rate c/s, averaged over seeds), and
- the seed noise: the standard deviation of the per-seed differences over sqrt(seeds) (with
  one seed, only the eval noise is known, and the check says so).

The preconditions (what a comparison of searchers needs from the table):

1. an **interior optimum**: the best configuration is at neither edge of any axis of the grid
   with three or more values (an axis of two values has only edges);
2. the best beats the **default** configuration by at least ``DEFAULT_SE`` standard errors;
3. the best beats the **median** configuration by at least ``MEDIAN_SE`` standard errors;
4. with more than one size, each proxy size **ranks** the configurations like the target
   (Spearman rho of the per-configuration values, ``RHO_MIN`` for the largest proxy).

    isosweep hpo-table sweeps/tables/hpo-table-pilot.yaml --out dashboards/hpo-table-pilot
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator, model_validator
from scipy.stats import spearmanr

from isosweep.models.sizes import warmup_version_in_ids
from isosweep.spec.trial import TrialConfig, load_trial, unscored_search
from isosweep.spec.trial import steps as total_steps
from isosweep.spec.yamlio import ConfigError, Section, read_yaml, validate
from isosweep.track.curves import COUNTS_KEY, SAMPLES_KEY
from isosweep.trial.files import TrialDir, atomic_write

MET = {True: "yes", False: "no", None: "not yet: curves missing"}
DEFAULT_SE = 3.0
MEDIAN_SE = 5.0
RHO_MIN = 0.6


class TableSpec(Section):
    """A table of learning curves: the grid, the sizes and the seeds every curve is run at."""

    name: str
    """Names the table's folder of runs and its report."""
    trial: str
    """The base trial file (relative to the spec's folder); each cell overrides the grid's keys."""
    budget: int = Field(gt=0)
    """C: rollouts of every curve (its last evaluation is at C)."""
    sizes: list[str] = Field(min_length=1)
    """The model ladder, smallest first; the last is the target."""
    seeds: list[int] = Field(min_length=1)
    """Training seeds of every cell."""
    grid: dict[str, list[Any]] = Field(min_length=1)
    """Dotted trial keys and the values each takes; the table holds every combination."""
    default: dict[str, Any]
    """The configuration a user would run without HPO; must be one of the grid's."""
    set: dict[str, Any] = {}
    """Dotted trial keys set for every cell (e.g. the rollout engine, the eval points)."""

    @field_validator("grid")
    @classmethod
    def _axes_have_values(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in grid.items():
            if not values:
                raise ValueError(f"grid axis {key!r} has no values; allowed: a list of at least one value")
        return {key: [_number(v) for v in values] for key, values in grid.items()}

    @field_validator("default")
    @classmethod
    def _default_numbers(cls, default: dict[str, Any]) -> dict[str, Any]:
        return {key: _number(value) for key, value in default.items()}

    @model_validator(mode="after")
    def _default_in_grid(self) -> TableSpec:
        if set(self.default) != set(self.grid):
            raise ValueError(f"default must set exactly the grid's keys {sorted(self.grid)} (got {sorted(self.default)})")
        for key, value in self.default.items():
            if value not in self.grid[key]:
                raise ValueError(f"default {key} = {value!r} is not on the grid; allowed: {self.grid[key]}")
        return self


@dataclass(frozen=True)
class CurvePoint:
    """One evaluation of a curve: rollouts trained, mean@k, per-problem correct counts out of ``samples``, and the
    trial's wall seconds then (None where not logged)."""

    rollouts: int
    value: float | None
    counts: list[int]
    samples: int
    wall_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rollouts": self.rollouts, "value": self.value, "counts": self.counts, "samples": self.samples,
                "wall_s": self.wall_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CurvePoint:
        return cls(data["rollouts"], data.get("value"), data["counts"], data["samples"], data.get("wall_s"))

    def rates(self) -> np.ndarray:
        """Per-problem pass rates c/s, ``(problems,)``."""
        return np.asarray(self.counts, dtype=float) / self.samples


@dataclass(frozen=True)
class Cell:
    """One curve of the table: size, configuration (dotted key -> value), seed, its evaluations, and the wall
    seconds of the run that built it (None where not recorded)."""

    size: str
    config: dict[str, Any]
    seed: int
    curve: list[CurvePoint]
    run_wall_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "config": self.config, "seed": self.seed,
                "curve": [p.to_json() for p in self.curve], "run_wall_s": self.run_wall_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Cell:
        return cls(data["size"], data["config"], data["seed"], [CurvePoint.from_json(p) for p in data["curve"]],
                   data.get("run_wall_s"))


@dataclass(frozen=True)
class Table:
    """A table of learning curves (``table.json``): its spec as data, the warm-up version of its base models, the
    metric, every finished curve, and how many curves the spec asks for."""

    name: str
    spec: dict[str, Any]
    warmup_version: str | None
    metric: str
    cells: list[Cell]
    expected_cells: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "warmup_version": self.warmup_version, "metric": self.metric,
                "cells": [c.to_json() for c in self.cells], "expected_cells": self.expected_cells}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Table:
        return cls(data["name"], data["spec"], data.get("warmup_version"), data.get("metric", METRIC),
                   [Cell.from_json(c) for c in data["cells"]], data["expected_cells"])


METRIC = "mean@k (per-problem pass rate c/s)"


@dataclass(frozen=True)
class Difference:
    """A paired difference between two configurations: its mean, its standard error, and which noise sets it
    (``eval`` or ``seeds``)."""

    diff: float
    se: float
    noise: str

    def to_json(self) -> dict[str, Any]:
        return {"diff": self.diff, "se": self.se, "noise": self.noise}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Difference:
        return cls(data["diff"], data["se"], data["noise"])

    def ratio(self) -> float:
        """The difference in standard errors (a positive difference with no error: infinitely many)."""
        return self.diff / self.se if self.se > 0 else (math.inf if self.diff > 0 else 0.0)


@dataclass(frozen=True)
class Signal:
    """A table's signal check (see the module docstring). Incomplete (``complete`` False): only ``why``. Complete:
    per configuration its value at the target, the ranking, the best, default and median configurations, the
    seeds, the base model's value, whether the best is interior (and the axes where it is not), the paired
    differences best - default and best - median, per proxy size its Spearman rho and best configuration, and each
    precondition met (None: not checkable yet)."""

    complete: bool
    why: str = ""
    target: str = ""
    values: dict[str, float] = field(default_factory=dict)
    ranking: list[str] = field(default_factory=list)
    best: str = ""
    default: str = ""
    median: str = ""
    seeds: int = 0
    base: float = math.nan
    interior: bool = False
    edge_axes: list[str] = field(default_factory=list)
    best_minus_default: Difference | None = None
    best_minus_median: Difference | None = None
    rho: dict[str, float] = field(default_factory=dict)
    proxy_best: dict[str, str] = field(default_factory=dict)
    checks: dict[str, bool | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        if not self.complete:
            return {"complete": False, "why": self.why}
        return {"complete": True, "target": self.target, "values": self.values, "ranking": self.ranking,
                "best": self.best, "default": self.default, "median": self.median, "seeds": self.seeds,
                "base": self.base, "interior": self.interior, "edge_axes": self.edge_axes,
                "best_minus_default": self.best_minus_default.to_json(),
                "best_minus_median": self.best_minus_median.to_json(), "rho": self.rho,
                "proxy_best": self.proxy_best, "checks": self.checks}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Signal:
        if not data["complete"]:
            return cls(False, data["why"])
        return cls(True, "", data["target"], data["values"], data["ranking"], data["best"], data["default"],
                   data["median"], data["seeds"], data["base"], data["interior"], data["edge_axes"],
                   Difference.from_json(data["best_minus_default"]), Difference.from_json(data["best_minus_median"]),
                   data["rho"], data["proxy_best"], data["checks"])


def _number(value: Any) -> Any:
    # YAML reads 1e-5 (no dot) as a string: a value that reads as a number is one, so 1e-5 and 1.0e-5 match
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def load_table_spec(path: str | Path) -> tuple[TableSpec, list[dict[str, Any]]]:
    """The spec, and each cell's trial config as data (checked: every cell is a valid trial)."""
    path = Path(path)
    spec = validate(TableSpec, read_yaml(path), str(path))
    trial = path.parent / spec.trial
    for config in configs(spec):
        for size in spec.sizes:
            overrides = {**spec.set, **config, "model.name": size, "budget": spec.budget}
            try:
                cfg = load_trial(trial, [f"{key}={json.dumps(value)}" for key, value in overrides.items()])
            except ConfigError as err:
                raise ConfigError(f"{path}: a cell of the grid is not a valid trial: {err}") from None
            unscored = unscored_search(spec.grid, cfg)
            if unscored:
                raise ConfigError(f"{path}: key 'grid': {unscored}")
    return spec, configs(spec)


def configs(spec: TableSpec) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in the grid's order."""
    keys = list(spec.grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(spec.grid[key] for key in keys))]


def config_key(config: dict[str, Any]) -> str:
    """A short readable name of one configuration, e.g. ``lr_ref=1e-05,kl_coef=0``."""
    return ",".join(f"{key.rsplit('.', 1)[-1]}={value:g}" if isinstance(value, float) else
                    f"{key.rsplit('.', 1)[-1]}={value}" for key, value in config.items())


def cell_trial(spec: TableSpec, trial_file: Path, size: str, config: dict[str, Any], seed: int) -> TrialConfig:
    overrides = {**spec.set, **config, "model.name": size, "budget": spec.budget, "seed": seed}
    return load_trial(trial_file, [f"{key}={json.dumps(value)}" for key, value in overrides.items()])


def cell_dir(out: Path, size: str, config: dict[str, Any], seed: int) -> Path:
    """A cell's run folder; past the first warm-up version, under the version that built its tiny base model
    (a curve run on another build of the base model is not this table's)."""
    version = warmup_version_in_ids()
    runs = out / "runs" / f"warmup-v{version}" if version else out / "runs"
    return runs / size / f"{config_key(config)},seed={seed}"


def finished(cfg: TrialConfig, folder: Path) -> bool:
    records = TrialDir(folder).records() if (folder / "metrics.jsonl").exists() else []
    return bool(records) and records[-1]["step"] == total_steps(cfg)


def build(spec_path: str | Path, out: str | Path, log: Callable[[str], None] = print,
          limit: int | None = None) -> Table:
    """Run every unfinished cell (at most ``limit`` this call), then write ``table.json`` and ``signal.md``.

    Cells run target first (its signal decides whether the proxies are worth building), then the
    proxies from the largest down; within a size, the first seed of every configuration before the
    second (a partial build can already be checked on one seed). A rerun skips finished cells and
    resumes an interrupted one.
    """
    from isosweep.trial.loop import train_loop  # torch, DeepSpeed

    spec_path, out = Path(spec_path), Path(out)
    spec, grid = load_table_spec(spec_path)
    trial_file = spec_path.parent / spec.trial
    recorded = recorded_cells(spec, out)
    cells = [(size, config, seed) for size in reversed(spec.sizes) for seed in spec.seeds for config in grid]
    ran = 0
    for i, (size, config, seed) in enumerate(cells):
        cfg = cell_trial(spec, trial_file, size, config, seed)
        folder = cell_dir(out, size, config, seed)
        if finished(cfg, folder) or (cell_name(size, config, seed) in recorded and not folder.exists()):
            continue
        if limit is not None and ran >= limit:
            break
        log(f"[hpo-table] cell {i + 1}/{len(cells)}: {size} {config_key(config)} seed {seed}")
        t0 = time.perf_counter()
        folder.mkdir(parents=True, exist_ok=True)
        train_loop(cfg, folder, log=log)
        (folder / "wall_s").write_text(f"{time.perf_counter() - t0:.1f}\n")
        ran += 1
    table = collect(spec, spec_path, out)
    atomic_write(out / "table.json", table_json(table))
    atomic_write(out / "signal.md", signal_text(table))
    return table


def cell_name(size: str, config: dict[str, Any], seed: int) -> str:
    return f"{size}/{config_key(config)},seed={seed}"


def recorded_cells(spec: TableSpec, out: Path) -> dict[str, Cell]:
    """The finished curves ``<out>/table.json`` already holds (by ``cell_name``), if it is this table's."""
    path = out / "table.json"
    if not path.exists():
        return {}
    table = json.loads(path.read_text())
    if table.get("spec") != spec.model_dump():
        return {}  # another spec (budget, set, grid changed): its curves are not this table's
    if table.get("warmup_version") != warmup_version_in_ids():
        return {}  # its curves ran on base models of another warm-up version: other models
    return {cell_name(c["size"], c["config"], c["seed"]): Cell.from_json(c) for c in table["cells"]}


def collect(spec: TableSpec, spec_path: Path, out: Path) -> Table:
    """Every finished curve of the table: its evaluations with per-problem counts (from its run folder,
    or, where that is gone, from the curve ``table.json`` already holds)."""
    trial_file = spec_path.parent / spec.trial
    recorded = recorded_cells(spec, out)
    cells = []
    for size in spec.sizes:
        for config in configs(spec):
            for seed in spec.seeds:
                cfg = cell_trial(spec, trial_file, size, config, seed)
                folder = cell_dir(out, size, config, seed)
                if not finished(cfg, folder):
                    kept = recorded.get(cell_name(size, config, seed))
                    if kept is not None and not folder.exists():
                        cells.append(kept)
                    continue
                k = cfg.eval.k
                curve = [CurvePoint(r["rollouts"], r[f"eval/mean@{k}"], r[COUNTS_KEY], r[SAMPLES_KEY],
                                    r.get("system/wall_s"))
                         for r in TrialDir(folder).records()]
                wall = folder / "wall_s"
                cells.append(Cell(size, config, seed, curve, float(wall.read_text()) if wall.exists() else None))
    return Table(spec.name, spec.model_dump(), warmup_version_in_ids(), METRIC, cells,
                 len(spec.sizes) * len(configs(spec)) * len(spec.seeds))


def table_json(table: Table) -> str:
    """``table.json``'s text: the header indented, then one curve per line (a rebuilt curve is a one-line diff)."""
    head = {key: value for key, value in table.to_json().items() if key != "cells"}
    cells = ",\n".join("  " + json.dumps(cell.to_json(), separators=(",", ":")) for cell in table.cells)
    return json.dumps(head, indent=1)[:-2] + ',\n "cells": [\n' + cells + "\n ]\n}\n"


def _rates(cell: Cell, point: int = -1) -> np.ndarray:
    return cell.curve[point].rates()


def paired_difference(a: list[Cell], b: list[Cell]) -> tuple[float, float, str]:
    """``(mean difference a - b, its standard error, which noise sets it)`` at the full budget.

    ``a`` and ``b`` are one configuration's cells each (same size), matched by seed; the
    per-problem pass rates are averaged over the seeds both have.
    """
    by_seed_a, by_seed_b = {c.seed: _rates(c) for c in a}, {c.seed: _rates(c) for c in b}
    seeds = sorted(set(by_seed_a) & set(by_seed_b))
    if not seeds:
        raise ValueError("the two configurations share no seed")
    diffs = np.stack([by_seed_a[s] - by_seed_b[s] for s in seeds])  # (seeds, problems)
    per_problem = diffs.mean(axis=0)
    eval_se = float(per_problem.std(ddof=1) / math.sqrt(per_problem.size))
    per_seed = diffs.mean(axis=1)
    seed_se = float(per_seed.std(ddof=1) / math.sqrt(len(seeds))) if len(seeds) > 1 else 0.0
    return float(per_problem.mean()), max(eval_se, seed_se), "seeds" if seed_se > eval_se else "eval"


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    return float(spearmanr(x, y).statistic)


def check_signal(table: Table) -> Signal:
    """The preconditions of a comparison of searchers on this table (see the module docstring)."""
    spec = TableSpec(**table.spec)
    target = spec.sizes[-1]
    keys = [config_key(c) for c in configs(spec)]
    cells: dict[str, dict[str, list[Cell]]] = {}
    for cell in table.cells:
        cells.setdefault(cell.size, {}).setdefault(config_key(cell.config), []).append(cell)
    at_target = cells.get(target, {})
    if len(at_target) < len(keys):
        return Signal(False, f"{len(at_target)} of {len(keys)} configurations finished at {target}")
    values = {key: statistics.fmean(float(_rates(c).mean()) for c in at_target[key]) for key in keys}
    ranked = sorted(keys, key=values.__getitem__, reverse=True)
    best = ranked[0]
    best_config = configs(spec)[keys.index(best)]
    edges = [axis for axis, options in spec.grid.items()
             if len(options) > 2 and best_config[axis] in (options[0], options[-1])]
    default = config_key(spec.default)
    median = ranked[len(ranked) // 2]
    d_default = Difference(*paired_difference(at_target[best], at_target[default])) if best != default \
        else Difference(0.0, 0.0, "eval")
    d_median = Difference(*paired_difference(at_target[best], at_target[median]))
    rho: dict[str, float] = {}
    proxy_best: dict[str, str] = {}
    for size in spec.sizes[:-1]:
        at = cells.get(size, {})
        if len(at) == len(keys):
            proxy = [statistics.fmean(float(_rates(c).mean()) for c in at[key]) for key in keys]
            rho[size] = spearman(proxy, [values[key] for key in keys])
            proxy_best[size] = keys[int(np.argmax(proxy))]
    checks: dict[str, bool | None] = {
        "interior optimum": not edges,
        f"best - default >= {DEFAULT_SE:g} se": d_default.ratio() >= DEFAULT_SE,
        f"best - median >= {MEDIAN_SE:g} se": d_median.ratio() >= MEDIAN_SE,
    }
    if len(spec.sizes) > 1:  # None: the largest proxy's curves are not all built yet
        largest = spec.sizes[-2]
        checks[f"rho({largest}, {target}) >= {RHO_MIN:g}"] = None if largest not in rho else rho[largest] >= RHO_MIN
    return Signal(True, "", target, values, ranked, best, default, median,
                  min(len(v) for v in at_target.values()),
                  statistics.fmean(float(_rates(c, 0).mean()) for c in at_target[best]), not edges, edges,
                  d_default, d_median, rho, proxy_best, checks)


def signal_text(table: Table) -> str:
    """``signal.md``: each configuration's value at the target, and each precondition met or not."""
    spec = TableSpec(**table.spec)
    found = check_signal(table)
    lines = [f"# Signal check: {table.name}", "",
             f"{len(table.cells)} of {table.expected_cells} curves finished; grid "
             + " x ".join(f"{key} {values}" for key, values in spec.grid.items())
             + f"; sizes {spec.sizes}; seeds {spec.seeds}; C = {spec.budget:,} rollouts per curve.", ""]
    if not found.complete:
        return "\n".join(lines + [f"Not checked yet: {found.why}.", ""])
    lines += [f"Value: mean@k at C on the fixed eval set, averaged over {found.seeds} seed(s); "
              f"base model {found.base:.3f}.", "", f"| configuration ({found.target}) | value | gain over base |",
              "| --- | --- | --- |"]
    for key in found.ranking:
        tags = [tag for tag, name in (("best", found.best), ("default", found.default),
                                      ("median", found.median)) if name == key]
        lines.append(f"| {key}{' (' + ', '.join(tags) + ')' if tags else ''} | {found.values[key]:.3f} | "
                     f"{found.values[key] - found.base:+.3f} |")
    lines.append("")
    for name, d in (("default", found.best_minus_default), ("median", found.best_minus_median)):
        lines.append(f"- best - {name}: {d.diff:+.4f} (se {d.se:.4f}, set by the {d.noise} noise"
                     + (f"; {d.diff / d.se:.1f} se)" if d.se > 0 else ")"))
    if found.edge_axes:
        lines.append(f"- the best sits at an edge of: {', '.join(found.edge_axes)} (extend the grid that way)")
    for size, rho in found.rho.items():
        lines.append(f"- Spearman rho({size}, {found.target}) = {rho:.2f}; {size}'s best: {found.proxy_best[size]}")
    if found.seeds < 2:
        lines.append("- one seed: the standard errors hold the eval noise only, not the seed-to-seed noise")
    lines += ["", "| precondition | met |", "| --- | --- |"]
    lines += [f"| {name} | {MET[ok]} |" for name, ok in found.checks.items()]
    checks = list(found.checks.values())
    if False in checks:
        verdict = "not met: do not compare searchers on this table"
    elif None in checks:
        verdict = "met so far; the rest are checked when the curves they need are built"
    else:
        verdict = "all met"
    return "\n".join(lines + ["", f"**Preconditions: {verdict}.**", ""])
