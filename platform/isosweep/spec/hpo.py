"""HPO study files: ``sweeps/jfhpo.yaml`` -> a validated ``HPOSpec`` -> the search space and its trial configs.

An HPO study tunes GRPO hyperparameters for a *target* model (the largest size of a model
family) at a full-fidelity budget C (``budget``, ``make sweep BUDGET=``), spending a total
``study_budget`` of compute. Each trial runs one configuration at a fidelity the searcher
chooses: a size from the ladder and a budget in ``[budget_min * C, C]``.

Cost units. Compute is counted in *target-equivalent rollouts*: a trial that trains ``r``
rollouts on a model with ``p`` parameters costs ``r * p / p_target`` (training compute is
proportional to parameters x rollouts), plus ``cost.per_trial * C`` for what every trial pays
whatever its length (start-up, model load, evaluations). ``study_budget`` is either a count in
those units (``48000``) or a multiple of one full-fidelity trial's cost (``6x`` = what 6 trials
of the target at C cost, ``6 * (1 + per_trial) * C``). A promoted trial (one continuing a smaller-budget run of the same configuration)
is charged only for the rollouts it adds.

A bad file stops before any trial starts, naming the file and the key: an empty range, a size
ladder whose target is not the largest, a smallest budget below one optimizer step, a study
budget that cannot pay for one trial at the lowest fidelity.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from isosweep.hpo.space import Param, SearchSpace
from isosweep.models.sizes import SIZES, param_count, warmup_version_in_ids
from isosweep.spec.trial import TrialConfig, unscored_search
from isosweep.spec.values import parse_budget, short_count, slug
from isosweep.spec.yamlio import ConfigError, Section, merge, parse_overrides, read_yaml, validate


class RangeSpec(Section):
    """One searched hyperparameter: ``[low, high]``, log-scaled if ``log``."""

    low: float
    """Smallest value searched."""
    high: float
    """Largest value searched."""
    log: bool = False
    """Search on a log scale (a learning rate), else linearly."""

    @model_validator(mode="after")
    def _non_empty(self) -> RangeSpec:
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"bounds must be finite (got low={self.low}, high={self.high})")
        if self.low >= self.high:
            raise ValueError(f"empty range: low = {self.low:g} must be below high = {self.high:g}")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0 (got low = {self.low:g}); use a small positive bound")
        return self


class CostSpec(Section):
    """The cost model of the study budget (units: target-equivalent rollouts)."""

    per_trial: float = Field(0.0, ge=0)
    """Fixed charge per trial, as a fraction of C (start-up, model load, evaluations)."""


class StoppingSpec(Section):
    """Early stopping from training dynamics, checked at every evaluation report of a trial.

    Each report carries the training statistics averaged since the previous one."""

    tau1: float | None = Field(1.0, gt=0)
    """Stop when the KL growth ratio ΔKL/KL exceeds tau1 on ``k`` consecutive reports (null: off). Reports
    are the trial's evaluations: with log-spaced ones each doubles the compute, and a healthy KL may grow
    by a sizeable share between two of them, so a small tau1 stops healthy trials."""
    k: int = Field(2, ge=1)
    """Consecutive reports above ``tau1`` before the KL rule stops a trial."""
    tau2: float | None = Field(0.5, gt=0, le=1)
    """Stop when the train reward falls below (1 - tau2) x its best so far (null: off)."""
    grace: float | None = Field(0.25, gt=0)
    """Stop when the train reward is still zero after grace x C rollouts (null: off)."""
    kl_floor: float = Field(1e-2, gt=0)
    """KL below this is noise: ratios from it do not count towards ``tau1``."""


class JFHPOSpec(Section):
    """Settings of the JF-HPO searcher."""

    n_init: int | None = Field(None, ge=2)
    """Initial low-fidelity design points before the GP is used (default: hyperparameters + 2)."""
    num_restarts: int = Field(4, ge=1)
    """Starting points of BoTorch's gradient optimization of the acquisition function."""
    raw_samples: int = Field(128, ge=8)
    """Random points BoTorch scores to choose those starting points."""
    promote_within: float = Field(0.05, ge=0, le=1)
    """A proposal whose hyperparameters are within this distance (unit cube, max norm) of a finished
    trial's, at the same size and a larger budget, runs that trial's configuration and continues it."""
    final_at_target: bool = True
    """Keep one full-fidelity trial's worth of the study budget for running the recommendation at the target."""
    size_scale: Literal["params", "log"] = "params"
    """The size fidelity ``s``: ``params`` (parameters / the target's) or ``log`` (evenly spaced for a
    ladder that doubles, the smallest size at 0.5; see ``hpo.space``). The cost is parameters x
    rollouts either way."""
    proxy_check: int = Field(0, ge=0)
    """After the initial design, run this many configurations (at least 3; 0: off) spread over the GP's
    predicted ranking at the target size and the smallest budget; if the target does not rank them like
    the proxies predicted (Spearman below ``proxy_rho``), the rest of the study searches at the target
    only, its GP fitted on the target's values."""
    proxy_rho: float = Field(0.6, ge=-1, le=1)
    """The rank correlation the proxy check needs to keep trusting the proxies."""
    proxy_share: float | None = Field(None, ge=0, le=1)
    """The most of the study budget that trials below the target size may cost (null: no limit); once it is
    spent every proposal is at the target size."""

    @model_validator(mode="after")
    def _check_size(self) -> "JFHPOSpec":
        if self.proxy_check and self.proxy_check < 3:
            raise ValueError(f"proxy_check: {self.proxy_check} configurations cannot be ranked (at least 3; 0: off)")
        return self


HPO_ADDED_LATER = {"jfhpo": {"proxy_check": 0, "proxy_rho": 0.6, "proxy_share": None}}
"""Study keys added after studies were first run, with their defaults: left out of a study's id while at their
default, so a study file keeps its id -- and a rerun resumes it -- across versions of isosweep."""


class ASHASpec(Section):
    reduction_factor: float = Field(3, gt=1)
    """Each rung keeps the best 1/reduction_factor of the trials that reach it."""


class HPOSpec(Section):
    """One HPO study: the trial it tunes, the space, the fidelities, the searcher and the budgets."""

    name: str
    """Identifies the study (lower case, digits and dashes); the study's id starts with it."""
    description: str = ""
    """One line on what the study tunes, for people reading the file and its MLflow parent run."""
    study: Literal["hpo"]
    """Always ``hpo`` for an HPO study (grid sweeps say ``isocompute`` or ``fixed-batch``)."""
    search: Literal["jfhpo", "random", "asha"]
    """``jfhpo``: multi-fidelity GP + cost-aware EI; ``random``: random configurations at the target
    fidelity; ``asha``: random configurations at the target size, stopped early by ASHA in rungs of budget."""
    trial: str
    """The base trial YAML, relative to this file."""
    budget: int = Field(gt=0)
    """C: rollouts of a full-fidelity trial (``BUDGET=``)."""
    study_budget: str | float
    """Total spend in target-equivalent rollouts, or ``<k>x`` for k full-fidelity trials (``STUDY_BUDGET=``)."""
    budget_min: float = Field(0.125, gt=0, le=1)
    """Smallest trial budget, as a fraction of C."""
    sizes: list[str] | dict[str, int] = Field(min_length=1)
    """The size ladder, smallest first; the last is the target and must be the largest. Tiny sizes are
    listed by name; other models as ``{name: parameter count}``."""
    space: dict[str, RangeSpec] = Field(min_length=1)
    """Searched trial keys (dotted, e.g. ``algorithm.lr_ref``) and their ranges."""
    metric: Literal["mean", "best", "worst"] = "mean"
    """The eval metric maximised: ``eval/<metric>@k`` of the trial's eval.k."""
    seed: int = Field(0, ge=0)
    """Seed of the searcher (the trials keep the base trial's seed)."""
    set: dict[str, Any] = {}
    """Trial keys set for every trial (dotted)."""
    cost: CostSpec = CostSpec()
    stopping: StoppingSpec = StoppingSpec()
    jfhpo: JFHPOSpec = JFHPOSpec()
    asha: ASHASpec = ASHASpec()
    max_trials: int = Field(200, ge=1)
    """A cap on the number of trials, whatever is left of the study budget."""

    _slug = field_validator("name")(classmethod(lambda cls, name: slug(name)))

    @field_validator("space")
    @classmethod
    def _searchable(cls, space: dict[str, RangeSpec]) -> dict[str, RangeSpec]:
        for key in space:
            if "." not in key or key == "model.name":
                raise ValueError(f"{key!r} cannot be searched: size (model.name) and budget are the fidelities, and "
                                 "Bp, n and seed fix the batch and the data; allowed: keys of a section, e.g. "
                                 "algorithm.lr_ref, algorithm.clip_high, algorithm.kl_coef")
        return space


@dataclass(frozen=True)
class HPOStudy:
    """A loaded study: the spec, its file, C, the study budget, the search space and the base trial data."""

    spec: HPOSpec
    path: Path
    budget: int
    study_budget: float
    space: SearchSpace
    base: dict[str, Any]
    batch: int

    @property
    def sweep_id(self) -> str:
        """``<name>-<search>-s<seed>-<C>-<hash>``: the same study re-run resumes; a changed one is new."""
        spec = self.spec.model_dump(mode="json")
        for section, keys in HPO_ADDED_LATER.items():
            for key, default in keys.items():
                if spec[section].get(key) == default:
                    del spec[section][key]
        data = {"spec": spec, "budget": self.budget, "study_budget": self.study_budget,
                "base": self.base, "objective": "gain over the base model", "incumbent": "trained evals only"}
        version = warmup_version_in_ids()
        if any(size in SIZES for size in self.spec.sizes) and version:
            data["warmup_version"] = version  # its tiny sizes are other base models: a new study, not a resume
        digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:6]
        return f"{self.spec.name}-{self.spec.search}-s{self.spec.seed}-{short_count(self.budget)}-{digest}"

    @property
    def k(self) -> int:
        return int(self.base.get("eval", {}).get("k", 4))

    @property
    def metric(self) -> str:
        return f"eval/{self.spec.metric}@{self.k}"

    @property
    def target(self) -> str:
        return self.space.target

    def size_fidelity(self, size: str) -> float:
        return self.space.size_fidelity(size)

    def size_ratio(self, size: str) -> float:
        """Parameters of ``size`` relative to the target: what a rollout there costs in target rollouts."""
        return self.space.params_ratio(size)

    def trial_config(self, params: dict[str, Any], size: str, budget: int) -> TrialConfig:
        """The trial config of searched ``params`` (dotted keys) at fidelity ``(size, budget)``."""
        data = merge(self.base, parse_overrides([f"{k}={json.dumps(float(v))}" for k, v in params.items()]))
        data = merge(data, {"budget": int(budget), "model": {"name": size}})
        return validate(TrialConfig, data, f"{self.path}: trial at size {size}, budget {budget}")

    def cost(self, size: str, rollouts: float) -> float:
        """Target-equivalent rollouts charged for training ``rollouts`` on ``size`` (plus the per-trial charge)."""
        return self.size_ratio(size) * float(rollouts) + self.spec.cost.per_trial * self.budget


def parse_study_budget(text: str | float | int, full_trial: float, source: str) -> float:
    """``6x`` -> 6 full-fidelity trials (``6 * full_trial``); ``48000`` / ``4.8e4`` -> 48000 (target-equivalent rollouts)."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) * full_trial if raw.endswith("x") else float(raw)
    except ValueError:
        raise ConfigError(f"{source}: key 'study_budget': {text!r} is not a number; allowed: target-equivalent "
                          "rollouts (e.g. 48000) or a multiple of one full-fidelity trial (e.g. 6x)") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{source}: key 'study_budget': must be positive (got {text!r})")
    return value


def _ladder(spec: HPOSpec, source: str) -> dict[str, int]:
    if isinstance(spec.sizes, dict):
        return dict(spec.sizes)
    unknown = [s for s in spec.sizes if s not in SIZES]
    if unknown:
        raise ConfigError(f"{source}: key 'sizes': {unknown} are not tiny sizes ({', '.join(SIZES)}); give other "
                          "models with their parameter counts, e.g. {Qwen/Qwen2.5-0.5B: 494000000, ...}")
    return {s: param_count(s) for s in spec.sizes}


def load_hpo(path: str | Path, budget: int | str | float | None = None,
             study_budget: str | float | None = None, overrides: dict[str, Any] | None = None) -> HPOStudy:
    """Load and validate an HPO study file; ``budget`` (``BUDGET=``) replaces C, ``study_budget``
    (``STUDY_BUDGET=``) the total spend, ``overrides`` top-level keys (``{"search": "asha", "seed": 1}``).
    Every check that can fail fails here, before any trial."""
    path = Path(path)
    source = str(path) + (f" (with {overrides})" if overrides else "")
    spec: HPOSpec = validate(HPOSpec, {**read_yaml(path), **(overrides or {})}, source)
    C = spec.budget if budget is None else parse_budget(budget)
    trial_path = (path.parent / spec.trial).resolve()
    if not trial_path.exists():
        raise ConfigError(f"{source}: key 'trial': no such file {spec.trial!r} (looked for {trial_path})")
    overrides = parse_overrides([f"{key}={json.dumps(value) if not isinstance(value, str) else value}"
                                 for key, value in spec.set.items()])
    base = merge(read_yaml(trial_path), overrides)

    sizes = _ladder(spec, source)
    names = list(sizes)
    largest = max(sizes, key=sizes.get)
    if names[-1] != largest or sum(v == sizes[largest] for v in sizes.values()) > 1:
        raise ConfigError(f"{source}: key 'sizes': the last size is the target and must be the strictly largest; "
                          f"{names[-1]!r} has {sizes[names[-1]]:,} parameters but {largest!r} has {sizes[largest]:,}")
    # the base trial at the target's full fidelity must be a valid trial (bad keys under 'set' stop here)
    full = validate(TrialConfig, merge(base, {"budget": C, "model": {"name": names[-1]}}),
                    f"{source}: the base trial {spec.trial} at budget {C}")
    batch = full.Bp * full.n
    low = int(round(spec.budget_min * C)) // batch * batch
    if low < batch:
        raise ConfigError(f"{source}: key 'budget_min': {spec.budget_min:g} x C = {spec.budget_min * C:g} rollouts is "
                          f"less than one optimizer step (Bp * n = {batch}); allowed: budget_min >= {batch / C:.3g} "
                          f"at C = {C}, or a larger BUDGET")
    high = C // batch * batch
    total = parse_study_budget(spec.study_budget if study_budget is None else study_budget,
                               (1 + spec.cost.per_trial) * high, source)
    try:
        space = SearchSpace(params=tuple(Param(k, r.low, r.high, r.log) for k, r in spec.space.items()),
                            sizes=sizes, budget_min=low, budget_max=high, target=names[-1], budget_step=batch,
                            min_budget=batch, size_key="model.name", budget_key="budget",
                            size_scale=spec.jfhpo.size_scale)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
    study = HPOStudy(spec=spec, path=path, budget=high, study_budget=total, space=space, base=base, batch=batch)
    # JF-HPO can start at the smallest size and budget; random search and ASHA start every trial at the target's
    # full fidelity (ASHA may stop it early, but cannot know that when it starts it)
    low_size, low_budget = (names[0], low) if spec.search == "jfhpo" else (names[-1], high)
    cheapest = study.cost(low_size, low_budget)
    if total < cheapest:
        raise ConfigError(f"{source}: key 'study_budget': {total:,.0f} target-equivalent rollouts cannot pay for one "
                          f"trial at the lowest fidelity {spec.search} uses ({low_size} at {low_budget} rollouts costs "
                          f"{cheapest:,.0f}); allowed: a larger study_budget (e.g. 6x) or STUDY_BUDGET=")
    unscored = unscored_search(spec.space, full)
    if unscored:
        raise ConfigError(f"{source}: key 'space': {unscored}")
    # every searched key must be a real trial key: try the ranges' ends at the cheapest and the target fidelity
    for end in ("low", "high"):
        params = {k: getattr(r, end) for k, r in spec.space.items()}
        for size, b in ((names[0], low), (names[-1], high)):
            try:
                study.trial_config(params, size, b)
            except ConfigError as err:
                raise ConfigError(f"{source}: key 'space': {str(err).split(': ', 1)[-1]}") from None
    return study
