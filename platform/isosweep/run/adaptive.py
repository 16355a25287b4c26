"""Adaptive sweeps, live: the trials of a sweep advance through budget rungs, and at each rung the configurations
that cannot reach the frontier are stopped.

A sweep file's ``adaptive:`` section (or ``isosweep sweep --adaptive``) turns it on (:class:`AdaptiveSpec`). The
sweep then runs in phases, one per rung C/64, C/16, C/4 (``adaptive.rungs``) and a last one to C: in a phase every
trial of a configuration still running is started (or resumed from its checkpoint) with a ``PAUSE`` file naming the
rung, and ends at its first evaluation at or past it; then the rule decides on the curves as they stand
(:func:`isosweep.report.adaptive.frontier_decision`, or ASHA's ranking with ``method: asha``), and the stopped
configurations' trials are not started again. What a stopped trial computed stays in the frontier at the budgets
it reached; its checkpoints stay on disk, so the same sweep run without ``adaptive`` resumes it.

The decisions live in ``<sweep>/adaptive.json`` (:class:`Decisions`, read again when the sweep is resumed), in the
log, and in MLflow: each stopped trial's run gets ``isosweep.stop_reason`` (``adaptive``) and
``isosweep.stop_detail`` (the rule's reason), and the parent run the file as an artifact.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from isosweep.report.adaptive import Rule, Stop, frontier_decision, halving_stops
from isosweep.run.core import is_finished, trial_of
from isosweep.spec.grid import AdaptiveSpec, Sweep, TrialPoint
from isosweep.track import runs
from isosweep.track.curves import Curve, zero_signal_of
from isosweep.track.tags import STOP_DETAIL_TAG, STOP_REASON_TAG
from isosweep.trial.files import TrialDir, atomic_write

ADAPTIVE_FILE = "adaptive.json"
STOP_REASON = "adaptive"
"""The ``isosweep.stop_reason`` tag of a trial stopped by an adaptive sweep."""


def rule_of(spec: AdaptiveSpec) -> Rule:
    """The decision rule of an ``adaptive:`` section: its rungs as increasing fractions of C."""
    return Rule(rungs=tuple(sorted(1 / r for r in spec.rungs)), confidence=spec.confidence, bootstrap=spec.bootstrap)


@dataclass
class Decisions:
    """What an adaptive sweep has decided so far: the rungs it has passed and the configurations it stopped."""

    rungs_done: list[float] = field(default_factory=list)
    """Rungs (rollouts) at which the rule has decided."""
    stops: list[Stop] = field(default_factory=list)

    @property
    def stopped(self) -> set[str]:
        return {s.config for s in self.stops}

    def to_json(self) -> dict:
        return {"rungs_done": self.rungs_done, "stops": [s.to_json() for s in self.stops]}

    @classmethod
    def load(cls, sweep_out: Path) -> Decisions:
        path = Path(sweep_out) / ADAPTIVE_FILE
        if not path.exists():
            return cls()
        data = json.loads(path.read_text())
        return cls([float(c) for c in data["rungs_done"]],
                   [Stop(s["config"], float(s["C"]), s["reason"]) for s in data["stops"]])

    def save(self, sweep_out: Path) -> Path:
        path = Path(sweep_out) / ADAPTIVE_FILE
        atomic_write(path, json.dumps(self.to_json(), indent=1) + "\n")
        return path


def trial_curve(point: TrialPoint, trial: TrialDir) -> Curve | None:
    """Trial ``point``'s curve as its folder holds it now (eval records, per-problem counts, zero-signal check):
    what an adaptive decision sees; None before its first evaluation."""
    records = trial.records()
    if not records:
        return None
    k = point.cfg.eval.k
    curve = Curve(key=point.key, config=point.config_key, fields=point.fields,
                  compute=np.asarray([r["rollouts"] for r in records], dtype=float),
                  values={f"{m}@{k}": np.asarray([r[f"eval/{m}@{k}"] for r in records], dtype=float)
                          for m in ("mean", "best", "worst")},
                  zero_signal=zero_signal_of(records))
    return runs.attach_counts(curve, runs.counts_table(records))


def decide(sweep: Sweep, sweep_out: Path, rung: float, running: list[str], spec: AdaptiveSpec,
           ) -> tuple[list[Stop], str]:
    """The configurations of ``running`` that ``spec``'s rule stops at rung ``rung`` (rollouts), from every trial's
    curve as it stands (each ran to its first evaluation at or past the rung), and, when it stops none, why (the
    frontier rule; empty for ASHA, which always stops all but its top share)."""
    curves = [c for p in sweep.trials if (c := trial_curve(p, trial_of(sweep_out, p.key))) is not None]
    metric = sweep.metric.removeprefix("eval/")
    rule = rule_of(spec)
    if spec.method == "asha":
        return halving_stops(curves, metric, running, rung, rule.eta, seen=math.inf), ""
    decision = frontier_decision(curves, metric, running, rung, sweep.budget, rule, seen=math.inf)
    return list(decision.stops), decision.why_none()


def run_phases(sweep: Sweep, sweep_out: Path, spec: AdaptiveSpec, launch: Callable[[list[TrialPoint]], bool],
               mlflow_client, parent_id: str, log: Callable[[str], None]) -> Decisions:
    """Run ``sweep`` rung by rung (module docstring): ``launch(points)`` runs those trials to their ``PAUSE``
    (or to C where there is none) and returns False if it was interrupted. Returns the decisions, saved as they
    are made; a rerun goes on from them."""
    decisions = Decisions.load(sweep_out)
    configs = list(dict.fromkeys(p.config_key for p in sweep.trials))
    rungs = [fraction * sweep.budget for fraction in rule_of(spec).rungs]
    for rung in [*rungs, None]:
        live = [p for p in sweep.trials if p.config_key not in decisions.stopped]
        if rung is not None and rung in decisions.rungs_done:
            continue
        for p in live:
            trial = trial_of(sweep_out, p.key)
            if rung is None:
                trial.clear_pause()
            else:
                trial.request_pause(int(rung))
        pending = [p for p in live if not is_finished(trial_of(sweep_out, p.key), p.cfg)
                   and (rung is None or trial_of(sweep_out, p.key).last_step_rollouts() < rung)]
        if rung is not None:
            log(f"[adaptive] rung C/{sweep.budget / rung:g} = {rung:,.0f} rollouts: {len(pending)} trials of "
                f"{len({p.config_key for p in live})} configurations run to it")
        else:
            log(f"[adaptive] last rung, C = {sweep.budget:,}: {len(pending)} trials of "
                f"{len({p.config_key for p in live})} configurations run to it "
                f"({len(decisions.stopped)} of {len(configs)} stopped)")
        if pending and not launch(pending):
            return decisions
        if rung is None:
            break
        running = [c for c in configs if c not in decisions.stopped]
        new, why = decide(sweep, sweep_out, rung, running, spec) if len(running) > 1 else ([], "one left")
        decisions.stops += new
        decisions.rungs_done.append(rung)
        path = decisions.save(sweep_out)
        for stop in new:
            log(f"[adaptive] stopped {stop.config} at C = {stop.C:,.0f}: {stop.reason}")
            for p in sweep.trials:
                if p.config_key == stop.config:
                    trial = trial_of(sweep_out, p.key)
                    trial.clear_pause()
                    with open(trial.log_file, "a") as f:
                        f.write(f"[adaptive] stopped at C = {stop.C:,.0f} ({trial.last_step_rollouts():,} rollouts "
                                f"trained): {stop.reason}\n")
                    child = runs.find_child(mlflow_client, sweep.sweep_id, p.key)
                    if child is not None:
                        mlflow_client.set_tag(child.info.run_id, STOP_REASON_TAG, STOP_REASON)
                        mlflow_client.set_tag(child.info.run_id, STOP_DETAIL_TAG, stop.reason)
        if not new:
            log(f"[adaptive] C = {rung:,.0f}: no configuration stopped" + (f": {why}" if why else ""))
        mlflow_client.log_artifact(parent_id, str(path))
    return decisions


def stopped_trials(sweep: Sweep, sweep_out: Path) -> set[str]:
    """The keys of the trials an adaptive sweep stopped (none where it never ran adaptively)."""
    stopped = Decisions.load(sweep_out).stopped
    return {p.key for p in sweep.trials if p.config_key in stopped}
