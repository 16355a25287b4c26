"""A trial's learning curve as the analysis reads it: compute in rollouts and the eval metrics there.

What MLflow (:func:`isosweep.track.runs.read_curves`) or a trial's ``metrics.jsonl`` holds, in
the shape :mod:`isosweep.report.analysis` fits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
