"""A trial's learning curve as the analysis reads it: compute in rollouts and the eval metrics there.

What MLflow (:func:`isosweep.track.runs.read_curves`) or a trial's ``metrics.jsonl`` holds, in
the shape :mod:`isosweep.report.analysis` fits.
"""

from __future__ import annotations

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
