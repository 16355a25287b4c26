"""A two-fidelity Augmented Hartmann benchmark for JF-HPO, and the JF-HPO vs random comparison.

BoTorch's ``AugmentedHartmann`` is the standard multi-fidelity test function: Hartmann-6 whose
first component's weight is detuned by its one fidelity, ``alpha_1 = 1 - 0.1 (1 - x_7)``.
JF-HPO has *two* fidelities (model size ``s`` and budget ``b``), so the benchmark extends the
same construction by one component:

    alpha_1 = 1.0 - 0.1 (1 - s)        (exactly BoTorch's AugmentedHartmann with x_7 = s)
    alpha_2 = 1.2 - 0.1 (1 - b)        (the budget detunes the second component the same way)

and maximises ``f(x, s, b) = -H(x; alpha(s, b))``. At ``s = b = 1`` this is plain Hartmann-6
(maximum 3.32237 at BoTorch's optimiser), so regret at the target is well defined. Each
fidelity biases a different part of the landscape, i.e. low-fidelity observations are
informative but not a shifted copy of the target, which is the situation the multi-fidelity
kernel is meant for. The cost model is ``c0 + s * b`` (parameters x rollouts plus a fixed
per-trial overhead ``c0``), so a target trial costs ``c0 + 1``.

The study loop calls a searcher's ``suggest`` / ``on_trial_complete`` directly (no Ray), charges
each trial its cost through the ``time_total_s`` result field (so the searcher's cost model is
fitted from "measured" times as in a real study), and after each trial records the cumulative
cost and the regret at the target of the searcher's ``recommend()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from botorch.test_functions.multi_fidelity import AugmentedHartmann

from isosweep.hpo.searcher import BaseSearcher, JFHPOSearcher, RandomSearcher
from isosweep.hpo.space import Param, SearchSpace

HARTMANN_MAX = 3.32237
"""Maximum of (negated) Hartmann-6, BoTorch's ``AugmentedHartmann._optimal_value`` negated."""

LADDER = {"small": 322880, "medium": 955776, "target": 4830464}
"""The tiny model family's parameter counts: s = 0.067, 0.198, 1."""

METRIC = "objective"


class TwoFidelityHartmann:
    """``f(x, s, b)`` to maximise on ``[0, 1]^6 x (0, 1] x (0, 1]``; ``cost(s, b) = c0 + s * b``."""

    def __init__(self, fixed_cost: float = 0.1, noise_std: float = 0.0, seed: int = 0) -> None:
        self.fixed_cost = fixed_cost
        self.noise_std = noise_std
        self._fn = AugmentedHartmann()
        self._gen = torch.Generator().manual_seed(seed)

    def true_value(self, X: torch.Tensor) -> torch.Tensor:
        """Noise-free ``f`` of ``... x 8`` inputs ``[x_1..x_6, s, b]``."""
        X = X.to(torch.double)
        fn = self._fn.to(dtype=X.dtype)
        # evaluate_true gives H (BoTorch negates only in forward); alpha_1 is already detuned by x_7 = s.
        value = -fn.evaluate_true(X[..., :7])
        # alpha_2 = 1.2 - 0.1 (1 - b) adds 0.1 (1 - b) exp(-inner_2) to H, i.e. subtracts it from -H.
        inner = torch.sum(fn.A[1] * (X[..., :6] - 0.0001 * fn.P[1]).pow(2), dim=-1)
        return value - 0.1 * (1 - X[..., 7]) * torch.exp(-inner)

    def __call__(self, x: Sequence[float]) -> float:
        value = float(self.true_value(torch.tensor(list(x), dtype=torch.double)))
        if self.noise_std:
            value += self.noise_std * float(torch.randn((), generator=self._gen, dtype=torch.double))
        return value

    def cost(self, s: float, b: float) -> float:
        return self.fixed_cost + s * b

    def regret(self, hparams_unit: Sequence[float]) -> float:
        """Regret at the target fidelity of a design ``x_1..x_6``."""
        return HARTMANN_MAX - float(self.true_value(torch.tensor([*hparams_unit, 1.0, 1.0], dtype=torch.double)))


def bench_space(budget_min: int = 10, budget_max: int = 100) -> SearchSpace:
    """Six unit hyperparameters, the tiny-family ladder as data fidelity, budget 10..100 as iteration fidelity."""
    return SearchSpace(params=tuple(Param(f"x{i + 1}", 0.0, 1.0) for i in range(6)), sizes=dict(LADDER),
                       budget_min=budget_min, budget_max=budget_max)


@dataclass(frozen=True)
class TracePoint:
    trial: int
    cost: float
    regret: float
    s: float
    b: float


def run_study(searcher: BaseSearcher, fn: TwoFidelityHartmann, *, max_trials: int = 10_000,
              stop_regret: float | None = None) -> list[TracePoint]:
    """Run ``searcher`` sequentially on ``fn`` until it returns FINISHED (its study budget),
    ``max_trials``, or (if given) the recommendation's regret is ``<= stop_regret``; after each
    trial record cumulative cost and the target regret of ``recommend()``."""
    space = searcher.space
    trace: list[TracePoint] = []
    for i in range(max_trials):
        trial_id = f"t{i:04d}"
        config = searcher.suggest(trial_id)
        if config == searcher.FINISHED or config is None:
            break
        x = space.to_unit(config)
        s, b = x[space.idx_s], x[space.idx_b]
        searcher.on_trial_complete(trial_id, {METRIC: fn(x), "time_total_s": fn.cost(s, b),
                                              "rollouts": config[space.budget_key]})
        rec = space.to_unit(searcher.recommend())
        trace.append(TracePoint(i, searcher.spent, fn.regret(rec[:len(space.params)]), s, b))
        if stop_regret is not None and trace[-1].regret <= stop_regret:
            break
    return trace


def cost_to_reach(trace: Sequence[TracePoint], threshold: float) -> float:
    """Cumulative cost at which the recommendation's regret first drops to ``threshold`` (``inf`` if never)."""
    return next((p.cost for p in trace if p.regret <= threshold), math.inf)


def make_searchers(seed: int, cost_budget: float, *, fixed_cost: float = 0.1, jf_max_trials: int = 50,
                   num_restarts: int = 2, raw_samples: int = 64, n_init: int = 8, fit_maxiter: int = 100,
                   acq_maxiter: int = 50) -> dict[str, BaseSearcher]:
    """The two searchers of a comparison, on ``bench_space()``, sharing the study budget ``cost_budget``.

    JF-HPO's optimiser settings are deliberately small (2 restarts from 64 raw samples per size
    rung, capped L-BFGS) so that the CI comparison stays within a minute on two cores."""
    space = bench_space()
    return {
        "jfhpo": JFHPOSearcher(space, METRIC, "max", study_budget=cost_budget, seed=seed, n_init=n_init,
                               num_restarts=num_restarts, raw_samples=raw_samples, max_trials=jf_max_trials,
                               cost_prior=(fixed_cost, 1.0), fit_maxiter=fit_maxiter, acq_maxiter=acq_maxiter),
        "random": RandomSearcher(space, METRIC, "max", study_budget=cost_budget, seed=seed),
    }


@dataclass(frozen=True)
class Reach:
    """One method's study on one seed: the cost at which it reached the threshold (``inf``: never), the regret of
    its last recommendation (``inf``: it ran no trial), its trials and what it spent."""

    cost: float
    final_regret: float
    trials: int
    spent: float


@dataclass(frozen=True)
class SeedComparison:
    """JF-HPO against random search on one seed: each method's :class:`Reach` (key: method) and ``ratio``, JF-HPO's
    cost over random search's (random's ``inf`` replaced by the study budget). In JSON (``per_seed`` of
    ``bench/hpo.json``'s ``synthetic``) flat: ``<method>``, ``<method>_final_regret``, ``<method>_trials``,
    ``<method>_spent``, then ``ratio``; ``inf`` written as null."""

    methods: dict[str, Reach]
    ratio: float

    def figures(self) -> list[tuple[str, float]]:
        """The flat ``(name, value)`` pairs of the JSON, ``inf`` kept."""
        out: list[tuple[str, float]] = []
        for name, reach in self.methods.items():
            out += [(name, reach.cost), (f"{name}_final_regret", reach.final_regret), (f"{name}_trials", reach.trials),
                    (f"{name}_spent", reach.spent)]
        return out + [("ratio", self.ratio)]

    def to_json(self) -> dict[str, Any]:
        return {name: value if math.isfinite(value) else None for name, value in self.figures()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SeedComparison:
        inf = lambda v: math.inf if v is None else v  # noqa: E731
        return cls({name: Reach(inf(data[name]), inf(data[f"{name}_final_regret"]), int(data[f"{name}_trials"]),
                                inf(data[f"{name}_spent"]))
                    for name in data if f"{name}_trials" in data}, inf(data["ratio"]))


def compare_on_hartmann(seeds: Sequence[int], cost_budget: float, threshold: float = 0.8, *, fixed_cost: float = 0.1,
            noise_std: float = 0.0, jf_max_trials: int = 40, num_restarts: int = 2, raw_samples: int = 64,
            n_init: int = 8, log: Callable[[str], None] | None = None) -> dict[int, SeedComparison]:
    """Per seed: cost for JF-HPO and for random search to reach regret <= ``threshold``.

    Both methods get the same study budget ``cost_budget`` (in target-trial units: a target trial
    costs ``1 + fixed_cost``) and stop as soon as they reach the threshold. A method that never
    gets there scores ``inf``; ``ratio`` is JF-HPO's cost over random search's, with random's
    ``inf`` replaced by ``cost_budget`` (the ratio is then an upper bound on the true one).
    JF-HPO is also capped at ``jf_max_trials`` trials to bound the GP's size (cheap trials would
    otherwise let it run hundreds).

    Random search is weak on Hartmann-6 (its peaks are narrow), so at a low ``threshold`` random's
    cost is mostly the censoring ``cost_budget`` and the ratio measures JF-HPO against that budget.
    """
    out: dict[int, SeedComparison] = {}
    for seed in seeds:
        reached: dict[str, Reach] = {}
        for name, searcher in make_searchers(seed, cost_budget, fixed_cost=fixed_cost, jf_max_trials=jf_max_trials,
                                             num_restarts=num_restarts, raw_samples=raw_samples,
                                             n_init=n_init).items():
            trace = run_study(searcher, TwoFidelityHartmann(fixed_cost=fixed_cost, noise_std=noise_std, seed=seed),
                              stop_regret=threshold)
            reached[name] = Reach(cost_to_reach(trace, threshold), trace[-1].regret if trace else math.inf,
                                  len(trace), trace[-1].cost if trace else 0.0)
        random = reached["random"].cost
        row = SeedComparison(reached, reached["jfhpo"].cost / (random if math.isfinite(random) else cost_budget))
        out[seed] = row
        if log is not None:
            log(f"seed {seed}: " + ", ".join(f"{k}={v:.3g}" for k, v in row.figures()))
    return out
