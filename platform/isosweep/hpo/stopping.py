"""Early stopping of GRPO trials from their training dynamics.

A bad GRPO configuration usually announces itself long before its final evaluation: the policy
runs away from the reference (KL grows geometrically), the reward collapses after having been
learned, or the reward never leaves zero (no group has a non-zero advantage, so there is no
gradient at all). Stopping such a trial early gives the rest of its budget to other trials.

Each rule is a pure function of a metric stream, the list of reports of one trial so far (dicts
with keys such as ``"train/kl"``, ``"train/reward"`` and ``"rollouts"``), and answers "does the
rule fire at the *last* report?" with a details dict or ``None``. ``DynamicsStopper`` applies
them as a Ray Tune ``Stopper`` and records, per trial, which rule fired and why, so the
integrator can tag the run (``on_stop``).

Reports that lack a rule's key are ignored by that rule (e.g. evaluation-only reports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ray.tune.stopper import Stopper

KL_KEY = "train/kl"
REWARD_KEY = "train/reward"
PROGRESS_KEY = "rollouts"

Stream = Sequence[Mapping[str, Any]]


def _series(stream: Stream, key: str) -> list[tuple[int, float]]:
    """``(report index, value)`` of the reports carrying a finite ``key``."""
    out = []
    for i, report in enumerate(stream):
        value = report.get(key)
        if value is None:
            continue
        value = float(value)
        if math.isfinite(value):
            out.append((i, value))
    return out


def kl_growth(stream: Stream, tau1: float, k: int, *, kl_key: str = KL_KEY, kl_floor: float = 1e-4
              ) -> dict[str, Any] | None:
    """Fire when the KL growth ratio ``(KL_t - KL_{t-1}) / KL_{t-1}`` exceeded ``tau1`` (strictly)
    on each of the last ``k`` reports.

    A healthy run's KL to the reference grows at first and then flattens; a run whose step size
    is too large drifts away geometrically, i.e. with a roughly constant ratio above zero. One
    large ratio is common noise, ``k`` in a row is a trend. Ratios whose previous KL is below
    ``kl_floor`` are undefined noise (KL starts at exactly 0, and 0 -> 1e-6 is an "infinite"
    ratio) and break the streak, so the rule only judges a KL that is measurably non-zero.
    The last report must carry the KL key: a rule fires on the report that completes it.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1 (got {k})")
    series = _series(stream, kl_key)
    if len(series) < k + 1 or series[-1][0] != len(stream) - 1:
        return None
    ratios = []
    for (_, prev), (_, cur) in zip(series[-k - 1:-1], series[-k:]):
        if prev < kl_floor:
            return None
        ratios.append((cur - prev) / prev)
    if all(r > tau1 for r in ratios):
        return {"ratios": ratios, "tau1": tau1, "k": k, "kl": series[-1][1]}
    return None


def reward_drop(stream: Stream, tau2: float, *, reward_key: str = REWARD_KEY, min_peak: float = 0.0,
                window: int = 1) -> dict[str, Any] | None:
    """Fire when the reward falls strictly below ``(1 - tau2)`` times its running maximum.

    A reward that was learned and is then lost is a collapse (entropy blow-up, a runaway
    update), not noise, provided the drop is large; ``tau2`` is that relative size. A drop of
    exactly ``tau2`` does not fire. ``window`` > 1 smooths the reward with a trailing mean first
    (per-step rewards are batch means and noisy); ``min_peak`` ignores peaks too small to lose.
    """
    if not 0 < tau2 <= 1:
        raise ValueError(f"tau2 must be in (0, 1] (got {tau2})")
    if window < 1:
        raise ValueError(f"window must be at least 1 (got {window})")
    series = _series(stream, reward_key)
    if len(series) < 2 or series[-1][0] != len(stream) - 1:
        return None
    values = [v for _, v in series]
    smooth = [sum(values[max(0, i - window + 1):i + 1]) / len(values[max(0, i - window + 1):i + 1])
              for i in range(len(values))]
    peak = max(smooth[:-1])
    current = smooth[-1]
    if peak > 0 and peak >= min_peak and current < (1 - tau2) * peak:
        return {"reward": current, "peak": peak, "drop": 1 - current / peak, "tau2": tau2}
    return None


def zero_reward(stream: Stream, grace: float, *, reward_key: str = REWARD_KEY, progress_key: str = PROGRESS_KEY,
                eps: float = 0.0) -> dict[str, Any] | None:
    """Fire when the reward has been zero (``<= eps``) on every report and the trial has run at
    least ``grace`` rollouts.

    With binary rewards and a zero reward everywhere, every GRPO group has zero advantage and
    the update is exactly zero: the trial can never learn. The grace period gives the first
    lucky samples time to appear; before it the rule never fires. A trial that once had a
    positive reward and lost it is ``reward_drop``'s business, not this rule's.
    """
    series = _series(stream, reward_key)
    if not series or series[-1][0] != len(stream) - 1:
        return None
    if any(v > eps for _, v in series):
        return None
    progress = stream[-1].get(progress_key)
    if progress is None or float(progress) < grace:
        return None
    return {"rollouts": float(progress), "grace": grace, "eps": eps, "reports": len(series)}


@dataclass(frozen=True)
class StopReason:
    """Which rule stopped a trial (``rule`` is ``"kl_growth"``, ``"reward_drop"`` or ``"zero_reward"``),
    at which report, and the numbers that made it fire."""

    rule: str
    report: int
    details: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in self.details.items())
        return f"{self.rule} at report {self.report}: {shown}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return str(value)


class DynamicsStopper(Stopper):
    """A Ray Tune stopper applying the three dynamics rules to each trial's reports.

    Pass ``None`` for a rule's threshold to switch it off. Rules are checked in the order
    kl_growth, reward_drop, zero_reward; the first that fires is the recorded reason.
    ``on_stop(trial_id, reason)`` is called once per stopped trial (e.g. to tag its MLflow run).
    The stopper never stops the whole experiment.
    """

    def __init__(self, *, tau1: float | None = 0.5, k: int = 3, tau2: float | None = 0.5,
                 grace: float | None = None, eps: float = 0.0, kl_floor: float = 1e-4, reward_window: int = 1,
                 min_peak: float = 0.0, kl_key: str = KL_KEY, reward_key: str = REWARD_KEY,
                 progress_key: str = PROGRESS_KEY,
                 on_stop: Callable[[str, StopReason], None] | None = None) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1 (got {k})")
        if tau2 is not None and not 0 < tau2 <= 1:
            raise ValueError(f"tau2 must be in (0, 1] (got {tau2})")
        if reward_window < 1:
            raise ValueError(f"reward_window must be at least 1 (got {reward_window})")
        self.tau1, self.k, self.tau2, self.grace, self.eps = tau1, k, tau2, grace, eps
        self.kl_floor, self.reward_window, self.min_peak = kl_floor, reward_window, min_peak
        self.kl_key, self.reward_key, self.progress_key = kl_key, reward_key, progress_key
        self.on_stop = on_stop
        self.history: dict[str, list[dict[str, Any]]] = {}
        self._reasons: dict[str, StopReason] = {}

    def check(self, stream: Stream) -> tuple[str, dict[str, Any]] | None:
        """The first rule that fires at the last report of ``stream``, as ``(rule, details)``."""
        if self.tau1 is not None:
            hit = kl_growth(stream, self.tau1, self.k, kl_key=self.kl_key, kl_floor=self.kl_floor)
            if hit is not None:
                return "kl_growth", hit
        if self.tau2 is not None:
            hit = reward_drop(stream, self.tau2, reward_key=self.reward_key, min_peak=self.min_peak,
                              window=self.reward_window)
            if hit is not None:
                return "reward_drop", hit
        if self.grace is not None:
            hit = zero_reward(stream, self.grace, reward_key=self.reward_key, progress_key=self.progress_key,
                              eps=self.eps)
            if hit is not None:
                return "zero_reward", hit
        return None

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        if trial_id in self._reasons:
            return True
        stream = self.history.setdefault(trial_id, [])
        stream.append(dict(result))
        hit = self.check(stream)
        if hit is None:
            return False
        rule, details = hit
        reason = StopReason(rule=rule, report=len(stream) - 1,
                            details={**details, self.progress_key: stream[-1].get(self.progress_key)})
        self._reasons[trial_id] = reason
        if self.on_stop is not None:
            self.on_stop(trial_id, reason)
        return True

    def stop_all(self) -> bool:
        return False

    def reason(self, trial_id: str) -> StopReason | None:
        """Why ``trial_id`` was stopped, or ``None`` if no rule fired for it."""
        return self._reasons.get(trial_id)

    @property
    def reasons(self) -> dict[str, StopReason]:
        return dict(self._reasons)
