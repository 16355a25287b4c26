"""A sweep's frontier analysis: eval curves -> records -> sigmoid fits -> frontier table, plots, report.

Input is one :class:`Curve` per trial (what MLflow or the trial's ``metrics.jsonl`` holds:
compute in rollouts and the eval metrics at each evaluation). For each metric (``mean@k``,
``best@k``, ``worst@k``) and each config (an (n, Bp) allocation; seeds of one config are pooled)
the record-breaking points are fitted with the sigmoid of :mod:`isosweep.report.frontier`; the frontier
is the best fitted config at each compute, ``n*(C)`` and ``Bp*(C)`` are read off it, and the
saturation point says from which compute ``n*`` stops changing. Each config's fit is validated
by the hold-out check (fit on ``C <= C_max / 4``, predict ``C_max``).

The evaluation at compute 0 (the base model) takes part in the record extraction -- a later
point must beat it to count -- but not in the fit, whose sigmoid lives on ``C > 0``.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from isosweep.report import frontier as F
from isosweep.report.plots import png, pyplot
from isosweep.report.tables import fmt, text_table
from isosweep.track.curves import Curve

SATURATION_GRID = 64
"""Compute points (log-spaced) on which ``n*(C)`` is scanned for its saturation point."""


@dataclass
class MetricAnalysis:
    metric: str
    fits: dict[str, F.SigmoidFit]
    unfitted: dict[str, str]
    """config -> why it has no fit (too few records)."""
    records: dict[str, tuple[np.ndarray, np.ndarray]]
    """config -> (compute, value) of its record points (pooled over seeds)."""
    rows: list[dict]
    """The frontier table: C, config, value, low, high, n, Bp, M, plus the observed best."""
    saturation: float | None
    """Smallest C from which n*(C) stays constant (None: still changing at C_max; nan: no fits)."""
    holdout: dict[str, dict]


@dataclass
class Analysis:
    title: str
    study: str
    budget: int
    primary: str
    metrics: dict[str, MetricAnalysis]
    configs: dict[str, dict]
    curves: list[Curve] = field(repr=False)

    def to_json(self) -> dict:
        out = {"title": self.title, "study": self.study, "budget": self.budget, "primary": self.primary,
               "configs": self.configs, "gains": gains(self), "metrics": {}}
        for name, m in self.metrics.items():
            out["metrics"][name] = {
                "fits": {key: {"params": fit.params, "ci90": fit.ci, "points": fit.n, "converged": fit.success,
                               "bootstrap_refits": len(fit.boot)} for key, fit in m.fits.items()},
                "unfitted": m.unfitted,
                "records": {key: {"compute": c.tolist(), "value": v.tolist()} for key, (c, v) in m.records.items()},
                "frontier": m.rows,
                "saturation_C": m.saturation,
                "holdout": m.holdout,
            }
        return json.loads(json.dumps(out, default=_json_default).replace("NaN", "null"))


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(type(value))


def _pooled_records(curves: list[Curve], metric: str) -> tuple[np.ndarray, np.ndarray]:
    cs, vs = [], []
    for curve in curves:
        c, v = F.record_points(curve.compute, curve.values[metric])
        cs.append(c)
        vs.append(v)
    return np.concatenate(cs), np.concatenate(vs)


def _observed_best(curves: list[Curve], metric: str, C: float) -> tuple[str | None, float]:
    """The config with the best value observed at compute <= C (running max), and that value."""
    best_key, best = None, -math.inf
    for curve in curves:
        seen = curve.values[metric][curve.compute <= C]
        if len(seen) and seen.max() > best:
            best_key, best = curve.config, float(seen.max())
    return best_key, best


def frontier_grid(curves: list[Curve], budget: int, points: int) -> np.ndarray:
    """``points`` compute values log-spaced from the smallest positive eval compute to the budget."""
    positive = np.concatenate([c.compute[c.compute > 0] for c in curves])
    low = float(positive.min()) if len(positive) else budget / 64
    high = max(float(budget), low * 1.0001)
    return np.unique(np.round(np.geomspace(low, high, points)))


def analyse(curves: list[Curve], *, title: str, study: str, budget: int, primary: str, points: int = 8,
            bootstrap: int = 200, seed: int = 0) -> Analysis:
    """Fit every config on every metric the curves carry and build the frontier of each."""
    if not curves:
        raise ValueError("no trial has any evaluation yet: nothing to analyse")
    configs: dict[str, dict] = {}
    by_config: dict[str, list[Curve]] = {}
    for curve in curves:
        configs.setdefault(curve.config, {k: v for k, v in curve.fields.items() if k in ("n", "Bp", "M")})
        by_config.setdefault(curve.config, []).append(curve)
    metric_names = sorted(set.intersection(*(set(c.values) for c in curves)))
    if primary not in metric_names:
        raise ValueError(f"metric {primary!r} is not in the curves (have {metric_names})")
    grid = frontier_grid(curves, budget, points)
    fine = np.geomspace(grid[0], grid[-1], SATURATION_GRID)
    results = {}
    for metric in metric_names:
        fits, unfitted, records, holdout = {}, {}, {}, {}
        for key, group in by_config.items():
            c, v = _pooled_records(group, metric)
            records[key] = (c, v)
            positive = c > 0
            distinct = len(np.unique(c[positive]))
            if distinct < F.MIN_POINTS:
                unfitted[key] = (f"{distinct} record point(s) at C > 0; a sigmoid needs {F.MIN_POINTS} "
                                 "(the metric rarely beat its earlier best)")
            else:
                fits[key] = F.fit_sigmoid(c[positive], v[positive], bootstrap=bootstrap, seed=seed)
                holdout[key] = F.holdout_check(c[positive], v[positive])
        rows = []
        if fits:
            rows = F.frontier(fits, configs, grid)
        else:
            rows = [{"C": float(C), "config": None, "value": math.nan, "low": math.nan, "high": math.nan}
                    for C in grid]
        for row in rows:
            row["observed_config"], row["observed_value"] = _observed_best(curves, metric, row["C"])
        saturation = math.nan
        if fits:
            fine_rows = F.frontier(fits, configs, fine)
            saturation = F.saturation_point(fine, F.optimal_allocation(fine_rows, "n"))
        results[metric] = MetricAnalysis(metric, fits, unfitted, records, rows, saturation, holdout)
    return Analysis(title=title, study=study, budget=budget, primary=primary, metrics=results,
                    configs=configs, curves=curves)


def gains(analysis: Analysis) -> dict[str, dict[str, float]]:
    """Per metric: the base model's value (the mean of the evaluations at compute 0), the best
    value observed by C_max over all trials, and the difference -- which metric a sweep moved most.
    A metric without evaluations at compute 0 is left out."""
    out = {}
    for name in analysis.metrics:
        base = [float(c.values[name][c.compute == 0].mean()) for c in analysis.curves if np.any(c.compute == 0)]
        if not base:
            continue
        best = max(float(c.values[name].max()) for c in analysis.curves)
        out[name] = {"base": float(np.mean(base)), "best": best, "gain": best - float(np.mean(base))}
    return out


# --------------------------------------------------------------------------------- text


def table_text(analysis: Analysis, metric: str | None = None) -> str:
    """The frontier table of ``metric`` (default: the primary one) and the fitted curves, as text."""
    metric = metric or analysis.primary
    m = analysis.metrics[metric]
    lines = [f"frontier of {metric} -- {analysis.title} (C in rollouts per trial; M(C) = steps the best "
             "config takes to reach C; fitted value with 90% CI)"]
    rows = []
    for row in m.rows:
        ci = f"[{fmt(row['low'])}, {fmt(row['high'])}]" if not math.isnan(row["low"]) else "-"
        steps_to_c = int(row["C"] // (row["n"] * row["Bp"])) if row["config"] else None
        observed = f"{row['observed_config']} {fmt(row['observed_value'])}" if row["observed_config"] else "-"
        rows.append([f"{row['C']:,.0f}", row["config"] or "(no fit)", str(row.get("n", "-")), str(row.get("Bp", "-")),
                     "-" if steps_to_c is None else str(steps_to_c), fmt(row["value"]), ci, observed])
    lines += text_table(["C", "best config", "n*", "Bp*", "M(C)", "fitted", "90% CI", "observed best"], rows, "><>>>><<")
    if m.saturation is None:
        lines.append("n*(C) is still changing at the largest compute: no saturation within this budget")
    elif isinstance(m.saturation, float) and math.isnan(m.saturation):
        lines.append("n*(C): no config could be fitted")
    else:
        final = m.rows[-1].get("n")
        lines.append(f"n*(C) saturates at C = {m.saturation:,.0f} rollouts (n* = {final} from there to C_max)")
    moved = gains(analysis)
    if moved:
        lines.append("gain over the base model (compute 0) to the best observed by C_max: " + ", ".join(
            f"{name} {g['base']:.3f} -> {g['best']:.3f} ({g['gain']:+.3f})" for name, g in moved.items()))
    lines.append("")
    lines.append(f"fitted curves R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) on {metric} records; "
                 "hold-out: fit on C <= C_max/4, predict C_max")
    rows = []
    for key in analysis.configs:
        if key not in m.fits:
            continue
        p = m.fits[key].params
        h = m.holdout.get(key, {})
        hold = (f"{fmt(h['predicted'])}/{fmt(h['observed'])}/{fmt(h['abs_error'])}"
                if h.get("predicted") is not None else f"- ({h.get('n_fit_points', 0)} records at C <= C_max/4)")
        rows.append([key, fmt(p["R0"]), fmt(p["A"]), f"{p['C_mid']:,.0f}", fmt(p["B"], ".2f"), str(m.fits[key].n), hold])
    lines += text_table(["config", "R0", "A", "C_mid", "B", "points", "hold-out pred/obs/err"], rows, "<>>>>><")
    lines += [f"{key:<12} no fit: {why}" for key, why in m.unfitted.items()]
    return "\n".join(lines)


def write_csv(analysis: Analysis, path: Path) -> None:
    """Every metric's frontier table as one CSV (a ``metric`` column tells them apart)."""
    columns = ["metric", "C", "config", "n", "Bp", "M", "value", "low", "high", "observed_config", "observed_value"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for name, m in analysis.metrics.items():
            for row in m.rows:
                writer.writerow({"metric": name, **row})


# --------------------------------------------------------------------------------- plots


def plot_frontier(analysis: Analysis) -> bytes:
    """One panel per metric: each config's eval curve (thin), records (dots), fit (line), frontier (black)."""
    plt = pyplot()

    names = list(analysis.metrics)
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, name in zip(axes[0], names):
        m = analysis.metrics[name]
        grid = np.geomspace(m.rows[0]["C"], m.rows[-1]["C"], 200)
        for i, key in enumerate(analysis.configs):
            colour = colours[i % len(colours)]
            for curve in (c for c in analysis.curves if c.config == key):
                keep = curve.compute > 0
                ax.plot(curve.compute[keep], curve.values[name][keep], color=colour, alpha=0.25, lw=1)
            c, v = m.records[key]
            ax.scatter(c[c > 0], v[c > 0], color=colour, s=14, zorder=3)
            if key in m.fits:
                ax.plot(grid, m.fits[key].predict(grid), color=colour, lw=1.6, label=key)
            else:
                ax.plot([], [], color=colour, lw=1.6, ls=":", label=f"{key} (no fit)")
        if m.fits:
            envelope = np.max([fit.predict(grid) for fit in m.fits.values()], axis=0)
            ax.plot(grid, envelope, color="black", lw=2.4, alpha=0.8, label="frontier")
        ax.set_xscale("log")
        ax.set_xlabel("compute C (rollouts)")
        ax.set_ylabel(name)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(analysis.title)
    data = png(fig)
    plt.close(fig)
    return data


def plot_allocation(analysis: Analysis) -> bytes:
    """n*(C) and Bp*(C) of the primary metric, on the table's compute grid."""
    plt = pyplot()

    m = analysis.metrics[analysis.primary]
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [r for r in m.rows if r["config"]]
    if rows:
        C = [r["C"] for r in rows]
        ax.step(C, [r["n"] for r in rows], where="post", marker="o", label="n*(C)")
        ax.step(C, [r["Bp"] for r in rows], where="post", marker="s", label="Bp*(C)")
        if m.saturation not in (None,) and not (isinstance(m.saturation, float) and math.isnan(m.saturation)):
            ax.axvline(m.saturation, color="grey", ls="--", label=f"n* saturates ({m.saturation:,.0f})")
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("compute C (rollouts)")
    ax.set_ylabel("optimal value")
    ax.set_title(f"compute-optimal allocation ({analysis.primary})")
    ax.grid(alpha=0.3)
    if rows:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no config could be fitted", transform=ax.transAxes, ha="center")
    data = png(fig)
    plt.close(fig)
    return data


def fixed_batch_rows(analysis: Analysis, budgets: int = 4) -> list[tuple[float, list[int], list[float], list[bool]]]:
    """The fixed-batch trade-off at up to ``budgets`` compute values of the frontier grid (always
    the last): for each, the configs' n (ascending), their primary-metric value -- fitted where the
    config has a fit, else the best observed by that compute -- and whether it is fitted."""
    m = analysis.metrics[analysis.primary]
    keys = sorted(analysis.configs, key=lambda k: analysis.configs[k]["n"])
    picks = sorted({int(round(i)) for i in np.linspace(0, len(m.rows) - 1, min(budgets, len(m.rows)))})
    out = []
    for i in picks:
        C = m.rows[i]["C"]
        values, fitted = [], []
        for key in keys:
            if key in m.fits:
                values.append(float(m.fits[key].predict(C)))
            else:
                seen = [c.values[analysis.primary][c.compute <= C] for c in analysis.curves if c.config == key]
                values.append(max((float(v.max()) for v in seen if len(v)), default=math.nan))
            fitted.append(key in m.fits)
        out.append((C, [analysis.configs[k]["n"] for k in keys], values, fitted))
    return out


def plot_fixed_batch(analysis: Analysis) -> bytes:
    """Fixed-batch trade-off: the primary metric against n (Bp = B / n) at several budgets;
    filled markers are fitted values, hollow ones the best observed (configs without a fit)."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    for C, ns, values, fitted in fixed_batch_rows(analysis):
        line, = ax.plot(ns, values, label=f"C = {C:,.0f}")
        for n, v, f in zip(ns, values, fitted):
            ax.plot([n], [v], marker="o", color=line.get_color(), markerfacecolor=line.get_color() if f else "none")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n (rollouts per problem); Bp = B / n")
    ax.set_ylabel(f"{analysis.primary} (filled: fitted, hollow: observed)")
    ax.set_title("fixed batch: n vs Bp")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    data = png(fig)
    plt.close(fig)
    return data


# --------------------------------------------------------------------------------- files


def write_outputs(analysis: Analysis, folder: str | Path) -> dict[str, Path]:
    """Write the frontier table (CSV + text), fitted parameters (JSON), plots (PNG) and an HTML
    report (plots embedded, so the file stands alone) into ``folder``; returns name -> path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / name for name in ("frontier.csv", "frontier.txt", "fits.json", "frontier.png",
                                               "allocation.png", "report.html")}
    write_csv(analysis, paths["frontier.csv"])
    paths["frontier.txt"].write_text("\n\n".join(table_text(analysis, m) for m in analysis.metrics) + "\n")
    paths["fits.json"].write_text(json.dumps(analysis.to_json(), indent=1))
    images = {"frontier.png": plot_frontier(analysis), "allocation.png": plot_allocation(analysis)}
    if analysis.study == "fixed-batch":
        images["fixed_batch.png"] = plot_fixed_batch(analysis)
        paths["fixed_batch.png"] = folder / "fixed_batch.png"
    for name, data in images.items():
        paths[name].write_bytes(data)
    paths["report.html"].write_text(report_html(analysis, images))
    return paths


def report_html(analysis: Analysis, images: dict[str, bytes]) -> str:
    figures = "".join(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,'
                      f'{base64.b64encode(data).decode()}"><figcaption>{html.escape(name)}</figcaption></figure>'
                      for name, data in images.items())
    tables = "".join(f"<h2>{html.escape(name)}</h2><pre>{html.escape(table_text(analysis, name))}</pre>"
                     for name in [analysis.primary] + [m for m in analysis.metrics if m != analysis.primary])
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(analysis.title)} -- frontier</title>
<style>body{{font-family:sans-serif;max-width:1500px;margin:2em auto;padding:0 1em}}
img{{max-width:100%}}pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}</style></head>
<body id="isosweep-frontier"><h1>{html.escape(analysis.title)}</h1>
<p>Study <b>{html.escape(analysis.study)}</b>, budget C = {analysis.budget:,} rollouts per trial,
{len(analysis.curves)} trials, {len(analysis.configs)} configs. Each config's record-breaking
evaluations are fitted with R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); the frontier is the best
fitted config at each compute, n*(C) and Bp*(C) its allocation.</p>
{figures}{tables}</body></html>
"""
