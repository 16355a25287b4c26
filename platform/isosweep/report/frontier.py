"""Sigmoid fits of eval curves in compute, and what they can and cannot say.

Pure functions of numpy arrays (no Ray, MLflow or config classes). Compute ``C`` is always in
**rollouts** (sampled completions), as logged at each eval step; ``value`` is the eval metric in
its own units (a rate such as mean@k in ``[0, 1]``, usually). What this module promises:

- :func:`sigmoid` is ``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)``, evaluated without overflow.
- :func:`fit_sigmoid` fits it to one config's points with a robust loss under the bounds below
  and returns a point fit (:class:`SigmoidFit`); it makes no intervals. The points of one
  learning curve are not independent, so a caller that needs uncertainty resamples what is
  independent (seeds, eval problems), refits each resample and keeps the refits in
  :attr:`SigmoidFit.boot` (the sweep analysis does, in :mod:`isosweep.report.fitting`).
- :func:`identification` says why a fit's plateau, midpoint or slope is set by its bounds rather
  than by the data.

Fitting details. The fit is parameterised as ``(u0, u1, log C_mid, B)`` with box bounds, where
``R0 = lo + (hi - lo) * u0`` and ``A = R0 + (hi - R0) * u1`` for ``u0, u1 in [0, 1]``: this
keeps ``lo <= R0 <= A <= hi`` exactly, which ``least_squares``' box bounds cannot say about
``(R0, A)`` directly. ``C_mid`` is fitted in log space because compute spans decades. The
value bounds ``[lo, hi]`` are ``[0, 1]`` when every value is a rate in ``[0, 1]``, else the
observed range widened by its own width on each side.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import OptimizeResult, least_squares
from scipy.special import expit

PARAM_NAMES = ("R0", "A", "C_mid", "B")
"""Order of the columns of :attr:`SigmoidFit.boot`."""

MIN_POINTS = 4
"""A 4-parameter sigmoid needs at least 4 distinct compute values."""

B_BOUNDS = (1e-2, 20.0)
"""Allowed slope ``B`` (per unit of ``ln C``): positive, and at most a near-step."""

C_MID_RANGE = 100.0
"""``C_mid`` may lie at most this factor below the smallest or above the largest compute."""

Loss = Literal["linear", "soft_l1", "huber", "cauchy", "arctan"]
_LOSSES = get_args(Loss)


def _curve(compute: ArrayLike, value: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``compute`` and ``value`` as float64 ``(points,)`` arrays, after checking shapes."""
    c = np.asarray(compute, dtype=np.float64)
    v = np.asarray(value, dtype=np.float64)
    if c.ndim != 1 or v.shape != c.shape:
        raise ValueError(
            f"compute and value must be 1-D arrays of one length, got shapes {c.shape} and {v.shape}"
        )
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(v))):
        raise ValueError("compute and value must be finite (no nan or inf)")
    return c, v


def sigmoid(C: ArrayLike, R0: float, A: float, C_mid: float, B: float) -> float | np.ndarray:
    """``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)``, elementwise.

    ``R0`` is the value as ``C -> 0``, ``A`` the asymptote as ``C -> inf``, ``C_mid`` (rollouts)
    the compute at which half of the gain ``A - R0`` is reached, ``B`` the slope in ``ln C``.
    Increasing in ``C`` for ``B > 0`` and ``A > R0``. Evaluated as
    ``R0 + (A - R0) * expit(B * (ln C - ln C_mid))``, which neither overflows nor divides by
    zero for extreme ``C``.

    Args:
        C: compute in rollouts, scalar or any shape, ``> 0``.

    Returns:
        float for a scalar ``C``, else a float64 array of ``C``'s shape.
    """
    c = np.asarray(C, dtype=np.float64)
    if np.any(c <= 0):
        raise ValueError("compute C must be > 0")
    out = R0 + (A - R0) * expit(B * (np.log(c) - np.log(C_mid)))
    return float(out) if np.ndim(C) == 0 else out


@dataclass(frozen=True)
class SigmoidFit:
    """A sigmoid fitted to one config's points, and the refits of resamples a caller made of it."""

    params: dict[str, float]
    """``R0``, ``A`` (metric units), ``C_mid`` (rollouts) and ``B`` of the fit to all points."""
    n: int
    """Number of points fitted."""
    success: bool
    """Whether ``least_squares`` reported convergence on the full data."""
    boot: np.ndarray = field(default_factory=lambda: np.empty((0, 4)), compare=False, repr=False)
    """``(fits, 4)``: parameters of refits of resampled data, columns :data:`PARAM_NAMES`; empty from
    :func:`fit_sigmoid`, filled by a caller that resamples (seeds, eval problems) and refits."""
    bounds: tuple[float, float] = (0.0, 1.0)
    """``(lo, hi)``, the value bounds ``R0`` and ``A`` were fitted within."""

    @property
    def ci(self) -> dict[str, tuple[float, float]]:
        """90% percentile interval ``(low, high)`` of :attr:`boot` per parameter; ``(nan, nan)``
        when there are no refits."""
        if len(self.boot) == 0:
            return {name: (np.nan, np.nan) for name in PARAM_NAMES}
        low, high = np.quantile(self.boot, [0.05, 0.95], axis=0)
        return {name: (float(low[i]), float(high[i])) for i, name in enumerate(PARAM_NAMES)}

    def predict(self, C: ArrayLike) -> float | np.ndarray:
        """The fitted curve at compute ``C`` (rollouts, any shape); see :func:`sigmoid`."""
        return sigmoid(C, **self.params)


def _value_bounds(v: np.ndarray) -> tuple[float, float]:
    """``[0, 1]`` for rates, else the observed range widened by its width on each side."""
    if v.min() >= 0.0 and v.max() <= 1.0:
        return 0.0, 1.0
    width = v.max() - v.min()
    if width == 0.0:
        width = max(abs(v.max()), 1.0)
    return v.min() - width, v.max() + width


def _to_params(theta: np.ndarray, lo: float, hi: float) -> tuple[float, float, float, float]:
    """Box-bounded ``(u0, u1, log C_mid, B)`` -> ``(R0, A, C_mid, B)``."""
    u0, u1, log_mid, b = theta
    r0 = lo + (hi - lo) * u0
    return r0, r0 + (hi - r0) * u1, float(np.exp(log_mid)), b


def _fit_once(
    log_c: np.ndarray,
    v: np.ndarray,
    x0: np.ndarray,
    box: tuple[np.ndarray, np.ndarray],
    value_range: tuple[float, float],
    loss: str,
    f_scale: float,
    fixed_u0: float | None = None,
) -> OptimizeResult:
    """One ``least_squares`` run from ``x0`` in the ``(u0, u1, log C_mid, B)`` space; with ``fixed_u0``
    (``R0`` known) ``u0`` is held there and only ``(u1, log C_mid, B)`` are fitted. The result's ``x``
    is always the full 4-vector."""
    lo, hi = value_range
    width = hi - lo
    free = slice(1, 4) if fixed_u0 is not None else slice(0, 4)

    def full(theta: np.ndarray) -> np.ndarray:
        return np.concatenate([[fixed_u0], theta]) if fixed_u0 is not None else theta

    def residuals(theta: np.ndarray) -> np.ndarray:
        u0, u1, log_mid, b = full(theta)
        s = expit(b * (log_c - log_mid))
        r0 = lo + width * u0
        return r0 + (hi - r0) * u1 * s - v

    def jacobian(theta: np.ndarray) -> np.ndarray:
        u0, u1, log_mid, b = full(theta)
        s = expit(b * (log_c - log_mid))
        gain = width * (1.0 - u0) * u1  # A - R0
        slope = gain * s * (1.0 - s)
        return np.stack(
            [width * (1.0 - u1 * s), width * (1.0 - u0) * s, -b * slope, (log_c - log_mid) * slope],
            axis=1,
        )[:, free]

    # Start strictly inside the box: on a bound the u-parameterisation can have a zero column.
    lower, upper = box[0][free], box[1][free]
    start = np.clip(np.asarray(x0, dtype=np.float64)[free], lower + 1e-6 * (upper - lower),
                    upper - 1e-6 * (upper - lower))
    run = least_squares(
        residuals, start, jac=jacobian, bounds=(lower, upper), loss=loss, f_scale=f_scale, x_scale="jac"
    )
    run.x = full(run.x)
    return run


def fit_sigmoid(
    compute: ArrayLike,
    value: ArrayLike,
    loss: Loss = "soft_l1",
    f_scale: float | None = None,
    value_bounds: tuple[float, float] | None = None,
    R0: float | None = None,
    start: dict[str, float] | None = None,
) -> SigmoidFit:
    """Fit :func:`sigmoid` to one config's points: the best of a few robust least-squares runs.

    Uses ``scipy.optimize.least_squares`` with a robust ``loss`` under the bounds
    ``lo <= R0 <= A <= hi`` (see the module docstring for ``[lo, hi]``), ``B`` in
    :data:`B_BOUNDS` and ``C_mid`` within a factor :data:`C_MID_RANGE` of the observed compute,
    fitted as ``log C_mid``. Initial guesses come from the data: ``R0`` and ``A`` the smallest
    and largest value, ``C_mid`` where the running best first reaches their midpoint (and the
    geometric mean of the compute), ``B`` 1 and 3; the best of these four starts is kept.

    Deterministic: the same points and options give the same fit. No intervals: the points of
    one learning curve are not independent, so resampling them would understate the
    uncertainty; a caller that needs it resamples seeds and eval problems, refits each resample
    (passing this fit as ``start``) and keeps the refits in :attr:`SigmoidFit.boot`.

    Args:
        compute: ``(points,)``, compute in rollouts, ``> 0``.
        value: ``(points,)``, the metric at each point.
        loss: a ``least_squares`` loss; ``"linear"`` is plain least squares.
        f_scale: residual scale (metric units) beyond which the robust loss grows slower than
            squares. ``None``: 1.4826 x the median absolute residual of a first robust fit
            (a MAD estimate of the noise), so outliers are judged against the curve's own noise.
        value_bounds: ``(lo, hi)`` for ``R0`` and ``A``, overriding the default.
        R0: the value at ``C -> 0`` when it is known (the base model's measured value): held
            fixed, so only ``A``, ``C_mid`` and ``B`` are fitted. Clipped into ``[lo, hi]``.
        start: parameters to start from (e.g. the full-data fit when refitting a resample):
            one ``least_squares`` run from there instead of the four data-derived starts.

    Returns:
        a :class:`SigmoidFit` with an empty ``boot``; ``success`` is ``least_squares``' own verdict
        (a fit that did not converge is returned, not raised).
    """
    c, v = _curve(compute, value)
    if len(c) < MIN_POINTS:
        raise ValueError(f"need at least {MIN_POINTS} points to fit a sigmoid, got {len(c)}")
    if np.any(c <= 0):
        raise ValueError("compute must be > 0 (rollouts) to fit a sigmoid in log compute")
    if len(np.unique(c)) < MIN_POINTS:
        raise ValueError(f"need at least {MIN_POINTS} distinct compute values, got {len(np.unique(c))}")
    if loss not in _LOSSES:
        raise ValueError(f"loss must be one of {_LOSSES}, got {loss!r}")
    if f_scale is not None and not f_scale > 0:
        raise ValueError(f"f_scale must be > 0, got {f_scale}")
    if R0 is not None and not np.isfinite(R0):
        raise ValueError(f"R0 must be finite, got {R0}")
    lo, hi = _value_bounds(v if R0 is None else np.append(v, R0)) if value_bounds is None else map(float, value_bounds)
    if not lo < hi:
        raise ValueError(f"value_bounds must have lo < hi, got ({lo}, {hi})")
    fixed_u0 = None if R0 is None else float(np.clip((R0 - lo) / (hi - lo), 0.0, 1.0 - 1e-9))

    log_c = np.log(c)
    box = (
        np.array([0.0, 0.0, log_c.min() - np.log(C_MID_RANGE), B_BOUNDS[0]]),
        np.array([1.0, 1.0, log_c.max() + np.log(C_MID_RANGE), B_BOUNDS[1]]),
    )
    # Initial guesses from the data, in the u-space: R0 at the smallest value (or the known one), A at the largest.
    r0 = np.clip(v.min(), lo, hi) if R0 is None else lo + (hi - lo) * fixed_u0
    u0 = (r0 - lo) / (hi - lo)
    u1 = (np.clip(v.max(), lo, hi) - r0) / (hi - r0) if hi > r0 else 0.5
    u1 = float(np.clip(u1, 0.0, 1.0))
    order = np.argsort(c, kind="stable")
    running = np.maximum.accumulate(v[order])
    crossing = log_c[order][np.argmax(running >= (v.min() + v.max()) / 2.0)]
    if start is not None:
        s_r0, s_a = float(start["R0"]), float(start["A"])
        s_u0 = (s_r0 - lo) / (hi - lo) if fixed_u0 is None else fixed_u0
        s_r0 = lo + (hi - lo) * s_u0
        s_u1 = (s_a - s_r0) / (hi - s_r0) if hi > s_r0 else 0.5
        starts = [np.array([s_u0, float(np.clip(s_u1, 0.0, 1.0)), np.log(start["C_mid"]), start["B"]])]
    else:
        starts = [np.array([u0, u1, m, b]) for m in (crossing, log_c.mean()) for b in (1.0, 3.0)]

    span = float(np.ptp(v)) or 1.0
    scale = 0.05 * span if f_scale is None else f_scale

    def best_of(x0s: list[np.ndarray], scale: float) -> OptimizeResult:
        runs = [_fit_once(log_c, v, x0, box, (lo, hi), loss, scale, fixed_u0) for x0 in x0s]
        return min(runs, key=lambda r: (not r.success, r.cost))

    best = best_of(starts, scale)
    if f_scale is None and loss != "linear":
        # Floor: an exact curve has zero residuals; keep the loss defined and ~L1 there.
        scale = max(1.4826 * float(np.median(np.abs(best.fun))), 1e-6 * span)
        best = best_of([best.x], scale)

    params = dict(zip(PARAM_NAMES, map(float, _to_params(best.x, lo, hi))))
    return SigmoidFit(
        params=params,
        n=len(c),
        success=bool(best.success),
        bounds=(float(lo), float(hi)),
    )


IDENTIFIED_GAIN = 0.75
"""A fit is identified only if its curve reaches this fraction of its fitted gain within the data."""


def identification(fit: SigmoidFit, c_max: float) -> list[str]:
    """Why ``fit``'s plateau or midpoint is not pinned down by data reaching ``c_max`` (empty: identified).

    - ``A`` on its upper bound: the data never showed the curve flattening, so the plateau is
      only "at least this"; extrapolating it is guesswork.
    - less than :data:`IDENTIFIED_GAIN` of the fitted gain ``A - R0`` reached by ``c_max``: the
      data have not shown the bend (with ``C_mid`` near or beyond ``c_max``, ``A`` and ``C_mid``
      trade off against each other and neither is measured).
    - ``B`` on a bound of :data:`B_BOUNDS`: the slope is set by the box, not the data.
    """
    p, (lo, hi) = fit.params, fit.bounds
    issues = []
    if p["A"] >= hi - 1e-3 * (hi - lo):
        issues.append(f"plateau A on its bound {hi:g}")
    reached = float(expit(p["B"] * (np.log(c_max) - np.log(p["C_mid"]))))
    if reached < IDENTIFIED_GAIN:
        issues.append(f"only {reached:.0%} of its fitted gain reached within the data (C_mid {p['C_mid']:,.0f}, "
                      f"C_max {c_max:,.0f})")
    if not B_BOUNDS[0] * 1.01 < p["B"] < B_BOUNDS[1] * 0.99:
        issues.append(f"slope B on its bound ({p['B']:.3g})")
    return issues


