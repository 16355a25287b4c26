"""The compute-optimal frontier of an iso-compute sweep: records -> sigmoid fits -> n*(C).

Pure functions of numpy arrays, lists and dicts (no Ray, MLflow or config classes); the sweep
driver reads each trial's eval curve, calls these, and logs what they return. Compute ``C`` is
always in **rollouts** (sampled completions), as logged at each eval step; ``value`` is the
eval metric in its own units (a rate such as mean@k in ``[0, 1]``, usually).

Pipeline (platform/docs/concepts.md, "Reading the frontier table"):

1. :func:`record_points` keeps the points of one trial's curve that beat every earlier one.
2. :func:`fit_sigmoid` fits ``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)`` to them with a
   robust loss and bootstrap confidence intervals.
3. :func:`frontier` takes the best fitted config at each ``C`` of a grid;
   :func:`optimal_allocation` reads ``n*(C)`` (or ``Bp*(C)``) off it and
   :func:`saturation_point` says from which ``C`` it stops changing.
4. :func:`holdout_check` validates the fit by fitting on ``C <= C_max / 4`` and predicting
   the value at ``C_max``.

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


def record_points(compute: ArrayLike, value: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """The record-breaking points of one eval curve.

    Points are ordered by compute (a stable sort, so points of equal compute keep the order
    given); a point is a record iff its value is strictly higher than the value of every
    earlier point. The first point is always a record, and so is the first point reaching the
    maximum value.

    Args:
        compute: ``(points,)``, compute in rollouts at each eval.
        value: ``(points,)``, the metric at each eval.

    Returns:
        ``(compute, value)`` of the records, float64 ``(records,)`` each, ordered by compute;
        the values are strictly increasing. Empty input gives empty arrays.
    """
    c, v = _curve(compute, value)
    order = np.argsort(c, kind="stable")
    c, v = c[order], v[order]
    best_before = np.concatenate([[-np.inf], np.maximum.accumulate(v)[:-1]])
    keep = v > best_before
    return c[keep], v[keep]


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
    """A sigmoid fitted to one config's records, with its bootstrap refits."""

    params: dict[str, float]
    """``R0``, ``A`` (metric units), ``C_mid`` (rollouts) and ``B`` of the fit to all points."""
    n: int
    """Number of points fitted."""
    success: bool
    """Whether ``least_squares`` reported convergence on the full data."""
    boot: np.ndarray = field(default_factory=lambda: np.empty((0, 4)), compare=False, repr=False)
    """``(fits, 4)``: parameters of the successful bootstrap refits, columns :data:`PARAM_NAMES`."""
    bounds: tuple[float, float] = (0.0, 1.0)
    """``(lo, hi)``, the value bounds ``R0`` and ``A`` were fitted within."""

    @property
    def ci(self) -> dict[str, tuple[float, float]]:
        """90% percentile bootstrap interval ``(low, high)`` per parameter; ``(nan, nan)``
        when there are no bootstrap refits."""
        if len(self.boot) == 0:
            return {name: (np.nan, np.nan) for name in PARAM_NAMES}
        low, high = np.quantile(self.boot, [0.05, 0.95], axis=0)
        return {name: (float(low[i]), float(high[i])) for i, name in enumerate(PARAM_NAMES)}

    def predict(self, C: ArrayLike) -> float | np.ndarray:
        """The fitted curve at compute ``C`` (rollouts, any shape); see :func:`sigmoid`."""
        return sigmoid(C, **self.params)

    def predict_ci(self, C: ArrayLike, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise ``level`` percentile interval of the bootstrap curves at ``C``.

        Args:
            C: compute in rollouts, any shape.
            level: coverage in ``(0, 1)``.

        Returns:
            ``(low, high)``, float64 arrays of ``C``'s shape; all nan when there are no
            bootstrap refits.
        """
        if not 0.0 < level < 1.0:
            raise ValueError(f"level must lie in (0, 1), got {level}")
        c = np.asarray(C, dtype=np.float64)
        if np.any(c <= 0):
            raise ValueError("compute C must be > 0")
        if len(self.boot) == 0:
            return np.full(c.shape, np.nan), np.full(c.shape, np.nan)
        curves = np.stack([sigmoid(c, *row) for row in self.boot])
        tail = (1.0 - level) / 2.0
        low, high = np.quantile(curves, [tail, 1.0 - tail], axis=0)
        return low, high


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
    bootstrap: int = 200,
    seed: int = 0,
    f_scale: float | None = None,
    value_bounds: tuple[float, float] | None = None,
    R0: float | None = None,
    start: dict[str, float] | None = None,
) -> SigmoidFit:
    """Fit :func:`sigmoid` to one config's points, with bootstrap refits.

    Uses ``scipy.optimize.least_squares`` with a robust ``loss`` under the bounds
    ``lo <= R0 <= A <= hi`` (see the module docstring for ``[lo, hi]``), ``B`` in
    :data:`B_BOUNDS` and ``C_mid`` within a factor :data:`C_MID_RANGE` of the observed compute,
    fitted as ``log C_mid``. Initial guesses come from the data: ``R0`` and ``A`` the smallest
    and largest value, ``C_mid`` where the running best first reaches their midpoint (and the
    geometric mean of the compute), ``B`` 1 and 3; the best of these four starts is kept.

    Bootstrap: ``bootstrap`` resamples of the points with replacement (a
    ``numpy.random.default_rng(seed)``), each refitted from the full-data fit; resamples with
    fewer than :data:`MIN_POINTS` distinct compute values and refits that do not converge are
    skipped. Resampling points treats them as independent, which the points of one learning
    curve are not: the sweep analysis (:mod:`isosweep.report.analysis`) calls this with
    ``bootstrap=0`` and resamples seeds and eval problems itself.

    Args:
        compute: ``(points,)``, compute in rollouts, ``> 0``.
        value: ``(points,)``, the metric at each point.
        loss: a ``least_squares`` loss; ``"linear"`` is plain least squares.
        bootstrap: number of bootstrap resamples, ``>= 0``.
        seed: seed of the bootstrap resampling.
        f_scale: residual scale (metric units) beyond which the robust loss grows slower than
            squares. ``None``: 1.4826 x the median absolute residual of a first robust fit
            (a MAD estimate of the noise), so outliers are judged against the curve's own noise.
        value_bounds: ``(lo, hi)`` for ``R0`` and ``A``, overriding the default.
        R0: the value at ``C -> 0`` when it is known (the base model's measured value): held
            fixed, so only ``A``, ``C_mid`` and ``B`` are fitted. Clipped into ``[lo, hi]``.
        start: parameters to start from (e.g. the full-data fit when refitting a resample):
            one ``least_squares`` run from there instead of the four data-derived starts.

    Returns:
        a :class:`SigmoidFit`.
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
    if bootstrap < 0:
        raise ValueError(f"bootstrap must be >= 0, got {bootstrap}")
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

    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(bootstrap):
        idx = rng.integers(0, len(c), len(c))
        if len(np.unique(c[idx])) < MIN_POINTS:
            continue
        run = _fit_once(log_c[idx], v[idx], best.x, box, (lo, hi), loss, scale, fixed_u0)
        if run.success:
            boot.append(_to_params(run.x, lo, hi))

    params = dict(zip(PARAM_NAMES, map(float, _to_params(best.x, lo, hi))))
    return SigmoidFit(
        params=params,
        n=len(c),
        success=bool(best.success),
        boot=np.array(boot, dtype=np.float64).reshape(-1, 4),
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


FRONTIER_FIELDS = ("C", "config", "value", "low", "high")
"""Keys every :func:`frontier` row has besides the winning config's fields."""


def frontier(
    fits: dict[str, SigmoidFit], configs: dict[str, dict], grid: ArrayLike
) -> list[dict]:
    """The compute-optimal frontier: the best fitted config at each compute of ``grid``.

    Args:
        fits: config key -> its :class:`SigmoidFit`.
        configs: config key -> its fields (e.g. ``{"n": 8, "Bp": 16}``); must cover ``fits``.
        grid: ``(grid,)``, compute in rollouts, ``> 0``.

    Returns:
        one dict per grid point, in grid order: ``C``, ``config`` (the key whose fitted value
        is highest at ``C``; on an exact tie the first key in ``fits`` order), ``value`` (its
        fitted value), ``low`` and ``high`` (its 90% bootstrap interval at ``C``, nan without
        refits), and that config's fields.
    """
    if not fits:
        raise ValueError("frontier needs at least one fit")
    missing = [key for key in fits if key not in configs]
    if missing:
        raise ValueError(f"configs has no entry for fitted keys {missing}")
    clashing = sorted({name for key in fits for name in configs[key] if name in FRONTIER_FIELDS})
    if clashing:
        raise ValueError(f"config fields {clashing} clash with frontier columns {FRONTIER_FIELDS}")
    c = np.asarray(grid, dtype=np.float64)
    if c.ndim != 1:
        raise ValueError(f"grid must be 1-D, got shape {c.shape}")

    keys = list(fits)
    values = np.stack([fits[key].predict(c) for key in keys])  # (configs, grid)
    bands = [fits[key].predict_ci(c) for key in keys]
    winners = np.argmax(values, axis=0)  # first maximum on ties
    rows = []
    for j, w in enumerate(winners):
        rows.append({
            "C": float(c[j]),
            "config": keys[w],
            "value": float(values[w, j]),
            "low": float(bands[w][0][j]),
            "high": float(bands[w][1][j]),
            **configs[keys[w]],
        })
    return rows


def optimal_allocation(frontier_rows: list[dict], key: str = "n") -> np.ndarray:
    """``n*(C)`` (or ``Bp*(C)`` with ``key="Bp"``): the winning config's field per grid point.

    Returns:
        ``(grid,)`` array of ``row[key]`` over :func:`frontier`'s rows.
    """
    absent = [row["C"] for row in frontier_rows if key not in row]
    if absent:
        raise ValueError(f"frontier rows at C={absent} have no field {key!r}")
    return np.asarray([row[key] for row in frontier_rows])


def saturation_point(grid: ArrayLike, n_star: ArrayLike, tol: float = 0.0) -> float | None:
    """The smallest compute from which ``n*(C)`` stays constant to the end of the grid.

    Rule: let ``i`` be the last grid index with ``|n*[i] - n*[i-1]| > tol``. The saturation
    point is ``grid[i]`` (the first ``C`` at which the final ``n*`` is reached and kept), or
    ``grid[0]`` if ``n*`` never changes. If ``i`` is the last grid index, ``n*`` is still
    changing where the grid ends, and the answer is ``None``. A saturation point therefore
    only means "constant over the rest of the grid": extend the grid to test beyond it.

    Args:
        grid: ``(grid,)``, strictly increasing compute in rollouts.
        n_star: ``(grid,)``, e.g. from :func:`optimal_allocation`.
        tol: changes of ``n*`` up to ``tol`` (absolute) count as no change.
    """
    c = np.asarray(grid, dtype=np.float64)
    n = np.asarray(n_star, dtype=np.float64)
    if c.ndim != 1 or n.shape != c.shape or len(c) == 0:
        raise ValueError(f"grid and n_star must be non-empty 1-D of one length, got {c.shape}, {n.shape}")
    if np.any(np.diff(c) <= 0):
        raise ValueError("grid must be strictly increasing")
    if tol < 0:
        raise ValueError(f"tol must be >= 0, got {tol}")
    changes = np.flatnonzero(np.abs(np.diff(n)) > tol) + 1
    if len(changes) == 0:
        return float(c[0])
    last = int(changes[-1])
    return None if last == len(c) - 1 else float(c[last])


def holdout_check(
    compute: ArrayLike,
    value: ArrayLike,
    fraction: float = 0.25,
    loss: Loss = "soft_l1",
    f_scale: float | None = None,
) -> dict:
    """Validate the sigmoid form: fit on ``C <= fraction * C_max``, predict the value at ``C_max``.

    Pass the points :func:`fit_sigmoid` would get (a trial's records). The fit has no
    bootstrap: only the point prediction is compared.

    Args:
        compute: ``(points,)``, compute in rollouts, ``> 0``.
        value: ``(points,)``, the metric.
        fraction: the fitting window as a fraction of ``C_max``, in ``(0, 1]``.

    Returns:
        ``predicted`` (fitted value at ``C_max``), ``observed`` (the best value observed up to
        ``C_max``: the running max there), ``abs_error`` (``|predicted - observed|``),
        ``n_fit_points`` (points in the window) and ``reason`` (``None``, or why ``predicted``
        and ``abs_error`` are ``None``: fewer than :data:`MIN_POINTS` distinct compute values
        in the window).
    """
    c, v = _curve(compute, value)
    if len(c) == 0:
        raise ValueError("holdout_check needs at least one point")
    if np.any(c <= 0):
        raise ValueError("compute must be > 0 (rollouts)")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    c_max = float(c.max())
    window = c <= fraction * c_max
    result = {"predicted": None, "observed": float(v.max()), "abs_error": None,
              "n_fit_points": int(window.sum()), "reason": None}
    distinct = len(np.unique(c[window]))
    if distinct < MIN_POINTS:
        result["reason"] = (
            f"only {distinct} distinct compute values at C <= {fraction} * C_max = "
            f"{fraction * c_max:g} rollouts; a sigmoid fit needs {MIN_POINTS}"
        )
        return result
    fit = fit_sigmoid(c[window], v[window], loss=loss, bootstrap=0, f_scale=f_scale)
    result["predicted"] = fit.predict(c_max)
    result["abs_error"] = abs(result["predicted"] - result["observed"])
    return result
