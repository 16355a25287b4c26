"""Ray Tune searchers for JF-HPO and its baselines, sharing one study-budget harness.

``JFHPOSearcher`` models the objective over (hyperparameters, model size, budget) with BoTorch's
``SingleTaskMultiFidelityGP`` (size = data fidelity, budget = iteration fidelity, both 1 at the
target) and proposes the point maximising

    EI(x at its own fidelity; incumbent = best posterior mean at the target fidelity) / cost(x)

with ``cost(x) = c0 + c1 * r(s) * b`` (compute is proportional to parameters x rollouts, ``r(s)`` the
parameters relative to the target at data fidelity ``s``, ``s`` itself on the params scale; ``c0`` is
the fixed per-trial overhead: start-up, model load, evaluation). The constants are fitted by
least squares from the measured wall seconds of finished trials. Dividing by cost is what makes
a cheap low-fidelity trial worth proposing: it buys less expected improvement, but per second.
The incumbent is taken *at the target* because only the target's performance is what we want to
improve; a low-fidelity observation helps only through what the GP learns from it about the target.

Numerics: the acquisition is computed as ``log EI - log cost`` (BoTorch's ``LogExpectedImprovement``,
or ``qLogExpectedImprovement`` with the pending trials as ``X_pending`` when Tune runs trials
concurrently). The log is monotone, so the argmax is exactly that of EI / cost, but LogEI keeps
useful gradients where EI underflows to 0, which plain EI does over most of the cube.

The size dimension is discrete (the model family's ladder): the acquisition is optimised for each
rung separately with ``optimize_acqf_mixed`` and the best rung wins. The budget is continuous in
the optimiser and snapped to a ``budget_step`` multiple afterwards.

``RandomSearcher`` (uniform hyperparameters, target fidelity) uses the same accounting, so a
baseline study gets exactly the same study budget. ``asha_scheduler`` builds the ASHA baseline.

Determinism: every random choice derives from the searcher's seed and its NumPy generator, whose
state is saved with the observations, so a restored searcher makes the same next suggestion.
"""

from __future__ import annotations

import abc
import json
import logging
import math
import os
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch
from botorch.acquisition import AcquisitionFunction, LogExpectedImprovement, PosteriorMean, qLogExpectedImprovement
from botorch.acquisition.fixed_feature import FixedFeatureAcquisitionFunction
from botorch.acquisition.utils import project_to_target_fidelity
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskMultiFidelityGP
from botorch.models.utils.gpytorch_modules import MIN_INFERRED_NOISE_LEVEL
from botorch.optim import optimize_acqf, optimize_acqf_discrete, optimize_acqf_mixed
from botorch.sampling import SobolQMCNormalSampler
from gpytorch.constraints import GreaterThan
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.mlls import ExactMarginalLogLikelihood
from gpytorch.priors import LogNormalPrior
from ray.tune.search import Searcher
from scipy.optimize import nnls
from scipy.stats import spearmanr
from torch.quasirandom import SobolEngine

from isosweep.hpo.space import Param, SearchSpace

CostFn = Callable[[Mapping[str, Any], Mapping[str, Any]], float]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Observation:
    """One measured point: ``x`` (unit cube, fidelities included, at the fidelity actually reached),
    ``y`` (objective to *maximise*: the metric, negated for ``mode="min"``), the measured wall
    seconds (``None`` if the result had none) and the cost charged to the study budget."""

    trial_id: str
    x: tuple[float, ...]
    y: float
    seconds: float | None
    cost: float
    final: bool = True


def fit_cost_model(sb: np.ndarray | list[float], seconds: np.ndarray | list[float],
                   prior: tuple[float, float] = (0.1, 1.0), min_fixed: float = 0.01) -> tuple[float, float]:
    """Least-squares ``(c0, c1)`` of ``seconds ~ c0 + c1 * sb`` with both constants non-negative.

    Falls back to ``prior`` with fewer than two measurements, when all measurements sit at the same
    ``s * b`` (the slope is then unidentifiable), or when the fit has no positive slope. ``c0`` is
    floored at ``min_fixed * c1``: a zero fixed cost would make the smallest trial look free and
    the acquisition would divide by ~0.
    """

    sb = np.asarray(sb, dtype=float)
    seconds = np.asarray(seconds, dtype=float)
    keep = np.isfinite(sb) & np.isfinite(seconds)
    sb, seconds = sb[keep], seconds[keep]
    if len(sb) < 2 or np.ptp(sb) <= 1e-12 * max(1.0, float(np.max(np.abs(sb)))):
        c0, c1 = prior
    else:
        (c0, c1), _ = nnls(np.stack([np.ones_like(sb), sb], axis=1), seconds)
        if c1 <= 0:
            c0, c1 = prior
    return max(float(c0), min_fixed * float(c1)), float(c1)


def proxies_agree(rho: float, threshold: float) -> bool:
    """The proxy check's verdict on the Spearman correlation ``rho`` between the target values of the checked
    configurations and the GP's predictions for them from the proxies: trusted iff ``rho >= threshold``
    (an undefined ``rho`` -- fewer than 3 values, or all tied -- is not trust)."""
    return bool(math.isfinite(rho) and rho >= threshold)


class CostAwareLogEI(AcquisitionFunction):
    """``log EI(x) - log(c0 + c1 * s * b)``: the log of expected improvement per unit cost.

    EI is measured at x's own fidelity against ``best_f``, the best posterior mean at the target
    fidelity. With ``X_pending`` it is the MC batch EI of ``[x, pending...]`` jointly
    (``qLogExpectedImprovement``), which credits x only with improvement the pending trials are
    not already expected to deliver. Takes ``batch x 1 x d`` inputs (one candidate per t-batch).
    """

    def __init__(self, model, best_f: float, *, c0: float, c1: float, idx_s: int, idx_b: int,
                 X_pending: torch.Tensor | None = None, mc_samples: int = 128, seed: int = 0,
                 size_ratio: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__(model)
        self.c0, self.c1, self.idx_s, self.idx_b = float(c0), float(c1), idx_s, idx_b
        self.size_ratio = size_ratio or (lambda s: s)
        if X_pending is None:
            self.ei = LogExpectedImprovement(model, best_f=best_f)
        else:
            sampler = SobolQMCNormalSampler(sample_shape=torch.Size([mc_samples]), seed=seed)
            self.ei = qLogExpectedImprovement(model, best_f=best_f, sampler=sampler, X_pending=X_pending)

    def cost(self, X: torch.Tensor) -> torch.Tensor:
        return self.c0 + self.c1 * self.size_ratio(X[..., 0, self.idx_s]) * X[..., 0, self.idx_b]

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return self.ei(X) - self.cost(X).log()


def _is_hyperparameter(name: str) -> bool:
    """State-dict entries that are GP hyperparameters (not data-derived buffers such as the
    outcome transform's means, which are recomputed from the training data, or a constraint's
    bounds: the noise floor moves with the data's variance)."""
    return "outcome_transform" not in name and "input_transform" not in name and "_constraint" not in name


class BaseSearcher(Searcher, abc.ABC):
    """Bookkeeping shared by JF-HPO and the random baseline: live trials, observations, the study
    budget and save/restore. Subclasses implement ``_propose() -> unit vector``."""

    def __init__(self, space: SearchSpace, metric: str | None = None, mode: str | None = "max", *,
                 study_budget: float | None = None, cost_fn: CostFn | None = None,
                 time_attr: str = "time_total_s", progress_key: str | None = "rollouts",
                 max_trials: int | None = None, seed: int = 0) -> None:
        super().__init__(metric=metric, mode=mode)
        self.space = space
        self.study_budget = study_budget
        self.cost_fn = cost_fn
        self.time_attr = time_attr
        self.progress_key = progress_key
        self.max_trials = max_trials
        self.seed = int(seed)
        self._rng = np.random.default_rng(self.seed)
        self.observations: list[Observation] = []
        self._live: dict[str, dict[str, Any]] = {}
        self.spent = 0.0
        self.n_suggested = 0
        self.cost_prior: tuple[float, float] = (0.1, 1.0)

    # -- Tune interface ---------------------------------------------------------------------
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        """The space comes from the constructor; Tune may still supply metric and mode."""
        if metric and self._metric and metric != self._metric:
            return False
        if mode and self._mode and mode != self._mode:
            return False
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        return True

    @property
    def budget_spent(self) -> bool:
        return self.study_budget is not None and self.spent >= self.study_budget

    def suggest(self, trial_id: str) -> dict | str | None:
        if self.budget_spent or (self.max_trials is not None and self.n_suggested >= self.max_trials):
            return Searcher.FINISHED
        x = self._propose()
        config = self.space.from_unit(x)
        self._live[trial_id] = {"config": config, "x": tuple(self.space.to_unit(config)), "last": None,
                                "marks": 0}
        self.n_suggested += 1
        return dict(config)

    def replace_live(self, trial_id: str, config: Mapping[str, Any]) -> None:
        """Record that ``trial_id`` runs ``config`` instead of what was suggested (the integrator moved it:
        a budget cut to what is left of the study, hyperparameters snapped to a trial it continues)."""
        live = self._live[trial_id]
        live["config"] = dict(config)
        live["x"] = tuple(self.space.to_unit(config))
        self._invalidate()

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        live = self._live.get(trial_id)
        if live is not None:
            live["last"] = dict(result)
            self._on_intermediate(trial_id, live, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """Charge the trial's cost and record its final value (an errored trial is charged but,
        unless it reported a metric on the way, not observed)."""
        live = self._live.pop(trial_id, None)
        if live is None:
            return
        result = dict(result) if result else (live["last"] or {})
        seconds = result.get(self.time_attr)
        seconds = float(seconds) if seconds is not None and math.isfinite(float(seconds)) else None
        cost = self._charge(live["config"], result, seconds)
        self.spent += cost
        y = self._objective(result)
        if y is not None:
            self.observations.append(Observation(trial_id, self._reached(live, result), y, seconds, cost))

    # -- helpers ----------------------------------------------------------------------------
    def _objective(self, result: Mapping[str, Any]) -> float | None:
        if not self._metric or result.get(self._metric) is None:
            return None
        value = float(result[self._metric])
        if not math.isfinite(value):
            return None
        return -value if self._mode == "min" else value

    def _reached(self, live: Mapping[str, Any], result: Mapping[str, Any]) -> tuple[float, ...]:
        """``x`` at the fidelity the trial actually reached: an early-stopped trial is an
        observation at its reached budget, not at the budget it was given."""
        x = list(live["x"])
        if self.progress_key and result.get(self.progress_key) is not None:
            done = float(result[self.progress_key])
            if done > 0:
                x[self.space.idx_b] = min(x[self.space.idx_b], self.space.budget_fidelity(done))
        return tuple(x)

    def _charge(self, config: Mapping[str, Any], result: Mapping[str, Any], seconds: float | None) -> float:
        if self.cost_fn is not None:
            return float(self.cost_fn(config, result))
        if seconds is not None:
            return seconds
        x = self.space.to_unit(config)
        c0, c1 = self.cost_constants()
        return c0 + c1 * self.space.size_ratio(x[self.space.idx_s]) * x[self.space.idx_b]

    def cost_constants(self) -> tuple[float, float]:
        """``(c0, c1)`` of the cost model ``c0 + c1 * r(s) * b``, fitted from the measured seconds."""
        measured = [(self.space.size_ratio(o.x[self.space.idx_s]) * o.x[self.space.idx_b], o.seconds) for o in self.observations
                    if o.final and o.seconds is not None]
        return fit_cost_model([m[0] for m in measured], [m[1] for m in measured], prior=self.cost_prior)

    def _on_intermediate(self, trial_id: str, live: dict[str, Any], result: Mapping[str, Any]) -> None:
        return None

    @abc.abstractmethod
    def _propose(self) -> list[float]:
        """The next point to try, as a unit-cube vector ``[hyperparameters..., s, b]``."""

    def _uniform_hparams(self) -> list[float]:
        return list(self._rng.random(len(self.space.params)))

    def best_observed(self, at_target: bool = True) -> Observation | None:
        """The best observation (at the target fidelity if any is there and ``at_target``)."""
        pool = self.observations
        if at_target:
            target = [o for o in pool if o.x[self.space.idx_s] >= 1 - 1e-9 and o.x[self.space.idx_b] >= 1 - 1e-9]
            pool = target or pool
        return max(pool, key=lambda o: o.y, default=None)

    def recommend(self) -> dict[str, Any] | None:
        """Config (at the target fidelity) believed best; the baseline's belief is its best target observation."""
        best = self.best_observed()
        return None if best is None else self.space.at_target(self.space.from_unit(best.x))

    # -- persistence ------------------------------------------------------------------------
    _STATE = ("observations", "_live", "spent", "n_suggested", "seed", "study_budget", "max_trials", "_metric",
              "_mode")

    def get_state(self) -> dict:
        """The searcher's state as JSON-able data: observations, live trials, spend, RNG state, the space."""
        state = {name: _to_json(getattr(self, name)) for name in self._STATE}
        state["observations"] = [asdict(o) for o in self.observations]
        state["_live"] = {trial_id: {**live, "x": list(live["x"]), "last": _scalars(live["last"])}
                          for trial_id, live in self._live.items()}
        state["rng"] = self._rng.bit_generator.state
        state["space"] = space_state(self.space)
        return state

    def set_state(self, state: dict) -> None:
        state = dict(state)
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = state.pop("rng")
        self.space = space_from_state(state.pop("space"))
        self.observations = [Observation(**{**o, "x": tuple(o["x"])}) for o in state.pop("observations")]
        self._live = {trial_id: {**live, "x": tuple(live["x"])} for trial_id, live in state.pop("_live").items()}
        for name, value in state.items():
            setattr(self, name, _from_json(value))
        self.cost_prior = tuple(self.cost_prior)
        self._invalidate()

    def _invalidate(self) -> None:
        return None

    def save(self, checkpoint_path: str) -> None:
        """Write observations, live trials, spent budget and RNG state as JSON, in one rename (not the
        fitted GP: it is refitted deterministically from the observations)."""
        write_json_state(checkpoint_path, self.get_state())

    def restore(self, checkpoint_path: str) -> None:
        self.set_state(read_json_state(checkpoint_path))


# -- JSON state --------------------------------------------------------------------------------
# Search state is written as JSON, never pickled: a state file read back cannot run code. Floats
# round-trip exactly (Python writes the shortest repr that reads back to the same double); tensors
# are stored as {"tensor": nested lists, "dtype": name}; tuples come back as lists and are
# rebuilt where their type matters (observation and live-trial points, ``cost_prior``).

def _to_json(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {"tensor": value.tolist(), "dtype": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, dict):
        return {k: _to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"tensor", "dtype"}:
            return torch.tensor(value["tensor"], dtype=getattr(torch, value["dtype"]))
        return {k: _from_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    return value


def _scalars(result: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The numbers and strings of a Tune result (what the searchers read from it), JSON-able."""
    if result is None:
        return None
    kept = {}
    for key, value in result.items():
        if isinstance(value, np.generic):
            value = value.item()
        if value is None or isinstance(value, (bool, int, float, str)):
            kept[key] = value
    return kept


def space_state(space: SearchSpace) -> dict[str, Any]:
    """``space`` as JSON-able data (what :func:`space_from_state` rebuilds)."""
    return {"params": [asdict(p) for p in space.params], "sizes": dict(space.sizes), "budget_min": space.budget_min,
            "budget_max": space.budget_max, "target": space.target, "budget_step": space.budget_step,
            "min_budget": space.min_budget, "size_key": space.size_key, "budget_key": space.budget_key,
            "size_scale": space.size_scale}


def space_from_state(state: Mapping[str, Any]) -> SearchSpace:
    return SearchSpace(params=tuple(Param(**p) for p in state["params"]),
                       **{k: v for k, v in state.items() if k != "params"})


def write_json_state(path: str | os.PathLike, state: Mapping[str, Any]) -> None:
    """``state`` as JSON at ``path`` in one rename (a crash leaves the previous file whole)."""
    path = os.fspath(path)
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, allow_nan=True)
    os.replace(tmp, path)


def read_json_state(path: str | os.PathLike) -> dict[str, Any]:
    """What :func:`write_json_state` wrote; a file that is not such JSON is an error naming it."""
    try:
        with open(path) as f:
            state = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{os.fspath(path)} is not a JSON search state ({e}); it may be damaged or come from an "
                         f"older isosweep that pickled its state: move it away to start the search afresh") from None
    if not isinstance(state, dict):
        raise ValueError(f"{os.fspath(path)} is not a JSON search state (a {type(state).__name__}, not an object)")
    return state


class RandomSearcher(BaseSearcher):
    """Random-search baseline: hyperparameters uniform on the unit cube (so log-uniform for log
    parameters), run at the target fidelity unless ``fidelity`` names another ``(size, budget)``."""

    def __init__(self, space: SearchSpace, metric: str | None = None, mode: str | None = "max", *,
                 fidelity: tuple[str, int] | None = None, **kwargs: Any) -> None:
        super().__init__(space, metric, mode, **kwargs)
        size, budget = fidelity if fidelity is not None else (space.target, space.budget_max)
        self._fid = (space.size_fidelity(size), space.budget_fidelity(space.snap_budget(budget)))

    def _propose(self) -> list[float]:
        return [*self._uniform_hparams(), *self._fid]


def asha_scheduler(space: SearchSpace, metric: str | None = None, mode: str | None = None, *,
                   time_attr: str = "rollouts", reduction_factor: float = 3):
    """ASHA baseline over the same budget range: trials advance in rungs of ``time_attr``
    (rollouts) from ``grace_period = budget_min`` to ``max_t = budget_max``, keeping the top
    1/``reduction_factor`` at each rung. Pair it with ``RandomSearcher`` (or Tune's default
    random search over the same ranges) at the target size; ASHA supplies the iteration
    fidelity itself, so every trial is started with ``budget = budget_max``."""
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr=time_attr, metric=metric, mode=mode, max_t=space.budget_max,
                         grace_period=space.budget_min, reduction_factor=reduction_factor)


class JFHPOSearcher(BaseSearcher):
    """Joint-fidelity Bayesian HPO: multi-fidelity GP + cost-aware EI, as a Ray Tune searcher.

    ``JFHPOSearcher(space, metric, mode="max", study_budget=..., cost_fn=...)``.

    - ``n_init`` first suggestions are a scrambled Sobol design over the hyperparameters at low
      fidelity (sizes below the target, in turn; budgets in the lower half of the range), so the
      GP starts from cheap points that still vary in both fidelities.
    - Then each suggestion maximises ``log EI - log cost`` (see the module docstring); trials
      still running are ``X_pending`` of a ``qLogExpectedImprovement`` so concurrent
      suggestions differ.
    - ``study_budget`` (in the units of ``cost_fn``, default: measured ``time_attr`` seconds):
      ``suggest`` returns ``Searcher.FINISHED`` once the completed trials' cost reaches it.
    - ``intermediate=k`` also records up to ``k`` intermediate reports per trial as lower-budget
      observations (at evenly spaced fractions of its budget).
    - ``num_restarts``/``raw_samples`` size the acquisition optimisation per size rung.
    - ``noise_floor``: the variance (in objective units) below which the GP may not explain an
      observation as noise, e.g. the evaluation's own variance (``se**2`` of a value measured on a
      finite eval set): the noise level is still fitted, but not below what the measurement is
      known to have. ``None``: BoTorch's default (fitted, floor 1e-4 in standardised units).
    - ``candidates``: configs (every hyperparameter, ``size_key`` and ``budget_key``) that proposals
      are chosen from, the acquisition evaluated on each (``optimize_acqf_discrete``), in place of
      optimising it over the continuous space (``optimize_acqf_mixed``, one rung per size). For a space
      that is a grid anyway -- a tabular benchmark, whose off-grid proposals would be snapped to it.
    - ``refit_every=k``: fit the GP's hyperparameters when at least ``k`` observations have arrived since
      the last fit, and in between condition the last fitted hyperparameters on the new data (1, the
      default: a fit for every new observation). The posterior always conditions on every observation;
      only the hyperparameters lag, by at most ``k - 1`` observations.
    - ``fit_failures``: how many GP fits raised (a fit replayed on the same data after a restore is not
      counted again). Each is logged as a warning on this module's logger; the searcher goes on with the
      hyperparameters the fit started from (see :meth:`model`), so a failed fit never stops a proposal.
    - ``proxy_check=k`` (0: off; else at least 3): the proxies must earn their trust. Once the initial
      design has been suggested and two of its results are in, the GP (fitted on the proxies) ranks the hyperparameters by their predicted value at
      the target, and ``k`` of them spread over that ranking (the predicted best, the worst, and evenly
      in between) are run at the target size and the smallest budget. If the target's values rank them
      with a Spearman correlation below ``proxy_rho`` to what the GP predicted at that fidelity, the
      proxies are distrusted for the rest of the study: the GP is refitted on the target's observations
      only and every later proposal is at the target size (the search becomes a single-fidelity BO over
      the budget). ``proxies_trusted`` and ``proxy_verdict`` say what the check found. Spearman's null
      distribution makes ``k = 3`` pass by chance with probability 1/6 at the default ``proxy_rho = 0.6``
      (only the full order passes), ``k = 4`` with 5/24.
    - ``proxy_budget``: the most, in the units the study is charged in, that trials below the target
      size may cost in all (None: no limit); once spent, every proposal is at the target size. It keeps a
      large study budget from going to ever more proxies when the target's values are what is left to
      resolve, and bounds what misleading proxies can waste.
    """

    def __init__(self, space: SearchSpace, metric: str | None = None, mode: str | None = "max", *,
                 n_init: int | None = None, num_restarts: int = 4, raw_samples: int = 128,
                 mc_samples: int = 128, intermediate: int = 0, cost_prior: tuple[float, float] = (0.1, 1.0),
                 optimize_incumbent: bool = False, fit_maxiter: int = 200, acq_maxiter: int = 100,
                 noise_floor: float | None = None, candidates: list[Mapping[str, Any]] | None = None,
                 refit_every: int = 1, proxy_check: int = 0, proxy_rho: float = 0.6,
                 proxy_budget: float | None = None, **kwargs: Any) -> None:
        super().__init__(space, metric, mode, **kwargs)
        if proxy_check and proxy_check < 3:
            raise ValueError(f"proxy_check={proxy_check}: a rank correlation needs at least 3 configurations (0: off)")
        if not -1 <= proxy_rho <= 1:
            raise ValueError(f"proxy_rho={proxy_rho}: a Spearman correlation lies in [-1, 1]")
        if proxy_budget is not None and proxy_budget < 0:
            raise ValueError(f"proxy_budget={proxy_budget}: must be >= 0 (None: no limit)")
        self.proxy_check, self.proxy_rho, self.proxy_budget = int(proxy_check), float(proxy_rho), proxy_budget
        self._trust: bool | None = None
        self._check: dict[str, Any] | None = None
        self._check_slot: int | None = None
        self.proxy_verdict: dict[str, Any] | None = None
        self.noise_floor = noise_floor
        if candidates is not None and not candidates:
            raise ValueError("candidates: an empty list leaves nothing to propose (None: the continuous space)")
        self._candidates = None if candidates is None else [space.to_unit(c) for c in candidates]
        if refit_every < 1:
            raise ValueError(f"refit_every={refit_every}: must be at least 1 (1: a fit for every new observation)")
        self.refit_every, self._fit_n = int(refit_every), -1
        self.n_init = max(2, n_init if n_init is not None else len(space.params) + 2)
        self.num_restarts, self.raw_samples, self.mc_samples = num_restarts, raw_samples, mc_samples
        self.intermediate = intermediate
        self.cost_prior = cost_prior
        self.optimize_incumbent = optimize_incumbent
        self._init_design = self._make_init_design()
        self.fit_maxiter, self.acq_maxiter = fit_maxiter, acq_maxiter
        self._model_cache: tuple[int, Any] | None = None
        self._hyper: dict[str, torch.Tensor] | None = None
        self._hyper_start: dict[str, torch.Tensor] | None = None
        self._hyper_n = -1
        self.fit_failures = 0

    _STATE = (*BaseSearcher._STATE, "n_init", "_init_design", "cost_prior", "_hyper", "_hyper_start",
              "_hyper_n", "noise_floor", "_candidates", "refit_every", "_fit_n", "proxy_check", "proxy_rho",
              "proxy_budget", "_trust", "_check", "proxy_verdict", "fit_failures")

    def set_state(self, state: dict) -> None:
        # A state saved before failed fits were counted has no count: read it as 0.
        super().set_state({"fit_failures": 0, **state})

    def _invalidate(self) -> None:
        self._model_cache = None

    # -- initial design ---------------------------------------------------------------------
    def _make_init_design(self) -> list[list[float]]:

        n = len(self.space.params)
        sobol = SobolEngine(n + 1, scramble=True, seed=self.seed).draw(self.n_init, dtype=torch.double).tolist()
        low = [s for s in self.space.size_fidelities if s < 1] or [1.0]
        b_min = self.space.b_min
        design = []
        for i, u in enumerate(sobol):
            b = b_min + u[n] * (1 - b_min) / 2
            design.append([*u[:n], low[i % len(low)], b])
        return design

    # -- intermediate observations ----------------------------------------------------------
    def _on_intermediate(self, trial_id: str, live: dict[str, Any], result: Mapping[str, Any]) -> None:
        if not self.intermediate or not self.progress_key or result.get(self.progress_key) is None:
            return
        y = self._objective(result)
        if y is None:
            return
        budget = live["config"][self.space.budget_key]
        done = float(result[self.progress_key])
        mark = live["marks"]
        if mark < self.intermediate and done >= budget * (mark + 1) / (self.intermediate + 1) and done < budget:
            x = list(live["x"])
            x[self.space.idx_b] = self.space.budget_fidelity(done)
            self.observations.append(Observation(trial_id, tuple(x), y, None, 0.0, final=False))
            live["marks"] = int(done * (self.intermediate + 1) // budget)
            self._model_cache = None

    # -- model ------------------------------------------------------------------------------
    def _torch_seed(self, salt: int) -> int:
        return (self.seed * 1_000_003 + salt) % (2**31 - 1)

    def model(self):
        """The multi-fidelity GP fitted to all observations (cached per observation count).

        Fitting is seeded from the searcher's seed and the number of observations, so the same
        observations always give the same model, in this process or after a restore. A fit that
        raises leaves the GP at the hyperparameters it started from (the previous model's, else
        BoTorch's initial values), conditioned on all the observations; it is logged and counted in
        ``fit_failures``."""

        used = self._modelled()
        n = len(used)
        if n < 2:
            return None
        if self._model_cache is not None and self._model_cache[0] == n:
            return self._model_cache[1]
        X = torch.tensor([o.x for o in used], dtype=torch.double)
        Y = torch.tensor([[o.y] for o in used], dtype=torch.double)
        with torch.random.fork_rng():
            torch.manual_seed(self._torch_seed(n))
            gp = SingleTaskMultiFidelityGP(X, Y, data_fidelities=[self.space.idx_s],
                                           iteration_fidelity=self.space.idx_b, likelihood=self._likelihood(Y))
            # Warm start from the previous fit: one more point rarely moves the optimum far, and a
            # capped L-BFGS run from there is several times cheaper than a cold one. Refitting the
            # same n (after a restore) starts from the same point as the first time.
            start = self._hyper_start if self._hyper_n == n else self._hyper
            if start is not None:
                gp.load_state_dict(start, strict=False)
                if self.noise_floor is not None:  # the floor moves with Y's variance: a warm start may sit below it
                    noise = gp.likelihood.noise_covar
                    with torch.no_grad():
                        noise.raw_noise.clamp_(min=float(noise.raw_noise_constraint.lower_bound) * 1.0001)
            if self._hyper_n == n:  # the same n again (after a restore): fit, or not, as the first time
                fit = self._fit_n == n
            else:
                fit = start is None or n - self._fit_n >= self.refit_every
            if fit:
                mll = ExactMarginalLogLikelihood(gp.likelihood, gp)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    try:
                        fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": self.fit_maxiter}})
                    except Exception as err:  # noqa: BLE001 - a GP at its starting hyperparameters is still usable
                        # The same n again replays the same seeded fit from the same start (a restore, a moved
                        # live trial): that failure was counted and logged the first time.
                        if self._hyper_n != n:
                            self.fit_failures += 1
                            kept = "the previous model's" if start is not None else "BoTorch's initial"
                            log.warning("JF-HPO: the GP fit on %d observations failed (%s: %s); going on with %s "
                                        "hyperparameters instead (failed fits so far: %d)", n, type(err).__name__,
                                        err, kept, self.fit_failures)
                self._fit_n = n
        gp.eval()
        self._hyper = {k: v.detach().clone() for k, v in gp.state_dict().items() if _is_hyperparameter(k)}
        self._hyper_start, self._hyper_n = start, n
        self._model_cache = (n, gp)
        return gp

    def _likelihood(self, Y: torch.Tensor):
        """BoTorch's default likelihood, its noise floor raised to ``noise_floor`` (standardised as the
        GP standardises Y); ``None`` without a floor."""
        if self.noise_floor is None:
            return None
        variance = float(Y.var()) if Y.numel() > 1 else 0.0
        floor = max(MIN_INFERRED_NOISE_LEVEL, self.noise_floor / variance if variance > 0 else 0.0)
        prior = LogNormalPrior(loc=-4.0, scale=1.0)
        return GaussianLikelihood(noise_prior=prior, noise_constraint=GreaterThan(
            floor, transform=None, initial_value=max(float(prior.mode), 2 * floor)))

    def _bounds(self):

        n = len(self.space.params)
        lower = [0.0] * n + [min(self.space.size_fidelities), self.space.b_min]
        return torch.tensor([lower, [1.0] * (n + 2)], dtype=torch.double)

    def target_incumbent(self, model=None) -> tuple[float, list[float]]:
        """``(value, hparams_unit)``: the best GP posterior mean at the target fidelity over the
        observed hyperparameters (optionally refined by optimising the posterior mean with the
        fidelity columns fixed at the target)."""

        model = model if model is not None else self.model()
        d = self.space.dim
        X = torch.tensor([o.x for o in self._modelled()], dtype=torch.double)
        mean = PosteriorMean(model)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = mean(project_to_target_fidelity(X, self.space.target_fidelities, d).unsqueeze(1))
        i = int(values.argmax())
        best_value, best_h = float(values[i]), X[i, :len(self.space.params)].tolist()
        if self.optimize_incumbent:
            fixed = FixedFeatureAcquisitionFunction(mean, d=d, columns=[self.space.idx_s, self.space.idx_b],
                                                    values=[1.0, 1.0])
            n = len(self.space.params)
            bounds = torch.tensor([[0.0] * n, [1.0] * n], dtype=torch.double)
            with torch.random.fork_rng(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.manual_seed(self._torch_seed(len(self.observations) + 7919))
                cand, val = optimize_acqf(fixed, bounds=bounds, q=1, num_restarts=self.num_restarts,
                                          raw_samples=self.raw_samples,
                                          batch_initial_conditions=None)
            if float(val) > best_value:
                best_value, best_h = float(val), cand.squeeze(0).tolist()
        return best_value, best_h

    def acquisition(self, model=None, X_pending=None):
        """``log EI(x; incumbent at target) - log cost(x)`` as a BoTorch acquisition function."""
        model = model if model is not None else self.model()
        best_f, _ = self.target_incumbent(model)
        c0, c1 = self.cost_constants()
        return CostAwareLogEI(model, best_f, c0=c0, c1=c1, idx_s=self.space.idx_s, idx_b=self.space.idx_b,
                              X_pending=X_pending, mc_samples=self.mc_samples, size_ratio=self.space.size_ratio,
                              seed=self._torch_seed(len(self.observations) + 104729))

    # -- proxy trust ------------------------------------------------------------------------
    def _at_target(self, o: Observation) -> bool:
        return o.x[self.space.idx_s] >= 1 - 1e-9

    def _modelled(self) -> list[Observation]:
        """The observations the GP is fitted on: all of them, or the target's only once the proxies are distrusted."""
        if self._trust is False:
            return [o for o in self.observations if self._at_target(o)]
        return self.observations

    @property
    def proxies_trusted(self) -> bool | None:
        """The proxy check's verdict: None while it is off or undecided."""
        return self._trust

    def proxy_spent(self) -> float:
        """What the finished trials below the target size were charged."""
        return sum(o.cost for o in self.observations if o.final and not self._at_target(o))

    def target_only(self) -> bool:
        """Whether proposals are restricted to the target size: the proxies are distrusted or being checked, or
        ``proxy_budget`` is spent."""
        if self._trust is False or (self._trust is None and self._check is not None):
            return True
        return self.proxy_budget is not None and self.proxy_spent() >= self.proxy_budget - 1e-12

    def _hparam_pool(self) -> list[list[float]]:
        """Hyperparameters the check ranks: the candidates' (deduplicated), else a scrambled Sobol set."""
        n = len(self.space.params)
        if self._candidates is not None:
            return [list(h) for h in dict.fromkeys(tuple(c[:n]) for c in self._candidates)]
        return SobolEngine(n, scramble=True, seed=self._torch_seed(31337)).draw(256, dtype=torch.double).tolist()

    def _start_check(self, model) -> None:
        """Pick the ``proxy_check`` configurations to verify and freeze the GP's predictions for them."""
        pool = self._hparam_pool()
        mean = PosteriorMean(model)
        at = lambda b: torch.tensor([[*h, 1.0, b] for h in pool], dtype=torch.double).unsqueeze(1)  # noqa: E731
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            final = mean(at(1.0)).tolist()
            first = mean(at(self.space.b_min)).tolist()
        order = sorted(range(len(pool)), key=lambda j: -final[j])
        k = min(self.proxy_check, len(pool))
        chosen = [order[round(j * (len(pool) - 1) / (k - 1))] for j in range(k)]
        self._check = {"h": [pool[j] for j in chosen], "predicted": [first[j] for j in chosen],
                       "trials": {}, "observed": [None] * k, "next": 0}

    def suggest(self, trial_id: str) -> dict | str | None:
        self._check_slot = None
        config = super().suggest(trial_id)
        if self._check_slot is not None and isinstance(config, dict):
            self._check["trials"][trial_id] = self._check_slot
        return config

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        live = self._live.get(trial_id)
        last = None if live is None else live["last"]
        super().on_trial_complete(trial_id, result, error)
        check = self._check
        if check is None or self._trust is not None or trial_id not in check["trials"]:
            return
        y = self._objective(dict(result) if result else (last or {}))
        check["observed"][check["trials"][trial_id]] = y
        if len(check["trials"]) == len(check["h"]) and all(
                t not in self._live for t in check["trials"]):
            self._decide()

    def _decide(self) -> None:
        check = self._check
        pairs = [(p, y) for p, y in zip(check["predicted"], check["observed"]) if y is not None]
        rho = float(spearmanr(*zip(*pairs)).statistic) if len(pairs) >= 3 else float("nan")
        self._trust = proxies_agree(rho, self.proxy_rho)
        self.proxy_verdict = {"rho": rho if math.isfinite(rho) else None, "pairs": len(pairs),
                              "threshold": self.proxy_rho, "trusted": self._trust}
        if not self._trust:  # a new model on other data: fit it from scratch
            self._hyper = self._hyper_start = None
            self._hyper_n = self._fit_n = -1
        self._model_cache = None

    # -- proposal ---------------------------------------------------------------------------
    def _propose(self) -> list[float]:
        i = self.n_suggested
        if i < self.n_init:
            x = list(self._init_design[i])
            if self.proxy_budget is not None and self.target_only():  # the design too stops at the proxy budget
                x[self.space.idx_s] = 1.0
            return x
        if self.proxy_check and self._trust is None and len(self.observations) >= 2:
            if self._check is None:
                self._start_check(self.model())
            check = self._check
            if check["next"] < len(check["h"]):
                self._check_slot = check["next"]
                check["next"] += 1
                return [*check["h"][self._check_slot], 1.0, self.space.b_min]
        if len(self._modelled()) < 2:
            if self.target_only():  # distrusted proxies and fewer than two target values: a random target point
                return [*self._uniform_hparams(), 1.0, self.space.b_min]
            # Still waiting for the design's results: more random low-fidelity points.
            low = [s for s in self.space.size_fidelities if s < 1] or [1.0]
            b = self.space.b_min + float(self._rng.random()) * (1 - self.space.b_min) / 2
            return [*self._uniform_hparams(), low[int(self._rng.integers(len(low)))], b]

        model = self.model()
        pending = [live["x"] for live in self._live.values()]
        X_pending = torch.tensor(pending, dtype=torch.double) if pending else None
        acq = self.acquisition(model, X_pending)
        step_seed = int(self._rng.integers(2**31 - 1))
        sizes = [1.0] if self.target_only() else list(self.space.size_fidelities)
        with torch.random.fork_rng(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(step_seed)
            if self._candidates is not None:
                choices = [c for c in self._candidates if any(abs(c[self.space.idx_s] - s) < 1e-9 for s in sizes)]
                choices = torch.tensor(choices or self._candidates, dtype=torch.double)
                cand, _ = optimize_acqf_discrete(acq, q=1, choices=choices, unique=False)
                return cand.squeeze(0).tolist()
            cand, _ = optimize_acqf_mixed(acq, bounds=self._bounds(), q=1, num_restarts=self.num_restarts,
                                          raw_samples=self.raw_samples,
                                          fixed_features_list=[{self.space.idx_s: s} for s in sizes],
                                          options={"maxiter": self.acq_maxiter})
        return cand.squeeze(0).tolist()

    def recommend(self) -> dict[str, Any] | None:
        """Best config at the target fidelity by GP posterior mean (the best observation before a GP exists)."""
        model = self.model()
        if model is None:
            return super().recommend()
        _, h = self.target_incumbent(model)
        return self.space.at_target(self.space.from_unit([*h, 1.0, 1.0]))


__all__ = ["Observation", "fit_cost_model", "proxies_agree", "CostAwareLogEI", "JFHPOSearcher", "RandomSearcher", "asha_scheduler"]
