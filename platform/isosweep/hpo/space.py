"""The JF-HPO search space and its unit-cube encoding.

A point of the search is a GRPO configuration *plus the fidelity it is run at*: the model
size (a rung of the family's size ladder) and the budget (rollouts). The GP works on the unit
cube ``[h_1 .. h_n, s, b]``:

- ``h_i`` in [0, 1]: each continuous hyperparameter, linearly or log-scaled between its bounds
  (learning rates and KL coefficients span decades, so they are searched in log space);
- ``s``: the data fidelity, 1 at the target model: ``params / params_target`` (``size_scale:
  params``), or on a log scale (``size_scale: log``), ``s = 1 + ln(params / params_target) / L``
  with ``L = 2 ln(params_target / params_smallest)``, so the smallest rung sits at 0.5 and a
  ladder that doubles in width has evenly spaced rungs (with ``params`` a ladder 0.24M/0.96M/3.8M
  has rungs at 0.06, 0.25, 1: the two proxies almost on top of each other, far from the target);
- ``b = budget / budget_max``: the iteration fidelity, 1 at the full (target) budget.

The cost of a trial is proportional to ``params x rollouts``: ``size_ratio(s) x b`` in target units
(``size_ratio(s) = s`` on the params scale). BoTorch's multi-fidelity kernels assume fidelity 1 is
the target and that lower values are "further away" from it; both scales keep that order.

The space is plain data (no YAML, no torch) so the sweep runner can build it from any source
(``SearchSpace.from_dict``) and tests can build it inline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Param:
    """One continuous hyperparameter searched on ``[low, high]`` (log-scaled if ``log``)."""

    name: str
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a parameter needs a non-empty name")
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"parameter {self.name!r}: bounds must be finite (got low={self.low}, high={self.high})")
        if self.low >= self.high:
            raise ValueError(f"parameter {self.name!r}: empty range, low={self.low} must be < high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"parameter {self.name!r}: a log range needs low > 0 (got low={self.low}); "
                             f"use a small positive bound such as 1e-6 instead of 0")

    def to_unit(self, value: float) -> float:
        """Map ``value`` to [0, 1] (clipped: a hand-written config may lie just outside)."""
        if self.log:
            u = (math.log(value) - math.log(self.low)) / (math.log(self.high) - math.log(self.low))
        else:
            u = (value - self.low) / (self.high - self.low)
        return min(1.0, max(0.0, u))

    def from_unit(self, u: float) -> float:
        """Inverse of ``to_unit`` for ``u`` in [0, 1] (clipped)."""
        u = min(1.0, max(0.0, float(u)))
        if self.log:
            return math.exp(math.log(self.low) + u * (math.log(self.high) - math.log(self.low)))
        return self.low + u * (self.high - self.low)


@dataclass(frozen=True)
class SearchSpace:
    """Hyperparameters x size ladder x budget range; the target fidelity is (largest size, ``budget_max``).

    ``sizes`` maps a size name to its parameter count; it is kept sorted by count (the ladder).
    ``target`` names the target size and must be the strictly largest: JF-HPO extrapolates from
    smaller, cheaper members *up* to the target, and ``s = params / params_target <= 1`` relies on it.
    ``min_budget`` is the smallest budget one trial can run at all (e.g. one optimiser step's worth
    of rollouts); ``budget_min`` below it would propose trials that cannot run.
    Budgets proposed by a searcher are multiples of ``budget_step`` within [budget_min, budget_max].
    """

    params: tuple[Param, ...]
    sizes: Mapping[str, int]
    budget_min: int
    budget_max: int
    target: str | None = None
    budget_step: int = 1
    min_budget: int = 1
    size_key: str = "model"
    budget_key: str = "budget"
    size_scale: str = "params"
    _ladder: tuple[tuple[str, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        params = tuple(self.params)
        object.__setattr__(self, "params", params)
        if not params:
            raise ValueError("the search space needs at least one hyperparameter")
        names = [p.name for p in params]
        duplicate = sorted({n for n in names if names.count(n) > 1})
        if duplicate:
            raise ValueError(f"duplicate hyperparameter names: {duplicate}")
        for key in (self.size_key, self.budget_key):
            if key in names:
                raise ValueError(f"hyperparameter name {key!r} clashes with the size/budget config key")
        if self.size_key == self.budget_key:
            raise ValueError(f"size_key and budget_key must differ (both {self.size_key!r})")

        if not self.sizes:
            raise ValueError("the size ladder is empty; give at least the target size and its parameter count")
        for name, count in self.sizes.items():
            if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
                raise ValueError(f"size {name!r}: parameter count must be a positive integer (got {count!r})")
        ladder = tuple(sorted(self.sizes.items(), key=lambda kv: kv[1]))
        object.__setattr__(self, "sizes", dict(ladder))
        object.__setattr__(self, "_ladder", ladder)
        largest = ladder[-1]
        if len(ladder) > 1 and ladder[-2][1] == largest[1]:
            raise ValueError(f"sizes {ladder[-2][0]!r} and {largest[0]!r} tie for largest ({largest[1]} parameters); "
                             f"the target must be the strictly largest size")
        target = largest[0] if self.target is None else self.target
        if target not in self.sizes:
            raise ValueError(f"target size {target!r} is not in the ladder {list(self.sizes)}")
        if target != largest[0]:
            raise ValueError(f"target size {target!r} ({self.sizes[target]} parameters) is not the largest size; "
                             f"{largest[0]!r} has {largest[1]}. JF-HPO tunes on smaller members for a larger target")
        object.__setattr__(self, "target", target)

        if self.size_scale not in ("params", "log"):
            raise ValueError(f"size_scale {self.size_scale!r}: allowed: params, log")
        if self.budget_step <= 0:
            raise ValueError(f"budget_step must be positive (got {self.budget_step})")
        if self.min_budget <= 0:
            raise ValueError(f"min_budget must be positive (got {self.min_budget})")
        if self.budget_min > self.budget_max:
            raise ValueError(f"budget range is empty: budget_min={self.budget_min} > budget_max={self.budget_max}")
        if self.budget_min < self.min_budget:
            raise ValueError(f"budget_min={self.budget_min} is below the smallest budget one trial can run "
                             f"(min_budget={self.min_budget})")
        for name in ("budget_min", "budget_max"):
            if getattr(self, name) % self.budget_step:
                raise ValueError(f"{name}={getattr(self, name)} is not a multiple of budget_step={self.budget_step}")

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SearchSpace":
        """Build from plain data, e.g. a YAML block::

            params: {lr: {low: 1e-6, high: 1e-4, log: true}, clip_high: {low: 0.1, high: 0.4}}
            sizes: {tiny-0.3m: 322880, tiny-1m: 955776, tiny-5m: 4830464}
            budget: [1000, 10000]          # [budget_min, budget_max]
            budget_step: 500               # optional; also target, min_budget, size_key, budget_key
        """
        data = dict(data)
        unknown = set(data) - {"params", "sizes", "budget", "budget_step", "target", "min_budget", "size_key",
                               "budget_key", "size_scale"}
        if unknown:
            raise ValueError(f"unknown search-space keys {sorted(unknown)}")
        params = tuple(Param(name, float(p["low"]), float(p["high"]), bool(p.get("log", False)))
                       for name, p in dict(data["params"]).items())
        budget = data["budget"]
        if len(budget) != 2:
            raise ValueError(f"budget must be [budget_min, budget_max] (got {budget!r})")
        extra = {k: data[k] for k in ("budget_step", "target", "min_budget", "size_key", "budget_key", "size_scale")
                 if k in data}
        return cls(params=params, sizes=dict(data["sizes"]), budget_min=int(budget[0]), budget_max=int(budget[1]),
                   **extra)

    # -- geometry ---------------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def dim(self) -> int:
        """Unit-cube dimension: hyperparameters + size + budget."""
        return len(self.params) + 2

    @property
    def idx_s(self) -> int:
        """Column of the data fidelity ``s``."""
        return len(self.params)

    @property
    def idx_b(self) -> int:
        """Column of the iteration fidelity ``b``."""
        return len(self.params) + 1

    @property
    def target_fidelities(self) -> dict[int, float]:
        """``{idx_s: 1.0, idx_b: 1.0}``, the form BoTorch's ``project_to_target_fidelity`` takes."""
        return {self.idx_s: 1.0, self.idx_b: 1.0}

    @property
    def ladder(self) -> tuple[tuple[str, int], ...]:
        """``(name, params)`` from smallest to largest (the target)."""
        return self._ladder

    @property
    def size_fidelities(self) -> tuple[float, ...]:
        """``s`` of each rung, smallest first; the last is 1.0."""
        return tuple(self.size_fidelity(name) for name, _ in self._ladder)

    @property
    def _log_span(self) -> float:
        smallest = self._ladder[0][1]
        return 2 * math.log(self.sizes[self.target] / smallest) if smallest < self.sizes[self.target] else 1.0

    def size_ratio(self, s):
        """``params / params_target`` at data fidelity ``s`` (a float or a tensor): what a rollout costs there."""
        if self.size_scale == "params":
            return s
        x = (s - 1.0) * self._log_span
        return x.exp() if hasattr(x, "exp") else math.exp(x)

    def params_ratio(self, name: str) -> float:
        """``params / params_target`` of a size (whatever the scale)."""
        if name not in self.sizes:
            raise ValueError(f"unknown size {name!r}; allowed: {list(self.sizes)}")
        return self.sizes[name] / self.sizes[self.target]

    @property
    def b_min(self) -> float:
        """Smallest iteration fidelity ``budget_min / budget_max``."""
        return self.budget_min / self.budget_max

    def size_fidelity(self, name: str) -> float:
        """``s`` of a size on this space's scale."""
        ratio = self.params_ratio(name)
        return ratio if self.size_scale == "params" else 1.0 + math.log(ratio) / self._log_span

    def budget_fidelity(self, budget: float) -> float:
        return float(budget) / self.budget_max

    def snap_budget(self, budget: float) -> int:
        """Nearest multiple of ``budget_step`` within [budget_min, budget_max]."""
        snapped = int(round(float(budget) / self.budget_step)) * self.budget_step
        return int(min(self.budget_max, max(self.budget_min, snapped)))

    def snap_size(self, s: float) -> str:
        """The rung whose ``s`` is nearest to ``s`` (in log space on the params scale: rungs are roughly
        geometric; linearly on the log scale, where they already are)."""
        s = max(float(s), 1e-12)
        if self.size_scale == "log":
            return min(zip((n for n, _ in self._ladder), self.size_fidelities), key=lambda kv: abs(kv[1] - s))[0]
        return min(zip((n for n, _ in self._ladder), self.size_fidelities),
                   key=lambda kv: abs(math.log(kv[1]) - math.log(s)))[0]

    # -- config <-> unit cube ---------------------------------------------------------------
    def to_unit(self, config: Mapping[str, Any]) -> list[float]:
        """``[h..., s, b]`` of a config holding every hyperparameter, ``size_key`` and ``budget_key``."""
        missing = [k for k in (*self.names, self.size_key, self.budget_key) if k not in config]
        if missing:
            raise ValueError(f"config lacks {missing}; it needs {[*self.names, self.size_key, self.budget_key]}")
        hparams = [p.to_unit(float(config[p.name])) for p in self.params]
        return [*hparams, self.size_fidelity(config[self.size_key]), self.budget_fidelity(config[self.budget_key])]

    def from_unit(self, x: Sequence[float]) -> dict[str, Any]:
        """The config of ``x``: the size snapped to the ladder and the budget to a ``budget_step`` multiple."""
        if len(x) != self.dim:
            raise ValueError(f"expected a vector of {self.dim} = {len(self.params)} hyperparameters + s + b, got {len(x)}")
        config: dict[str, Any] = {p.name: p.from_unit(float(u)) for p, u in zip(self.params, x)}
        config[self.size_key] = self.snap_size(x[self.idx_s])
        config[self.budget_key] = self.snap_budget(float(x[self.idx_b]) * self.budget_max)
        return config

    def at_target(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` moved to the target fidelity (target size, ``budget_max``)."""
        return {**config, self.size_key: self.target, self.budget_key: self.budget_max}

    def hparams(self, config: Mapping[str, Any]) -> dict[str, float]:
        return {name: float(config[name]) for name in self.names}
