"""Sweep definitions: ``sweeps/<study>.yaml`` -> a validated ``SweepSpec`` -> one trial config per grid point.

A sweep file names a base trial YAML and the grid to run over it at one budget C (rollouts per
trial). Two studies:

- ``isocompute``: every (n, Bp) pair of ``grid.n`` x ``grid.Bp``; each trial runs
  ``M = C // (Bp * n)`` steps, so all of them spend the same compute.
- ``fixed-batch``: ``grid.batch`` rollouts per step, split as ``Bp = batch / n`` for each
  ``n`` in ``grid.n`` (the n vs Bp trade-off at a fixed hardware batch).

Because every trial evaluates along the way, one trial run to C traces its curve for every
smaller budget: the grid is over allocations, and compute is read off the curves.

A bad file stops before any trial starts, with the file, the key and what is allowed; so does
a budget too small for one step of some grid point (naming the point).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from isosweep.models.sizes import SIZES, warmup_version_in_ids
from isosweep.spec.trial import TrialConfig, rollout_precision
from isosweep.spec.values import parse_budget, short_count, slug
from isosweep.spec.yamlio import ConfigError, Section, merge, parse_overrides, read_yaml, validate


class GridSpec(Section):
    """The allocations a study compares."""

    n: tuple[int, ...] = Field(min_length=1)
    """Rollouts per problem."""
    Bp: tuple[int, ...] | None = Field(None, min_length=1)
    """Problems per step (``isocompute`` only)."""
    batch: int | None = Field(None, gt=0)
    """Rollouts per step B = Bp * n, fixed (``fixed-batch`` only)."""

    @field_validator("n", "Bp")
    @classmethod
    def _distinct_positive(cls, values: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if values is None:
            return values
        if any(v <= 0 for v in values):
            raise ValueError(f"values must be > 0 (got {list(values)})")
        if len(set(values)) != len(values):
            raise ValueError(f"values must be distinct (got {list(values)})")
        return values


class FrontierSpec(Section):
    """How the frontier is fitted and tabulated at the end of the sweep."""

    metric: Literal["mean", "best", "worst"] = "mean"
    """The eval metric whose frontier the table shows: ``mean@k``, ``best@k`` or ``worst@k`` (k
    from the trial's ``eval.k``). All three are fitted and plotted."""
    points: int = Field(8, ge=2)
    """Rows of the frontier table: compute values log-spaced from the first eval to C."""
    bootstrap: int = Field(200, ge=0)
    """Bootstrap refits per config for the confidence intervals (0: none)."""


class AdaptiveSpec(Section):
    """An adaptive sweep: configurations advance through budget rungs, and at each rung those that cannot be on
    the frontier anywhere above it are stopped (:mod:`isosweep.report.adaptive`). Stopped trials keep their
    checkpoints, so the same file run without ``adaptive`` resumes them."""

    rungs: tuple[float, ...] = (64, 16, 4)
    """The rungs as divisors of C: C/64, C/16, C/4 (then C itself, where every trial left ends)."""
    method: Literal["frontier", "asha"] = "frontier"
    """``frontier``: stop a configuration only when, with ``confidence``, its fitted band stays below another's from
    the rung to C (it cannot be on the frontier there); ``asha``: keep the best 1/eta by their running best at each
    rung (rank at one fidelity: replayed on this project's studies it lost the frontier in most of them)."""
    confidence: float = Field(0.9, ge=0.5, lt=1)
    """The frontier rule's band: the central ``confidence`` of its bootstrap refits."""
    bootstrap: int = Field(100, ge=10)
    """Refits per configuration behind each decision's bands."""

    @field_validator("rungs")
    @classmethod
    def _decreasing_divisors(cls, rungs: tuple[float, ...]) -> tuple[float, ...]:
        if not rungs or any(r <= 1 for r in rungs) or list(rungs) != sorted(set(rungs), reverse=True):
            raise ValueError(f"rungs {list(rungs)}: decreasing divisors of C, each > 1 (e.g. [64, 16, 4])")
        return rungs


class EstimateSpec(Section):
    """What ``--dry-run`` needs to estimate GPU-hours: the model's size and how fast the hardware runs it.

    FLOPs per rollout are taken as ``12 * params * tokens_per_rollout``: generation (2), the
    trainer's and the reference model's log-prob passes (2 + 2) and the training step (6).
    """

    params: float = Field(gt=0)
    """Parameters of the policy."""
    tokens_per_rollout: float = Field(gt=0)
    """Prompt + completion tokens of an average rollout."""
    prompt_tokens: int = Field(256, gt=0)
    """Longest prompt in tokens, chat template included: the memory plan pads every sequence of a micro-batch
    to this plus ``rollout.max_new_tokens`` (a sweep without an ``estimate`` section is planned at the default)."""
    flops_per_gpu: float = Field(9.89e14, gt=0)
    """Peak dense bf16 FLOP/s of one GPU (H200: 9.89e14)."""
    utilisation: float = Field(0.25, gt=0, le=1)
    """Share of the peak a trial achieves on average."""


class SweepSpec(Section):
    """One study: a base trial, a grid over it and the budget every trial gets."""

    name: str
    """Identifies the study (lower case, digits and dashes); the sweep id starts with it."""
    description: str = ""
    """One line on what the study compares, for people reading the file and its MLflow parent run."""
    study: Literal["isocompute", "fixed-batch"]
    """``isocompute``: grid.n x grid.Bp at budget C; ``fixed-batch``: Bp = grid.batch / n for each n."""
    trial: str
    """The base trial YAML, relative to the sweep file."""
    budget: int = Field(gt=0)
    """C, rollouts per trial (``make sweep BUDGET=...`` overrides it)."""
    grid: GridSpec
    seeds: tuple[int, ...] = Field((0,), min_length=1)
    """Each grid point runs once per seed."""
    set: dict[str, Any] = {}
    """Trial keys set for every grid point (dotted, as with ``isosweep trial --set``)."""
    frontier: FrontierSpec = FrontierSpec()
    estimate: EstimateSpec | None = None
    """Optional cost model for ``--dry-run`` on GPU profiles."""
    adaptive: AdaptiveSpec | None = None
    """Run adaptively (``isosweep sweep --adaptive`` turns it on with the defaults): stop configurations at budget
    rungs where they cannot reach the frontier. Not part of the sweep's id: the same trials, fewer of them run to C."""

    _slug = field_validator("name")(classmethod(lambda cls, name: slug(name)))

    @model_validator(mode="after")
    def _grid_fits_study(self) -> SweepSpec:
        g = self.grid
        if self.study == "isocompute":
            if g.Bp is None or g.batch is not None:
                raise ValueError("study 'isocompute' needs grid.n and grid.Bp (and no grid.batch)")
        else:
            if g.batch is None or g.Bp is not None:
                raise ValueError("study 'fixed-batch' needs grid.n and grid.batch (and no grid.Bp: it is batch / n)")
            uneven = [n for n in g.n if g.batch % n]
            if uneven:
                raise ValueError(f"grid.batch = {g.batch} is not a multiple of n = {uneven}; "
                                 "allowed: n values that divide grid.batch")
        return self


@dataclass(frozen=True)
class TrialPoint:
    """One trial of a sweep: its key (``n8-Bp16``, ``-s1`` for seeds after the first) and config."""

    key: str
    cfg: TrialConfig

    @property
    def fields(self) -> dict[str, int]:
        """What distinguishes this trial's allocation (the frontier's config columns)."""
        return {"n": self.cfg.n, "Bp": self.cfg.Bp, "M": self.cfg.budget // (self.cfg.Bp * self.cfg.n),
                "seed": self.cfg.seed}

    @property
    def config_key(self) -> str:
        """The allocation without the seed: seeds of one config share one fitted curve."""
        return f"n{self.cfg.n}-Bp{self.cfg.Bp}"


ADDED_LATER = {"task": {"dataset_config": None, "train_split": "train", "eval_split": None,
                        "columns": {"prompt": "prompt", "answer": "answer"}, "prompt_format": "auto"},
               "eval": {"checkpoint_every": 100, "temperature": None, "watch": []},
               "algorithm": {"width_ref": None, "width_scaling": "all", "lr_warmup": 0.0},
               "trainer": {"micro_batch": None, "gradient_checkpointing": False, "logprob_chunk": 1024,
                           "param_persistence_threshold": None}}
"""Trial keys added after sweeps were first run, with their defaults: left out of a sweep's id while at their
default, so a sweep file keeps its id -- and a rerun resumes it -- across versions of isosweep."""


NOT_IN_ID = {"trainer": ("launcher",)}
"""Trial keys that never change what a trial computes (how it is launched), left out of a sweep's id whatever their
value: a sweep resumed with another launcher is the same sweep."""


def id_dump(cfg: TrialConfig) -> dict:
    """A trial config as its sweep's id hashes it: every key, less the :data:`ADDED_LATER` ones at their default and
    the :data:`NOT_IN_ID` ones; for a tiny model, the warm-up version that builds it when past the first (a rerun
    of a sweep whose trials ran on another build of the base model is a new sweep, not a resumption)."""
    data = cfg.model_dump(mode="json")
    data["rollout"]["precision"] = rollout_precision(cfg)  # unset means the profile's: the id holds what runs
    version = warmup_version_in_ids()
    if cfg.model.name in SIZES and version:
        data["model"]["warmup_version"] = version
    for section, keys in NOT_IN_ID.items():
        for key in keys:
            del data[section][key]
    for section, keys in ADDED_LATER.items():
        for key, default in keys.items():
            if data[section].get(key) == default:
                del data[section][key]
    return data


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep: the spec, where it came from, the budget it runs at and its trials."""

    spec: SweepSpec
    path: Path
    budget: int
    trials: tuple[TrialPoint, ...]

    @property
    def sweep_id(self) -> str:
        """``<name>-<budget>-<hash>``: the same file at the same budget always gets the same id
        (which is what lets a re-run resume it), a changed grid or trial config a new one."""
        digest = hashlib.sha256(json.dumps([id_dump(t.cfg) for t in self.trials], sort_keys=True).encode()).hexdigest()[:6]
        return f"{self.spec.name}-{short_count(self.budget)}-{digest}"

    @property
    def k(self) -> int:
        return self.trials[0].cfg.eval.k

    @property
    def metric(self) -> str:
        """The MLflow / records key of the frontier metric, e.g. ``eval/mean@4``."""
        return f"eval/{self.spec.frontier.metric}@{self.k}"


def load_sweep(path: str | Path, budget: int | str | float | None = None) -> Sweep:
    """Load and validate ``path``; ``budget`` (e.g. from ``BUDGET=``) replaces the file's C.

    Every grid point is built and validated as a trial config here, so a budget too small for
    some point, or a bad key in ``set``, stops the sweep before anything runs.
    """
    path = Path(path)
    spec: SweepSpec = validate(SweepSpec, read_yaml(path), str(path))
    C = spec.budget if budget is None else parse_budget(budget)
    trial_path = (path.parent / spec.trial).resolve()
    base = read_yaml(trial_path) if trial_path.exists() else None
    if base is None:
        raise ConfigError(f"{path}: key 'trial': no such file {spec.trial!r} (looked for {trial_path})")
    overrides = parse_overrides([f"{key}={json.dumps(value) if not isinstance(value, str) else value}"
                                 for key, value in spec.set.items()])
    g = spec.grid
    pairs = ([(n, Bp) for n in g.n for Bp in g.Bp] if spec.study == "isocompute"
             else [(n, g.batch // n) for n in g.n])
    trials = []
    for seed_index, seed in enumerate(spec.seeds):
        for n, Bp in pairs:
            key = f"n{n}-Bp{Bp}" + (f"-s{seed}" if seed_index else "")
            data = merge(merge(base, overrides), {"budget": C, "n": n, "Bp": Bp, "seed": seed})
            cfg = validate(TrialConfig, data, f"{path}: grid point {key} (trial {spec.trial}, budget {C})")
            trials.append(TrialPoint(key, cfg))
    ks = {t.cfg.eval.k for t in trials}
    if len(ks) > 1:
        raise ConfigError(f"{path}: key 'set': every trial must use one eval.k (got {sorted(ks)})")
    return Sweep(spec=spec, path=path, budget=C, trials=tuple(trials))
