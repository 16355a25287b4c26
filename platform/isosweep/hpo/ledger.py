"""The study ledger of an HPO study: what ran at which fidelity, what it cost, what is left to spend.

Pure bookkeeping, testable without Ray, MLflow or disk. The Tune searcher of a study
(:class:`isosweep.run.hpo.StudySearch`) asks it what to do next and tells it what finished:

- **Spent and committed budget.** A finished trial is charged ``study.cost(size, rollouts trained)``
  (a promoted trial only for the rollouts beyond the checkpoint it continued from); a running one
  commits the cost of its whole budget. No trial is started that the rest cannot pay for.
- **Fidelity cuts** (JF-HPO): a proposal whose budget the rest cannot pay for is cut to what it
  can (then moved to the smallest size), keeping one full-fidelity trial's worth in reserve for
  the final recommendation at the target.
- **Promotions**: a trial of a configuration that finished at a smaller budget continues from it;
  with ``promote_within`` a proposal that close to a finished trial's hyperparameters is snapped
  to them.
- **The incumbent trajectory**: the best target-size evaluation after each finished trial.

``study`` is the loaded study (:class:`isosweep.spec.hpo.HPOStudy`): its ``cost``, budgets,
search space and spec are all the ledger reads.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal


@dataclass
class TrialEntry:
    """One trial of the study: what ran, at which fidelity, what it reached and cost."""

    key: str
    size: str
    budget: int
    params: dict[str, float]
    status: str = "running"
    """``running``, ``done`` (reached its budget), ``stopped`` (a dynamics rule or ASHA), ``failed``."""
    start_rollouts: int = 0
    """Rollouts already trained when it started (a promoted trial continues from them)."""
    promoted_from: str | None = None
    final: bool = False
    """The recommendation run at the target fidelity at the end of a JF-HPO study."""
    inner_id: str | None = None
    """The trial's id in the inner searcher (None for the final recommendation, which it did not propose)."""
    reached: int = 0
    value: float | None = None
    """The metric at the last evaluation."""
    best: float | None = None
    """The best evaluation of the metric along the trial after training started (its records, promoted
    ones included; not the base model's evaluation at rollouts 0)."""
    cost: float = 0.0
    stop_reason: str = ""
    seconds: float | None = None
    spent_after: float | None = None

    @property
    def config_key(self) -> str:
        """The registry key: size and hyperparameters, without the budget."""
        return json.dumps([self.size, sorted(self.params.items())])


Next = Literal["wait", "finished", "propose", "final"]
"""What the study does next: wait for a running trial, end, ask the searcher, or run the final recommendation."""


@dataclass
class StudyLedger:
    """The study's trials and budget (see the module docstring)."""

    study: Any
    trials: dict[str, TrialEntry] = field(default_factory=dict)
    spent: float = 0.0
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    final_issued: bool = False
    finished: bool = False

    # -- what is spent and left ---------------------------------------------------------------
    def nominal_cost(self, entry: TrialEntry) -> float:
        """What ``entry`` costs if it trains to its budget (from where it starts)."""
        return self.study.cost(entry.size, entry.budget - entry.start_rollouts)

    @property
    def running(self) -> list[TrialEntry]:
        return [t for t in self.trials.values() if t.status == "running"]

    @property
    def committed(self) -> float:
        return sum(self.nominal_cost(t) for t in self.running)

    @property
    def left(self) -> float:
        return self.study.study_budget - self.spent - self.committed

    def incumbent(self) -> float | None:
        """The best evaluation reached by any trial at the target size (None before the first)."""
        values = [t.best for t in self.trials.values() if t.size == self.study.target and t.best is not None]
        return max(values, default=None)

    @property
    def final_reserve(self) -> float:
        """What JF-HPO keeps back for the final recommendation at the target (0 once it is issued)."""
        spec = self.study.spec
        final = spec.search == "jfhpo" and spec.jfhpo.final_at_target and not self.final_issued
        return self.study.cost(self.study.target, self.study.budget) if final else 0.0

    # -- what next ----------------------------------------------------------------------------
    def next(self) -> tuple[Next, float | None]:
        """What the study does next, and for ``propose`` the room (target-equivalent rollouts) a JF-HPO
        proposal's budget must fit (None: random search and ASHA, which run whole full-fidelity trials)."""
        study, spec = self.study, self.study.spec
        wait = "wait" if self.running else "finished"
        if self.spent >= study.study_budget or len(self.trials) >= spec.max_trials:
            return wait, None
        if spec.search == "jfhpo":
            if self.final_issued:
                # the recommendation is final: a trial after it could not change it. A promoted final costs less than
                # the full trial kept back for it, which would otherwise open room for one more proposal
                return wait, None
            room = self.left - self.final_reserve
            if room >= study.cost(study.space.ladder[0][0], study.space.budget_min):
                return "propose", room - spec.cost.per_trial * study.budget
            if self.final_reserve > 0:
                return ("wait" if self.running else "final"), None  # recommend once every running result is in
            return wait, None
        # random search and ASHA start every trial at the full fidelity: one starts only if the study can pay for
        # all of it, so the study never overspends (ASHA's early stops leave room for more trials)
        if self.left >= study.cost(study.target, study.budget) - 1e-6:
            return "propose", None
        return wait, None

    def fit_budget(self, size: str, budget: int, room: float) -> tuple[str, int]:
        """``(size, budget)`` cut to what ``room`` pays for: the budget first, then the smallest size."""
        study, space = self.study, self.study.space
        fit = int(room / study.size_ratio(size)) // study.batch * study.batch
        if fit < space.budget_min:
            size = space.ladder[0][0]
            fit = int(room / study.size_ratio(size)) // study.batch * study.batch
        return size, (max(space.budget_min, fit) if fit < budget else budget)

    def _distance(self, a: dict[str, float], b: dict[str, float]) -> float:
        """Max-norm distance of two hyperparameter settings in the unit cube."""
        return max(abs(p.to_unit(a[p.name]) - p.to_unit(b[p.name])) for p in self.study.space.params)

    def nearest(self, size: str, params: dict[str, float], budget: int, radius: float) -> TrialEntry | None:
        """The finished trial at ``size`` with a smaller budget whose hyperparameters are nearest ``params``
        (unit cube, max norm), if within ``radius``."""
        best, best_d = None, math.inf
        for t in self.trials.values():
            if t.status != "done" or t.size != size or t.reached >= budget:
                continue
            d = self._distance(params, t.params)
            if d <= radius and d < best_d:
                best, best_d = t, d
        return best

    def promotion_source(self, entry: TrialEntry, has_checkpoint) -> TrialEntry | None:
        """The finished trial of ``entry``'s configuration with the largest budget below its budget, if any
        (``has_checkpoint(key)`` says whether a trial left a checkpoint to continue from)."""
        found = [t for t in self.trials.values()
                 if t.config_key == entry.config_key and t.status == "done" and 0 < t.reached < entry.budget
                 and has_checkpoint(t.key)]
        return max(found, key=lambda t: t.reached, default=None)

    def ran_at_target(self, params: dict[str, float]) -> TrialEntry | None:
        """The trial that already ran ``params`` at the target fidelity (size and full budget), if any."""
        study = self.study
        return next((t for t in self.trials.values() if t.status == "done" and t.size == study.target
                     and t.reached >= study.budget and self._distance(params, t.params) <= 1e-6), None)

    def final_params(self, params: dict[str, float]) -> dict[str, float]:
        """The hyperparameters the final recommendation runs with: those of a finished target-size trial
        within rounding of ``params`` (so that it is promoted from it), else ``params``."""
        same = self.nearest(self.study.target, params, self.study.budget, 1e-6)  # undo the unit-cube round trip
        return dict(same.params) if same else params

    def add(self, entry: TrialEntry) -> None:
        self.trials[entry.key] = entry

    # -- what finished ------------------------------------------------------------------------
    def complete(self, key: str, records: list[dict], trained_to: int, *, error: bool, stop_rule: str | None,
                 seconds: float | None) -> TrialEntry:
        """Charge trial ``key`` for what it trained (``trained_to`` rollouts) and note what it reached from
        its eval ``records``; ``stop_rule`` is why it was stopped early (None if it was not stopped by a rule)."""
        study, metric = self.study, self.study.metric
        entry = self.trials[key]
        entry.reached = records[-1]["rollouts"] if records else 0
        entry.value = records[-1][metric] if records else None
        entry.best = max((r[metric] for r in records if r["rollouts"] > 0), default=None)  # not the base model's
        entry.cost = study.cost(entry.size, max(0, trained_to - entry.start_rollouts))
        entry.seconds = seconds
        if error:
            entry.status, entry.stop_reason = "failed", "error"
        elif entry.reached >= entry.budget:
            entry.status, entry.stop_reason = "done", "completed"
        else:
            entry.status = "stopped"
            entry.stop_reason = stop_rule or ("asha" if study.spec.search == "asha" else "stopped")
        self.spent += entry.cost
        entry.spent_after = self.spent
        self.trajectory.append({"trial": key, "spent": self.spent, "incumbent": self.incumbent(),
                                "best_any": max((t.best for t in self.trials.values() if t.best is not None),
                                                default=None)})
        return entry

    # -- state ----------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """The ledger as JSON-able data (without the study, which is loaded from its file)."""
        return {"trials": [asdict(t) for t in self.trials.values()], "spent": self.spent,
                "trajectory": self.trajectory, "final_issued": self.final_issued, "finished": self.finished}

    def load(self, state: dict[str, Any]) -> None:
        self.trials = {t["key"]: TrialEntry(**t) for t in state["trials"]}
        self.spent, self.trajectory = state["spent"], state["trajectory"]
        self.final_issued, self.finished = state["final_issued"], state["finished"]
