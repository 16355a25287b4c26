"""An HPO study's summary: every trial, the incumbent over spent compute, the recommendation;
as data (``hpo.json``), a fixed-width table (``trials.txt``) and a plot (``incumbent.png``)."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from isosweep.hpo.ledger import StudyLedger
from isosweep.report.plots import pyplot
from isosweep.report.tables import fmt, text_table


def summary(ledger: StudyLedger, recommended: dict[str, Any] | None, target_base: float | None) -> dict[str, Any]:
    """The study as data: every trial, the incumbent over spent compute, the recommendation
    (``recommended``: the searcher's, at the target fidelity) and the target base model's value."""
    study = ledger.study
    target_trials = [t for t in ledger.trials.values() if t.size == study.target and t.best is not None]
    best_target = max(target_trials, key=lambda t: t.best, default=None)
    return {
        "sweep_id": study.sweep_id, "search": study.spec.search, "seed": study.spec.seed, "metric": study.metric,
        "target": study.target, "budget": study.budget, "study_budget": study.study_budget,
        "cost_units": "target-equivalent rollouts: rollouts x params / params(target), plus "
                      f"{study.spec.cost.per_trial:g} x C per trial",
        "spent": ledger.spent, "target_base": target_base, "trials": [asdict(t) for t in ledger.trials.values()],
        "trajectory": ledger.trajectory,
        "best_target": None if best_target is None else {"trial": best_target.key, "value": best_target.best,
                                                         "params": best_target.params},
        "recommended": None if recommended is None else study.space.hparams(recommended),
        "by_size": {size: sum(t.size == size for t in ledger.trials.values()) for size in study.space.sizes},
        "promoted": sum(t.promoted_from is not None for t in ledger.trials.values()),
        "stopped": {reason: sum(t.stop_reason == reason for t in ledger.trials.values())
                    for reason in sorted({t.stop_reason for t in ledger.trials.values()})},
    }


def table_text(result: dict[str, Any]) -> str:
    """The trials of a study as a fixed-width table, then the incumbent and the recommendation."""
    metric = result["metric"].split("/")[1]
    names = list(result["trials"][0]["params"]) if result["trials"] else []
    lines = [f"HPO study {result['sweep_id']} ({result['search']}): {len(result['trials'])} trials, spent "
             f"{result['spent']:,.0f} of {result['study_budget']:,.0f} ({result['cost_units']})"]
    rows = [[t["key"], t["size"], str(t["budget"]), str(t["reached"]), *(f"{t['params'][n]:.3g}" for n in names),
             fmt(t["value"]), fmt(t["best"]), f"{t['cost']:,.0f}", f"{t['spent_after'] or 0:,.0f}",
             t["stop_reason"] + (f" / {t['promoted_from']}" if t["promoted_from"] else "")]
            for t in result["trials"]]
    header = ["trial", "size", "budget", "reached", *(n.split(".")[-1] for n in names), metric, "best", "cost", "spent",
              "stop / promoted from"]
    lines += text_table(header, rows, "<<>>" + ">" * len(names) + ">>>><")
    bt = result["best_target"]
    lines.append("")
    lines.append(f"best {metric} at the target ({result['target']}): "
                 + (f"{bt['value']:.3f} by {bt['trial']} " + ", ".join(f"{k}={v:.3g}" for k, v in bt['params'].items())
                    if bt else "none (no target-size trial evaluated)"))
    if result.get("proxy_verdict"):
        lines.append(verdict_text(result["proxy_verdict"], result["target"]))
    if result["recommended"]:
        lines.append("recommended configuration for the target: "
                     + ", ".join(f"{k}={v:.3g}" for k, v in result["recommended"].items()))
    return "\n".join(lines)


def verdict_text(verdict: dict[str, Any], target: str) -> str:
    """A finished proxy check (``JFHPOSearcher.proxy_verdict``) in words."""
    rho = "undefined" if verdict["rho"] is None else f"{verdict['rho']:+.2f}"
    then = ("the proxies keep informing the search" if verdict["trusted"] else
            f"the rest of the study runs at {target} only, its GP fitted on {target}'s values")
    return (f"proxy check: {target} ranks the {verdict['pairs']} checked configurations with Spearman rho {rho} "
            f"to the proxies' prediction (trusted at >= {verdict['threshold']:g}): {then}")


def write_summary(result: dict[str, Any], out: Path, dashboards: Path | None) -> list[Path]:
    """``hpo.json``, ``trials.txt`` and ``incumbent.png`` in ``out`` (and copied to ``dashboards``); returns
    the files written to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hpo.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "trials.txt").write_text(table_text(result) + "\n")
    plot_trajectories({result["search"]: [result]}, out / "incumbent.png", title=result["sweep_id"])
    files = sorted(out.iterdir())
    if dashboards:
        dashboards.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copy2(path, dashboards / path.name)
    return files


def plot_trajectories(studies: dict[str, list[dict[str, Any]]], path: Path, title: str = "",
                      threshold: float | None = None) -> Path:
    """Incumbent (best target-size eval so far) against spent compute, one line per study, a colour per method."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = {"jfhpo": "tab:blue", "random": "tab:orange", "asha": "tab:green"}
    for method, results in studies.items():
        for i, result in enumerate(results):
            xs, ys = [0.0], [math.nan]
            for point in result["trajectory"]:
                xs.append(point["spent"])
                ys.append(math.nan if point["incumbent"] is None else point["incumbent"])
            ax.step(xs, ys, where="post", color=colours.get(method), alpha=0.85,
                    label=method if i == 0 else None)
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle=":", label=f"threshold {threshold:.3f}")
    any_result = next(iter(next(iter(studies.values()))))
    ax.set_xlabel(f"spent compute (target-equivalent rollouts; C = {any_result['budget']:,})")
    ax.set_ylabel(f"best {any_result['metric']} at {any_result['target']}")
    ax.set_title(title or "incumbent over spent compute")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
