"""The codes pilot: the two numbers that say whether n* can move on the codes task within a CPU budget.

Whether more samples per problem (n) pay on a task of needles depends on two time scales:

- **drift**: how fast training on the *anchors* (easy families) lowers the needles' pass rate. With drift on
  (``codes``: every anchor code starts with the digit no needle code has), a policy that learns the anchors
  raises that digit everywhere; a needle then has a window, counted in optimizer steps, in which it can still be
  found. Measured by training on the easy set with ``eval.watch: [hard]`` and fitting
  ``watch/hard/mean@k = p0 * exp(-step / tau)`` to the needles' pass rate (log-linear least squares);
  ``codes-nodrift`` is the control (no shared feature: tau should be much longer, or the rate should not fall).
- **discovery**: how many successes it takes to learn a needle. Measured by training on the hard set: the
  successes sampled by the trial (``train/reward * Bp * n`` summed over its steps) per needle family in its
  train set, up to the first evaluation at which the hard set's mean@k reaches ``LEARNED`` (or to the end, with
  the fraction reached then).

Each run is an ordinary trial (:func:`isosweep.trial.job.run_trial`) of ``sweeps/trials/codes-easy.yaml`` or
``codes-hard.yaml``, so a rerun resumes it. Outputs under ``out``: ``runs/`` (the trials), ``pilot.json`` (the
fits and counts) and ``pilot.md`` (the table).

    isosweep codes-pilot --out dashboards/codes-pilot --budget 25600
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from isosweep.models.warmup import resolve_model
from isosweep.spec.trial import TrialConfig, load_trial, task_of
from isosweep.trial.files import TrialDir
from isosweep.trial.job import run_trial
from isosweep.trial.loop import problem_sets

LEARNED = 0.5
"""The hard set's mean@k at which the needles count as learned."""


@dataclass(frozen=True)
class Drift:
    """The needles' pass rate while training on the anchors of one task variant."""

    task: str
    steps: list[int]
    needle_rate: list[float]
    """``watch/hard/mean@k`` at each evaluation."""
    anchor_rate: list[float]
    """``eval/mean@k`` (the anchors, trained on) at each evaluation."""
    tau_steps: float
    """Fitted e-folding time of the needle rate, in optimizer steps (inf where it does not fall)."""
    tau_rollouts: float


@dataclass(frozen=True)
class Discovery:
    """How many sampled successes learning the needles took."""

    task: str
    steps: list[int]
    needle_rate: list[float]
    cumulative_successes: list[float]
    """Successes sampled by the trial up to each evaluation."""
    families: int
    """Needle families in the train set."""
    learned_at: int | None
    """The first evaluated step with needle mean@k >= ``LEARNED`` (None: not within the budget)."""
    successes_per_family: float
    """Successes per needle family up to ``learned_at`` (or to the end)."""


def e_folding(steps_: list[int], rates: list[float]) -> float:
    """``tau`` of ``rate = p0 * exp(-step / tau)`` fitted by least squares on ``log(rate)`` (rates of 0 left
    out); ``inf`` where the fitted slope is not negative.

    >>> round(e_folding([0, 10, 20, 30], [0.04 * math.exp(-s / 15) for s in (0, 10, 20, 30)]), 6)
    15.0
    """
    points = [(s, math.log(r)) for s, r in zip(steps_, rates) if r > 0]
    if len(points) < 2:
        return math.inf
    slope = np.polyfit([p[0] for p in points], [p[1] for p in points], 1)[0]
    return float(-1 / slope) if slope < 0 else math.inf


def drift_run(task: str, out: Path, budget: int, log: Callable[[str], None]) -> Drift:
    cfg = load_trial("sweeps/trials/codes-easy.yaml",
                     [f"task.name={task}", f"budget={budget}", "eval.watch=[hard]", "eval.every=10"])
    records = run_trial(cfg, out / "runs" / f"drift-{task}", log=log)
    k = cfg.eval.k
    steps_ = [r["step"] for r in records]
    needles = [r[f"watch/hard/mean@{k}"] for r in records]
    tau = e_folding(steps_, needles)
    return Drift(task, steps_, needles, [r[f"eval/mean@{k}"] for r in records], tau, tau * cfg.Bp * cfg.n)


def discovery_run(task: str, out: Path, budget: int, log: Callable[[str], None]) -> Discovery:
    cfg = load_trial("sweeps/trials/codes-hard.yaml", [f"task.name={task}", f"budget={budget}", "eval.every=10"])
    trial_dir = out / "runs" / f"discovery-{task}"
    records = run_trial(cfg, trial_dir, log=log)
    k = cfg.eval.k
    per_step = {row["step"]: row["train/reward"] * cfg.Bp * cfg.n for row in TrialDir(trial_dir).steps()}
    steps_ = [r["step"] for r in records]
    cumulative = [sum(v for s, v in per_step.items() if s <= step) for step in steps_]
    needles = [r[f"eval/mean@{k}"] for r in records]
    learned = next((s for s, rate in zip(steps_, needles) if rate >= LEARNED), None)
    upto = cumulative[steps_.index(learned)] if learned is not None else cumulative[-1]
    families = len(train_families(cfg))
    return Discovery(task, steps_, needles, cumulative, families, learned, upto / max(families, 1))


def train_families(cfg: TrialConfig) -> set[int]:
    """The families of ``cfg``'s train problems (the trial's own problem sets, from its base model's probe)."""
    task = task_of(cfg.task)
    sets = problem_sets(cfg, resolve_model(cfg.model.name, cfg.task.name, cfg.model.warmup_seed), engine=None)
    return {task.family_of(p).id for p in sets.train}


def run_pilot(out: str | Path, budget: int, log: Callable[[str], None] = print) -> dict:
    """The three runs (drift on, drift off, discovery) and their figures, written to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"budget": budget,
              "drift": [asdict(drift_run(task, out, budget, log)) for task in ("codes", "codes-nodrift")],
              "discovery": asdict(discovery_run("codes", out, budget, log))}
    (out / "pilot.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "pilot.md").write_text(render(result))
    return result


def render(result: dict) -> str:
    """The pilot's table as Markdown."""
    lines = [f"# Codes pilot (budget {result['budget']} rollouts per run)", "",
             "| run | first needle rate | last needle rate | tau (steps) | tau (rollouts) |", "|---|---|---|---|---|"]
    for d in result["drift"]:
        lines.append(f"| anchors only, {d['task']} | {d['needle_rate'][0]:.4f} | {d['needle_rate'][-1]:.4f} | "
                     f"{d['tau_steps']:.0f} | {d['tau_rollouts']:.0f} |")
    disc = result["discovery"]
    learned = f"step {disc['learned_at']}" if disc["learned_at"] is not None else "not within the budget"
    lines += ["", f"Needles trained on directly ({disc['task']}): needle mean@k {disc['needle_rate'][0]:.4f} -> "
              f"{disc['needle_rate'][-1]:.4f}; reached {LEARNED}: {learned}; "
              f"{disc['successes_per_family']:.1f} sampled successes per needle family ({disc['families']} families)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    run_pilot(sys.argv[1], int(float(sys.argv[2])))
