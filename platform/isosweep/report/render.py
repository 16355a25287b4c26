"""A frontier analysis rendered: the text tables, the CSV, the plots and the standalone HTML page of a sweep.

The text and the CSV come from what a ``fits.json`` keeps (:class:`~isosweep.report.schema.SavedAnalysis`), so a
saved analysis renders as the live one did; the plots need the live fits and curves
(:class:`~isosweep.report.analysis.Analysis`). Every figure is closed once its PNG bytes are taken.
"""

from __future__ import annotations

import base64
import csv
import html
import math
from dataclasses import fields
from pathlib import Path

import numpy as np

from isosweep.report.analysis import Analysis, holdout_outcome, holdout_words
from isosweep.report.plots import png, pyplot
from isosweep.report.schema import FrontierRow, SavedAnalysis, ZeroSignalSummary
from isosweep.report.tables import fmt, text_table

CSV_COLUMNS = ["metric", "C", "config", "n", "Bp", "M", "value", "low", "high", "p_best", "runner_up", "lead",
               "lead_low", "lead_high", "tie", "identified", "observed_config", "observed_value"]
"""The columns of ``frontier.csv``: every metric's frontier rows, a ``metric`` column telling them apart."""

DIRECTION_WORDS = {"grows": "grows with n", "falls": "falls with n", "tie": "no trend beyond the noise"}


# --------------------------------------------------------------------------------- text


def _winner_cell(row: FrontierRow) -> str:
    if row.config is None:
        return "(no fit)"
    if row.tie:
        return f"tie: {row.config} ~ {row.runner_up}"
    return row.config + ("" if row.identified else " (?)")


def _table_row(row: FrontierRow) -> list[str]:
    """One frontier row's cells (see :func:`table_text`)."""
    ci = f"[{fmt(row.low)}, {fmt(row.high)}]" if not math.isnan(row.low) else "-"
    steps_to_c = int(row.C // (row.n * row.Bp)) if row.config else None
    observed = f"{row.observed_config} {fmt(row.observed_value)}" if row.observed_config else "-"
    n_cell = "-"
    if row.config:
        n_cell = str(row.n) + (f" [{min(row.n_range)}-{max(row.n_range)}]" if len(row.n_range) > 1 else "")
    lead = "-"
    if row.runner_up is not None:
        lead = fmt(row.lead, "+.3f") + (f" [{fmt(row.lead_low, '+.3f')}, {fmt(row.lead_high, '+.3f')}]"
                                        if not math.isnan(row.lead_low) else "")
    p_best = "-" if math.isnan(row.p_best) else f"{row.p_best:.2f}"
    return [f"{row.C:,.0f}", _winner_cell(row), p_best, n_cell, "-" if row.Bp is None else str(row.Bp),
            "-" if steps_to_c is None else str(steps_to_c), fmt(row.value), ci, lead, observed]


def table_text(analysis: SavedAnalysis, metric: str | None = None) -> str:
    """The frontier table of ``metric`` (default: the primary one) and the fitted curves, as text."""
    metric = metric or analysis.primary
    m = analysis.metrics[metric]
    lines = [f"frontier of {metric} -- {analysis.title} (C in rollouts per trial; M(C) = steps the best config takes "
             f"to reach C; fitted value with 90% CI; P(best) and the lead over the runner-up from "
             f"{m.bootstrap_replicates} bootstrap replicates: {analysis.noise})"]
    lines += text_table(["C", "best config", "P(best)", "n* [90%]", "Bp*", "M(C)", "fitted", "90% CI",
                         "lead over runner-up [90%]", "observed best (seed mean)"],
                        [_table_row(row) for row in m.frontier], "><>>>>><<<")
    lines.append(m.verdict)
    if any(not row.identified for row in m.winners):
        lines.append("(?) the winner's fit is not identified (plateau on its bound or C_mid beyond its data): its "
                     "value is a lower bound of a curve still rising, not a measured plateau")
    d = m.decision_holdout
    if d.predicted_config:
        outcome = holdout_words(holdout_outcome(m.frontier, analysis.configs, d), d.hit)
        lines.append(f"decision hold-out: fitted on C <= {d.fit_window:,.0f}, the predicted best at C_max = "
                     f"{d.C_max:,.0f} is {d.predicted_config} ({fmt(d.predicted_value)}); observed best "
                     f"{d.observed_config} -> {outcome}"
                     + (f", value error {fmt(d.abs_error)}" if d.abs_error is not None else ""))
    else:
        lines.append(f"decision hold-out: not possible ({d.reason})")
    t = m.n_trend
    if t:
        lines.append(f"n trend at C = {t.C:,.0f} (fixed Bp, n in {list(t.n)}): {t.slope_per_doubling:+.4f} per "
                     f"doubling of n, 90% CI [{fmt(t.low, '+.4f')}, {fmt(t.high, '+.4f')}] -> "
                     + DIRECTION_WORDS[t.direction])
    noise = analysis.eval
    if noise:
        shape = (f"{noise.problems} fixed problems x {noise.samples} samples" if noise.problems
                 else "trials on eval sets of different sizes")
        lines.append(f"eval: {shape}; one evaluation's standard error of mean@k from sampling alone (the same "
                     f"policy evaluated again on these problems): median {noise.se_median:.4f}, largest "
                     f"{noise.se_max:.4f} over {noise.evaluations} evaluations")
    if analysis.zero_signal:
        lines.append(zero_signal_line(analysis.zero_signal))
    if analysis.gains:
        lines.append("gain over the base model (compute 0) to the best observed by C_max: " + ", ".join(
            f"{name} {g.base:.3f} -> {g.best:.3f} ({g.gain:+.3f})" for name, g in analysis.gains.items()))
    lines.append("")
    base = "R0 fixed to the base model's measured value" if m.base is not None else "R0 fitted (no evaluation at C = 0)"
    lines.append(f"fitted curves R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) on each seed's running best ({base}); "
                 "hold-out: the same fit on C <= C_max/4 only, its value at C_max against the seeds' mean observed there")
    rows = []
    for key in analysis.configs:
        if key not in m.fits:
            continue
        fit, h = m.fits[key], m.holdout.get(key)
        p = fit.params
        hold = (f"{fmt(h.predicted)}/{fmt(h.observed)}/{fmt(h.abs_error)}" if h and h.predicted is not None
                else f"- ({h.n_fit_points if h else 0} points at C <= C_max/4)")
        rows.append([key, fmt(p["R0"]), fmt(p["A"]), f"{p['C_mid']:,.0f}", fmt(p["B"], ".2f"), str(fit.points), hold,
                     "yes" if not fit.not_identified else "no: " + "; ".join(fit.not_identified)])
    lines += text_table(["config", "R0", "A", "C_mid", "B", "points", "hold-out pred/obs/err", "identified"], rows,
                        "<>>>>><<")
    lines += [f"{key:<12} no fit: {why}" for key, why in m.unfitted.items()]
    return "\n".join(lines)


def zero_signal_line(check: ZeroSignalSummary) -> str:
    """The study's step-0 zero-signal check in one line: observed against predicted, the pooled z and the
    verdict (:func:`isosweep.report.analysis.zero_signal_summary`)."""
    verdict = ("DISAGREES beyond noise: check the reward, the sampler and the grouping" if check.flagged
               else "agrees")
    return (f"zero-signal check at step 0 ({check.trials} trial{'s' * (check.trials != 1)}): observed "
            f"{check.observed:.3f} of groups without signal, the probe predicts {check.expected:.3f}; "
            f"z = {fmt(check.z, '+.1f')} -> {verdict}")


def write_csv(analysis: SavedAnalysis, path: Path) -> None:
    """Every metric's frontier table as one CSV (:data:`CSV_COLUMNS`)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for name, m in analysis.metrics.items():
            for row in m.frontier:
                writer.writerow({"metric": name, **{field.name: getattr(row, field.name) for field in fields(row)}})


# --------------------------------------------------------------------------------- plots


def full_compute(curve) -> float:
    """The compute a curve's trial runs to, ``M * Bp * n``: a curve that ends below it was stopped early."""
    return float(curve.fields["M"] * curve.fields["Bp"] * curve.fields["n"])


def plot_frontier(analysis: Analysis) -> bytes:
    """One panel per metric: each config's eval curves (thin), each seed's running best (dots: the fitted
    points), fit (line), frontier (black); a cross where a curve was cut (a trial an adaptive sweep stopped)."""
    plt = pyplot()
    names = list(analysis.metrics)
    fig, axes = plt.subplots(1, len(names), figsize=(5.2 * len(names), 4.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, name in zip(axes[0], names):
        m = analysis.metrics[name]
        grid = np.geomspace(m.rows[0].C, m.rows[-1].C, 200)
        cut_label = "stopped early (where its curve was cut)"
        for i, key in enumerate(analysis.configs):
            colour = colours[i % len(colours)]
            for curve in (c for c in analysis.curves if c.config == key):
                keep = curve.compute > 0
                ax.plot(curve.compute[keep], curve.values[name][keep], color=colour, alpha=0.25, lw=1)
                if len(curve.compute) and curve.compute[-1] < full_compute(curve):  # an adaptive sweep stopped it
                    ax.scatter([curve.compute[-1]], [curve.values[name][-1]], marker="x", s=60, color=colour,
                               zorder=4, label=cut_label)
                    cut_label = None
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
    return _png(plt, fig)


def plot_allocation(analysis: Analysis) -> bytes:
    """n*(C) and Bp*(C) of the primary metric, on the table's compute grid."""
    plt = pyplot()
    m = analysis.metrics[analysis.primary]
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = [r for r in m.rows if r.config]
    if rows:
        C = [r.C for r in rows]
        ax.step(C, [r.n for r in rows], where="post", marker="o", label="n*(C)")
        ax.step(C, [r.Bp for r in rows], where="post", marker="s", label="Bp*(C)")
        if m.saturation is not None and not math.isnan(m.saturation):
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
    return _png(plt, fig)


def fixed_batch_rows(analysis: Analysis, budgets: int = 4) -> list[tuple[float, list[int], list[float], list[bool]]]:
    """The fixed-batch trade-off at up to ``budgets`` compute values of the frontier grid (always
    the last): for each, the configs' n (ascending), their primary-metric value -- fitted where the
    config has a fit, else the best observed by that compute -- and whether it is fitted."""
    m = analysis.metrics[analysis.primary]
    keys = sorted(analysis.configs, key=lambda k: analysis.configs[k]["n"])
    picks = sorted({int(round(i)) for i in np.linspace(0, len(m.rows) - 1, min(budgets, len(m.rows)))})
    out = []
    for i in picks:
        C = m.rows[i].C
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
    return _png(plt, fig)


def _png(plt, fig) -> bytes:
    """The figure's PNG bytes, the figure closed."""
    try:
        return png(fig)
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------------- files


def write_outputs(analysis: Analysis, folder: str | Path) -> dict[str, Path]:
    """Write the frontier table (CSV + text), fitted parameters (JSON), plots (PNG) and an HTML
    report (plots embedded, so the file stands alone) into ``folder``; returns name -> path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    saved = analysis.saved()
    paths = {name: folder / name for name in ("frontier.csv", "frontier.txt", "fits.json", "frontier.png",
                                               "allocation.png", "report.html")}
    write_csv(saved, paths["frontier.csv"])
    paths["frontier.txt"].write_text(frontier_text(saved))
    paths["fits.json"].write_text(saved.dumps())
    images = {"frontier.png": plot_frontier(analysis), "allocation.png": plot_allocation(analysis)}
    if analysis.study == "fixed-batch":
        images["fixed_batch.png"] = plot_fixed_batch(analysis)
        paths["fixed_batch.png"] = folder / "fixed_batch.png"
    for name, data in images.items():
        paths[name].write_bytes(data)
    paths["report.html"].write_text(report_html(saved, images))
    return paths


def frontier_text(analysis: SavedAnalysis) -> str:
    """``frontier.txt``: every metric's :func:`table_text`."""
    return "\n\n".join(table_text(analysis, m) for m in analysis.metrics) + "\n"


def report_html(analysis: SavedAnalysis, images: dict[str, bytes]) -> str:
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
{analysis.trials} trials, {len(analysis.configs)} configs. Each config's record-breaking
evaluations are fitted with R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B); the frontier is the best
fitted config at each compute, n*(C) and Bp*(C) its allocation.</p>
{figures}{tables}</body></html>
"""
