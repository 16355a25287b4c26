"""An HPO study's summary: every trial, the incumbent over spent compute, the recommendation;
as data (:class:`HPOSummary`, written as ``hpo.json``), a fixed-width table (``trials.txt``) and a plot
(``incumbent.png``). ``hpo.json`` carries no ``schema_version``: its layout is the one earlier studies wrote."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from isosweep.hpo.ledger import StudyLedger, TrialEntry
from isosweep.report.plots import pyplot
from isosweep.report.tables import fmt, text_table


@dataclass(frozen=True)
class ProxyVerdict:
    """A finished proxy check of JF-HPO (``JFHPOSearcher.proxy_verdict``): the Spearman rho between the target's
    ranking of the checked configurations and the proxies' prediction (None: undefined), how many were checked,
    the threshold, and whether the proxies are trusted."""

    rho: float | None
    pairs: int
    threshold: float
    trusted: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ProxyVerdict | None:
        return None if data is None else cls(data["rho"], data["pairs"], data["threshold"], data["trusted"])


@dataclass(frozen=True)
class BestTarget:
    """The best target-size trial: its key, its best evaluation and its hyperparameters."""

    trial: str
    value: float
    params: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {"trial": self.trial, "value": self.value, "params": self.params}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> BestTarget | None:
        return None if data is None else cls(data["trial"], data["value"], data["params"])


@dataclass(frozen=True)
class HPOSummary:
    """An HPO study's result (``hpo.json``): its identity and units, what it spent, every trial, the incumbent
    over spent compute (the ledger's points: ``trial``, ``spent``, ``incumbent``, ``best_any``), the best
    target-size trial, the recommendation at the target, trials per size, promotions, stops per reason, and the
    proxy check's verdict (None: no check decided)."""

    sweep_id: str
    search: str
    seed: int
    metric: str
    target: str
    budget: int
    study_budget: float
    cost_units: str
    spent: float
    target_base: float | None
    trials: list[TrialEntry]
    trajectory: list[dict[str, Any]]
    best_target: BestTarget | None
    recommended: dict[str, float] | None
    by_size: dict[str, int]
    promoted: int
    stopped: dict[str, int]
    proxy_verdict: ProxyVerdict | None = None

    def to_json(self) -> dict[str, Any]:
        """``hpo.json``'s content, keys in the order the file has always had."""
        return {"sweep_id": self.sweep_id, "search": self.search, "seed": self.seed, "metric": self.metric,
                "target": self.target, "budget": self.budget, "study_budget": self.study_budget,
                "cost_units": self.cost_units, "spent": self.spent, "target_base": self.target_base,
                "trials": [asdict(t) for t in self.trials], "trajectory": self.trajectory,
                "best_target": None if self.best_target is None else self.best_target.to_json(),
                "recommended": self.recommended, "by_size": self.by_size, "promoted": self.promoted,
                "stopped": self.stopped,
                "proxy_verdict": None if self.proxy_verdict is None else self.proxy_verdict.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HPOSummary:
        """A summary read back (``proxy_verdict`` may be absent: files written before the proxy check)."""
        return cls(data["sweep_id"], data["search"], data["seed"], data["metric"], data["target"], data["budget"],
                   data["study_budget"], data["cost_units"], data["spent"], data["target_base"],
                   [TrialEntry(**t) for t in data["trials"]], data["trajectory"],
                   BestTarget.from_json(data["best_target"]), data["recommended"], data["by_size"],
                   data["promoted"], data["stopped"], ProxyVerdict.from_json(data.get("proxy_verdict")))


def summary(ledger: StudyLedger, recommended: dict[str, Any] | None, target_base: float | None,
            proxy_verdict: dict[str, Any] | None = None) -> HPOSummary:
    """The study as data: every trial, the incumbent over spent compute, the recommendation
    (``recommended``: the searcher's, at the target fidelity), the target base model's value and the searcher's
    proxy verdict (``JFHPOSearcher.proxy_verdict``; None where it has none)."""
    study = ledger.study
    target_trials = [t for t in ledger.trials.values() if t.size == study.target and t.best is not None]
    best_target = max(target_trials, key=lambda t: t.best, default=None)
    entries = ledger.trials.values()
    return HPOSummary(
        study.sweep_id, study.spec.search, study.spec.seed, study.metric, study.target, study.budget,
        study.study_budget, "target-equivalent rollouts: rollouts x params / params(target), plus "
                            f"{study.spec.cost.per_trial:g} x C per trial",
        ledger.spent, target_base, [TrialEntry(**asdict(t)) for t in entries], list(ledger.trajectory),
        None if best_target is None else BestTarget(best_target.key, best_target.best, best_target.params),
        None if recommended is None else study.space.hparams(recommended),
        {size: sum(t.size == size for t in entries) for size in study.space.sizes},
        sum(t.promoted_from is not None for t in entries),
        {reason: sum(t.stop_reason == reason for t in entries) for reason in sorted({t.stop_reason for t in entries})},
        ProxyVerdict.from_json(proxy_verdict))


def table_text(result: HPOSummary) -> str:
    """The trials of a study as a fixed-width table, then the incumbent and the recommendation."""
    metric = result.metric.split("/")[1]
    names = list(result.trials[0].params) if result.trials else []
    lines = [f"HPO study {result.sweep_id} ({result.search}): {len(result.trials)} trials, spent "
             f"{result.spent:,.0f} of {result.study_budget:,.0f} ({result.cost_units})"]
    rows = [[t.key, t.size, str(t.budget), str(t.reached), *(f"{t.params[n]:.3g}" for n in names),
             fmt(t.value), fmt(t.best), f"{t.cost:,.0f}", f"{t.spent_after or 0:,.0f}",
             t.stop_reason + (f" / {t.promoted_from}" if t.promoted_from else "")]
            for t in result.trials]
    header = ["trial", "size", "budget", "reached", *(n.split(".")[-1] for n in names), metric, "best", "cost", "spent",
              "stop / promoted from"]
    lines += text_table(header, rows, "<<>>" + ">" * len(names) + ">>>><")
    bt = result.best_target
    lines.append("")
    lines.append(f"best {metric} at the target ({result.target}): "
                 + (f"{bt.value:.3f} by {bt.trial} " + ", ".join(f"{k}={v:.3g}" for k, v in bt.params.items())
                    if bt else "none (no target-size trial evaluated)"))
    if result.proxy_verdict:
        lines.append(verdict_text(result.proxy_verdict, result.target))
    if result.recommended:
        lines.append("recommended configuration for the target: "
                     + ", ".join(f"{k}={v:.3g}" for k, v in result.recommended.items()))
    return "\n".join(lines)


def verdict_text(verdict: ProxyVerdict, target: str) -> str:
    """A finished proxy check in words."""
    rho = "undefined" if verdict.rho is None else f"{verdict.rho:+.2f}"
    then = ("the proxies keep informing the search" if verdict.trusted else
            f"the rest of the study runs at {target} only, its GP fitted on {target}'s values")
    return (f"proxy check: {target} ranks the {verdict.pairs} checked configurations with Spearman rho {rho} "
            f"to the proxies' prediction (trusted at >= {verdict.threshold:g}): {then}")


def write_summary(result: HPOSummary, out: Path, dashboards: Path | None) -> list[Path]:
    """``hpo.json``, ``trials.txt`` and ``incumbent.png`` in ``out`` (and copied to ``dashboards``); returns
    the files written to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hpo.json").write_text(json.dumps(result.to_json(), indent=1, default=str) + "\n")
    (out / "trials.txt").write_text(table_text(result) + "\n")
    plot_trajectories({result.search: [result]}, out / "incumbent.png", title=result.sweep_id)
    files = sorted(out.iterdir())
    if dashboards:
        dashboards.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copy2(path, dashboards / path.name)
    return files


def plot_trajectories(studies: Mapping[str, list[HPOSummary]], path: Path, title: str = "",
                      threshold: float | None = None) -> Path:
    """Incumbent (best target-size eval so far) against spent compute, one line per study, a colour per method."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = {"jfhpo": "tab:blue", "random": "tab:orange", "asha": "tab:green"}
    for method, results in studies.items():
        for i, result in enumerate(results):
            xs, ys = [0.0], [math.nan]
            for point in result.trajectory:
                xs.append(point["spent"])
                ys.append(math.nan if point["incumbent"] is None else point["incumbent"])
            ax.step(xs, ys, where="post", color=colours.get(method), alpha=0.85,
                    label=method if i == 0 else None)
    if threshold is not None:
        ax.axhline(threshold, color="grey", linestyle=":", label=f"threshold {threshold:.3f}")
    any_result = next(iter(next(iter(studies.values()))))
    ax.set_xlabel(f"spent compute (target-equivalent rollouts; C = {any_result.budget:,})")
    ax.set_ylabel(f"best {any_result.metric} at {any_result.target}")
    ax.set_title(title or "incumbent over spent compute")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
