"""A trial's learning curve as the analysis reads it: compute in rollouts and the eval metrics there.

What MLflow (:func:`isosweep.track.runs.read_curves`) or a trial's ``metrics.jsonl`` holds, in
the shape :mod:`isosweep.report.analysis` fits, with the trial's step-0 zero-signal check where it
logged one (:func:`zero_signal_of`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

COUNTS_KEY = "eval_correct"
"""Eval-record key of the per-problem correct counts (a list, one int per eval problem)."""
SAMPLES_KEY = "eval_samples"
"""Eval-record key of the samples drawn per eval problem (what the counts are out of)."""
EVAL_SET_KEY = "eval_set"
"""Eval-record key of the eval set's id (a hash of its problems in order): equal ids can be paired."""
COUNTS_ARTIFACT = "eval_counts.json"
"""The trial run's artifact with every evaluation's counts: ``{"samples", "eval_set", "rollouts": [...],
"correct": [[...], ...]}``."""


ZERO_SIGNAL_KEYS = ("check/zero_signal_observed", "check/zero_signal_expected", "check/zero_signal_sd")
"""Eval-record keys of the step-0 zero-signal check (:func:`isosweep.trial.loop.zero_signal_check`): observed,
expected, sd. The first eval record after step 0 holds them; trials of an earlier isosweep never do."""


@dataclass(frozen=True)
class ZeroSignalCheck:
    """A trial's zero-signal check at step 0: the fraction of its first batch's GRPO groups whose rewards were all
    equal (``observed``), what the base model's probed pass rates predict for that batch (``expected``,
    :func:`isosweep.models.problemsets.zero_signal`), and the standard deviation of the observed fraction over
    that batch if the prediction is right (``sd``)."""

    observed: float
    expected: float
    sd: float

    def to_json(self) -> dict:
        return {"observed": self.observed, "expected": self.expected, "sd": self.sd}

    @classmethod
    def from_json(cls, data: dict) -> ZeroSignalCheck:
        return cls(float(data["observed"]), float(data["expected"]), float(data["sd"]))


def zero_signal_of(records: Iterable[dict]) -> ZeroSignalCheck | None:
    """The check of the first of ``records`` (eval records, or MLflow's metrics of one step, keyed as
    :data:`ZERO_SIGNAL_KEYS`) that holds all three numbers, finite; None when none does (a trial run before the
    check, or one not yet past step 0)."""
    for record in records:
        values = [record.get(key) for key in ZERO_SIGNAL_KEYS]
        if all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            return ZeroSignalCheck(*(float(v) for v in values))
    return None


def without_counts(record: dict) -> dict:
    """``record`` without its per-problem counts: what Ray reports and Tune keeps per result."""
    return {key: value for key, value in record.items() if key not in (COUNTS_KEY, SAMPLES_KEY, EVAL_SET_KEY)}


@dataclass
class Curve:
    """One trial's eval curve."""

    key: str
    """The trial (``n8-Bp16``, ``n8-Bp16-s1``)."""
    config: str
    """Its allocation without the seed (``n8-Bp16``): seeds of one config share a fit."""
    fields: dict[str, int]
    """``n``, ``Bp``, ``M``, ``seed``."""
    compute: np.ndarray
    """``(evals,)`` rollouts at each evaluation."""
    values: dict[str, np.ndarray]
    """metric name (``mean@4``) -> ``(evals,)`` values."""
    counts: np.ndarray | None = None
    """``(evals, problems)`` correct counts per eval problem, where the trial saved them (else None)."""
    samples: int | None = None
    """Samples per eval problem behind ``counts``."""
    eval_set: str | None = None
    """Id of the eval problems behind ``counts`` (trials with one id are paired problem by problem)."""
    zero_signal: ZeroSignalCheck | None = None
    """The trial's zero-signal check at step 0, where it logged one (else None)."""

    def to_json(self) -> dict:
        """The curve as ``curves.json`` holds it; ``zero_signal`` only where there is one, so a curve without it
        is written as before the check existed."""
        out = {"key": self.key, "config": self.config, "fields": self.fields, "compute": self.compute.tolist(),
               "values": {name: v.tolist() for name, v in self.values.items()},
               "counts": None if self.counts is None else self.counts.astype(int).tolist(),
               "samples": self.samples, "eval_set": self.eval_set}
        if self.zero_signal is not None:
            out["zero_signal"] = self.zero_signal.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> Curve:
        """A curve of :meth:`to_json`, of this version or an earlier one (no ``counts``, no ``zero_signal``)."""
        counts, check = data.get("counts"), data.get("zero_signal")
        return cls(key=data["key"], config=data["config"], fields={k: int(v) for k, v in data["fields"].items()},
                   compute=np.asarray(data["compute"], dtype=float),
                   values={name: np.asarray(v, dtype=float) for name, v in data["values"].items()},
                   counts=None if counts is None else np.asarray(counts, dtype=float),
                   samples=data.get("samples"), eval_set=data.get("eval_set"),
                   zero_signal=None if check is None else ZeroSignalCheck.from_json(check))


CURVES_FILE = "curves.json"
"""A finished sweep's data as a study folder keeps it (:meth:`SweepData.to_json`): enough to redo its
analysis, or plan from it, without MLflow."""


@dataclass
class SweepData:
    """A finished sweep as the planner reads it: its id and budget, one trial's config and the sweep
    file's settings (flattened, as MLflow params), and every trial's curve."""

    sweep_id: str
    budget: int
    trial_params: dict[str, str]
    """One trial's full config, dotted keys (``task.name``, ``algorithm.lr_ref``, ...) as strings."""
    sweep_params: dict[str, str]
    """The sweep file's settings, dotted keys (``sweep.file``, ``spec.trial``, ``spec.set.profile``, ...)."""
    curves: list[Curve]

    def to_json(self) -> dict:
        return {"sweep_id": self.sweep_id, "budget": self.budget, "trial_params": self.trial_params,
                "sweep_params": self.sweep_params, "curves": [c.to_json() for c in self.curves]}

    @classmethod
    def from_json(cls, data: dict, where: str = "") -> SweepData:
        try:
            return cls(sweep_id=data["sweep_id"], budget=int(data["budget"]), trial_params=data["trial_params"],
                       sweep_params=data["sweep_params"], curves=[Curve.from_json(c) for c in data["curves"]])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where or 'sweep data'}: not a sweep's curves file ({type(e).__name__}: {e})") from e
