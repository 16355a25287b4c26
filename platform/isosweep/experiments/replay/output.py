"""What a replay writes: the summary into ``bench/hpo.json``, the runs, the report and the plots into a folder.

Every file is named after :func:`output_name` of the table, so replays of two tables never overwrite each other:
``<key>_runs.json`` (every study's records), ``<key>.md`` (:func:`report_text`), ``<key>_<study>.png`` per study
(:func:`plot`), and the key ``<key>`` of ``bench/hpo.json`` (the other keys kept).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from isosweep.experiments.hpo_table import RHO_MIN, Signal
from isosweep.experiments.replay.records import Comparison, StudyResult
from isosweep.experiments.replay.stats import unmet

DEFAULT_TABLE = "hpo-table-mup"
"""The table ``make hpo-bench`` replays by default: its figures keep the key ``table`` of ``bench/hpo.json`` and the
files ``table*`` under ``dashboards/hpo-bench/`` (what the live studies are scored against)."""


def output_name(table_name: str) -> str:
    """The key in ``bench/hpo.json`` and the file prefix under ``dashboards/hpo-bench/`` of a replay of a table:
    ``table`` for the default table, ``table-<name less 'hpo-table-'>`` for any other, so replays of two tables
    never overwrite each other."""
    return "table" if table_name == DEFAULT_TABLE else "table-" + table_name.removeprefix("hpo-table-")


def write(result: Comparison, out_json: str | Path, dashboards: str | Path,
          log: Callable[[str], None] = print) -> None:
    """``result``'s runs, report and plots into ``dashboards`` and its summary into ``out_json``."""
    key = output_name(result.table)
    dashboards = Path(dashboards)
    dashboards.mkdir(parents=True, exist_ok=True)
    (dashboards / f"{key}_runs.json").write_text(json.dumps(result.runs_json()) + "\n")
    (dashboards / f"{key}.md").write_text(report_text(result))
    for name, study in result.studies.items():
        plot(study, dashboards / f"{key}_{name.replace('@', '_')}.png",
             f"{name}: median regret (quartiles shaded), {result.seeds} seeds")
    out_json = Path(out_json)
    merged = json.loads(out_json.read_text()) if out_json.exists() else {}
    merged[key] = result.to_json()
    out_json.parent.mkdir(parents=True, exist_ok=True)
    out_json.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    log(f"[hpo-replay] figures -> {out_json} (key '{key}'); tables and plots -> {dashboards}/{key}*")


def plot(study: StudyResult, path: str | Path, title: str) -> None:
    """Median regret of each method's recommendation over spent compute (and the quartiles)."""
    from isosweep.report.plots import pyplot  # reason: matplotlib, only when plotting

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    grid = np.linspace(0, study.study_budget * 1.1, 200)
    for method, records in study.runs.items():
        curves = []
        for record in records:
            line = np.full(grid.shape, np.nan)
            for spent, regret in record.trajectory:
                if regret is not None:
                    line[grid >= spent] = regret
            curves.append(line)
        stack = np.array(curves)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            med = np.nanmedian(stack, axis=0)
            lo, hi = np.nanpercentile(stack, 25, axis=0), np.nanpercentile(stack, 75, axis=0)
        line, = ax.step(grid, med, where="post", label=method)
        ax.fill_between(grid, lo, hi, step="post", alpha=0.12, color=line.get_color())
    ax.set_xlabel("spent compute (full target trials, fixed cost included)")
    ax.set_ylabel("regret of the recommendation (true mean@k)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def signal_lines(check: Signal) -> list[str]:
    """The report's section on the table's signal check: each precondition, the proxies' rank agreement, and
    a warning when a precondition is not met."""
    missing = unmet(check)
    lines = ["## Does this table have the signal a comparison needs?", "", "| precondition | met |", "| --- | --- |"]
    lines += [f"| {name} | {'not yet' if met is None else 'yes' if met else 'no'} |"
              for name, met in check.checks.items()]
    lines += [""]
    if check.rho:
        lines += ["Spearman rho of each proxy's ranking of the configurations with the target's: "
                  + ", ".join(f"{s} {r:.2f}" for s, r in check.rho.items())
                  + f" (the check asks >= {RHO_MIN:g}). Each proxy's best configuration: "
                  + ", ".join(f"{s} {b}" for s, b in check.proxy_best.items())
                  + f"; the target's: {check.best}.", ""]
    if missing:
        whom = "searchers that use proxies" if all(n.startswith("rho(") for n in missing) else "searchers"
        lines += [f"**Not a fair test of {whom}: {', '.join(missing)} "
                  f"{'is' if len(missing) == 1 else 'are'} not met.** What follows measures how "
                  "each method does on this table as it is, not which method is better where the "
                  "preconditions hold.", ""]
    return lines


def study_lines(name: str, study: StudyResult) -> list[str]:
    """One study's section of the report: a row per method, then JF-HPO's pairings."""
    fmt = lambda v: "inf" if v is None else f"{v:.2f}"  # noqa: E731
    lines = [f"## {name}", "", "| method | median regret [95% CI] | mean regret | zero regret | within eps | "
             "median compute to eps [95% CI] | trials | promotions | collapse stops | trials per size |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for method, row in study.summary.items():
        lo, hi = row.compute_to_eps_ci95
        lines.append(f"| {method} | {row.regret_median:.4f} [{row.regret_ci95[0]:.4f}, "
                     f"{row.regret_ci95[1]:.4f}] | {row.regret_mean:.4f} | {row.zero_regret} | "
                     f"{row.reached_eps} | {fmt(row.compute_to_eps_median)} [{fmt(lo)}, {fmt(hi)}] | "
                     f"{row.trials_mean:.1f} | {row.promotions_mean:.1f} | {row.stops_mean:.2f} | "
                     + ", ".join(f"{v:.1f}" for v in row.by_size_mean.values()) + " |")
    trusted = [f"{method} on {row.proxies_trusted}" for method, row in study.summary.items()
               if row.proxies_trusted is not None]
    if trusted:
        lines += ["", "Proxies trusted after the proxy check (searcher seeds): " + ", ".join(trusted) + "."]
    lines += ["", "| JF-HPO vs | regret: median difference, wins/losses/ties, Wilcoxon p | "
              "compute to eps: median difference, wins/losses/ties, p |", "| --- | --- | --- |"]
    diff = lambda v: "n/a" if v is None else f"{v:+.3f}"  # noqa: E731
    for mine, row in study.summary.items():
        for other, pairing in row.versus.items():
            r, c = pairing.regret, pairing.compute_to_eps
            lines.append(f"| {mine} vs {other} | {diff(r.median_diff)}, {r.wins}/{r.losses}/{r.ties}, "
                         f"p = {r.p:.3g} | {diff(c.median_diff)}, {c.wins}/{c.losses}/{c.ties}, p = {c.p:.3g} |")
    return lines + [""]


def report_text(result: Comparison) -> str:
    """``dashboards/hpo-bench/table.md``: the comparison's tables, one per study."""
    lines = [f"# Searchers replayed on {result.table}", "",
             f"Target {result.target}, C = {result.budget:,} rollouts, evaluations at {list(result.points)}; "
             f"sizes {', '.join(f'{s} ({p:,})' for s, p in result.sizes.items())}. A study budget of Nx is N full "
             f"target trials; every trial also pays a fixed {result.fixed:.3f} of one (measured: the time to a "
             f"target curve's first evaluation over a whole curve). {result.seeds} searcher seeds per method, "
             f"the same seeds for every method. Regret: the best true value ({result.best:.4f}, "
             f"{', '.join(result.best_configs)} within eps) minus the true value of the final recommendation. "
             f"Compute to eps: full target trials spent when the recommendation first came within "
             f"eps = {result.eps} of the best (inf: never). "
             + ("A trial stops where its evaluation falls more than "
                f"{result.collapse} below its size's base model (collapse stops). "
                if result.collapse is not None else "")
             + "Trials, promotions, stops and trials per size are means over seeds.", ""]
    if result.signal is not None and result.signal.complete:
        lines += signal_lines(result.signal)
    if result.wall_ratios:
        lines += ["Wall time of a whole curve relative to the target's (nominal cost: parameters): "
                  + ", ".join(f"{s} {r:.2f} (nominal {result.sizes[s] / result.sizes[result.target]:.3f})"
                              for s, r in result.wall_ratios.items()), ""]
    for name, study in result.studies.items():
        lines += study_lines(name, study)
    return "\n".join(lines)
