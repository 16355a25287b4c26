"""Validation of the frontier statistics on synthetic sweeps whose truth is known.

A synthetic sweep is built the way a real one is measured, not from the fit's own assumptions:
every config has a true mean-pass-rate curve ``m(C)`` (a sigmoid in log C); the eval set has
``problems`` problems whose pass rates spread around it (``p_i(C) = clip(m(C) + h_i)``, one fixed
offset ``h_i`` per problem, shared by every config and seed: a fixed eval set); each seed of a
config moves its curve's midpoint by a log-normal factor (seed-to-seed variation of training);
and every evaluation draws ``samples`` completions per problem (binomial counts). The analysis
then sees only the counts, like a sweep's trials.

:func:`validate` repeats this and reports, for the primary metric (mean@k):

- **parameter recovery**: the fitted plateau ``A`` and midpoint ``C_mid`` against the truth, for
  the fits the analysis calls identified;
- **interval coverage**: how often the 90% band of the winner at ``C_max`` holds the winner's
  true value;
- **decisions**: how often the frontier's winner at ``C_max`` is the true best, how often it is
  called a tie when two configs are truly equal, and the decision hold-out's hit rate and value
  error (fit on ``C <= C_max / 4``, predict the winner at ``C_max``).

    isosweep validate-stats --repeats 20 --out dashboards/methods
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from isosweep.algo.estimators import best_at_k, mean_at_k, worst_at_k
from isosweep.report import frontier as F
from isosweep.report.analysis import analyse
from isosweep.report.planner import Planner, truncate
from isosweep.track.curves import Curve, SweepData

BUDGET = 100_000
COMPUTE = np.concatenate([[0.0], np.unique(np.round(np.geomspace(BUDGET / 64, BUDGET, 12)))])

# n* grows with C: small n rises early to a low plateau, large n late to a high one. True best at
# C_max = 1e5 is n8 (0.696 vs n16 0.676 vs n4 0.618); n4 leads below C ~ 1.6e4.
TRUTH = {
    "n4-Bp16": dict(R0=0.45, A=0.62, C_mid=4_000.0, B=2.0),
    "n8-Bp16": dict(R0=0.45, A=0.70, C_mid=15_000.0, B=2.0),
    "n16-Bp16": dict(R0=0.45, A=0.74, C_mid=60_000.0, B=2.0),
}


def true_value(params: dict, C: float | np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The true mean over problems of ``clip(m(C) + h_i, 0, 1)`` (what mean@k estimates)."""
    c = np.atleast_1d(np.asarray(C, dtype=float))
    m = np.where(c > 0, F.sigmoid(np.maximum(c, 1.0), **params), params["R0"])
    return np.clip(m[:, None] + offsets[None, :], 0.0, 1.0).mean(axis=1)


def synthetic_sweep(truth: dict[str, dict], rng: np.random.Generator, *, seeds: int = 2, problems: int = 512,
                    samples: int = 16, spread: float = 0.2, seed_sd: float = 0.15, k: int = 4,
                    compute: np.ndarray = COMPUTE) -> tuple[list[Curve], np.ndarray]:
    """Curves (with counts) of a sweep over ``truth``'s configs; returns them and the problems' offsets."""
    offsets = rng.uniform(-spread, spread, problems)
    offsets -= offsets.mean()
    curves = []
    for key, params in truth.items():
        n = int(key.split("-")[0][1:])
        for s in range(seeds):
            moved = {**params, "C_mid": params["C_mid"] * math.exp(rng.normal(0.0, seed_sd))}
            m = np.where(compute > 0, F.sigmoid(np.maximum(compute, 1.0), **moved), params["R0"])
            p = np.clip(m[:, None] + offsets[None, :], 0.0, 1.0)
            counts = rng.binomial(samples, p).astype(float)
            values = {f"mean@{k}": mean_at_k(counts, samples, k).mean(axis=1),
                      f"best@{k}": best_at_k(counts, samples, k).mean(axis=1),
                      f"worst@{k}": worst_at_k(counts, samples, k).mean(axis=1)}
            curves.append(Curve(key=f"{key}-s{s}", config=key,
                                fields={"n": n, "Bp": 16, "M": BUDGET // (16 * n), "seed": s},
                                compute=compute.copy(), values=values, counts=counts, samples=samples,
                                eval_set="synthetic"))
    return curves, offsets


@dataclass(frozen=True)
class Recovery:
    """An identified fit's plateau error (fitted minus true ``A``) and midpoint ratio (fitted over true ``C_mid``)."""

    config: str
    A_error: float
    C_mid_ratio: float


@dataclass(frozen=True)
class Repeat:
    """One synthetic sweep analysed: the frontier's winner at C_max against the true best, whether it was called a
    tie, its P(best), whether its 90% band holds its true value and its value error, the identified fits'
    recovery, and the decision hold-out's hit and value error (None: no decision to test)."""

    winner: str
    true_best: str
    correct: bool
    tie: bool
    p_best: float
    covered: bool
    value_error: float
    recovery: tuple[Recovery, ...]
    decision_hit: bool | None
    decision_error: float | None


def one_repeat(rng: np.random.Generator, bootstrap: int, truth: dict[str, dict] = TRUTH, **kwargs) -> Repeat:
    """One synthetic sweep analysed; what :func:`validate` aggregates."""
    curves, offsets = synthetic_sweep(truth, rng, **kwargs)
    result = analyse(curves, title="synthetic", study="isocompute", budget=BUDGET, primary="mean@4", points=6,
                     bootstrap=bootstrap, seed=int(rng.integers(2**31)))
    m = result.metrics["mean@4"]
    last = m.rows[-1]
    truths = {key: float(true_value(p, BUDGET, offsets)[0]) for key, p in truth.items()}
    best = max(truths, key=truths.get)
    recovery = tuple(Recovery(key, fit.params["A"] - truth[key]["A"], fit.params["C_mid"] / truth[key]["C_mid"])
                     for key, fit in m.fits.items() if not m.identified.get(key))
    d = m.decision
    return Repeat(last.config, best, last.config == best, last.tie, last.p_best,
                  bool(last.low <= truths[last.config] <= last.high), last.value - truths[last.config], recovery,
                  d.predicted_config == best if d.predicted_config else None,
                  (d.predicted_value - truths[d.predicted_config]) if d.predicted_config else None)


@dataclass(frozen=True)
class Validation:
    """What :func:`validate` found (``validation.json``): see the module docstring for each figure."""

    repeats: int
    bootstrap: int
    truth: dict[str, dict]
    winner_correct: float
    winner_correct_or_tie: float
    band_coverage_90: float
    value_error_median_abs: float
    equal_configs_called_tie: float
    identified_fits: int
    A_error_median_abs: float
    C_mid_ratio_median: float
    C_mid_within_2x: float
    decision_holdout_hit_rate: float
    decision_holdout_value_error_median_abs: float
    decision_holdout_possible: int
    planner: PlannerValidation | None = None

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "planner"}
        if self.planner is not None:
            out["planner"] = self.planner.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict) -> Validation:
        planner = data.get("planner")
        return cls(**{**data, "planner": PlannerValidation.from_json(planner) if planner else None})


def validate(repeats: int = 20, bootstrap: int = 100, seed: int = 0,
             log: Callable[[str], None] = print) -> Validation:
    """Repeat synthetic sweeps (:data:`TRUTH`, and a pair of truly equal configs) and summarise."""
    rng = np.random.default_rng(seed)
    main = []
    for i in range(repeats):
        main.append(one_repeat(rng, bootstrap))
        log(f"[validate-stats] repeat {i + 1}/{repeats}: winner {main[-1].winner} (p_best "
            f"{main[-1].p_best:.2f}), covered {main[-1].covered}")
    equal_truth = {"n4-Bp16": TRUTH["n8-Bp16"], "n8-Bp16": TRUTH["n8-Bp16"]}
    equal = [one_repeat(rng, bootstrap, equal_truth) for _ in range(repeats)]
    recovery = [r for rep in main for r in rep.recovery]
    hits = [r.decision_hit for r in main if r.decision_hit is not None]
    errors = [abs(r.decision_error) for r in main if r.decision_error is not None]
    return Validation(
        repeats=repeats, bootstrap=bootstrap, truth=TRUTH,
        winner_correct=float(np.mean([r.correct for r in main])),
        winner_correct_or_tie=float(np.mean([r.correct or r.tie for r in main])),
        band_coverage_90=float(np.mean([r.covered for r in main])),
        value_error_median_abs=float(np.median([abs(r.value_error) for r in main])),
        equal_configs_called_tie=float(np.mean([r.tie for r in equal])),
        identified_fits=len(recovery),
        A_error_median_abs=float(np.median([abs(r.A_error) for r in recovery])) if recovery else math.nan,
        C_mid_ratio_median=float(np.median([r.C_mid_ratio for r in recovery])) if recovery else math.nan,
        C_mid_within_2x=float(np.mean([0.5 <= r.C_mid_ratio <= 2.0 for r in recovery])) if recovery else math.nan,
        decision_holdout_hit_rate=float(np.mean(hits)) if hits else math.nan,
        decision_holdout_value_error_median_abs=float(np.median(errors)) if errors else math.nan,
        decision_holdout_possible=len(hits),
        planner=validate_planner(repeats, bootstrap, seed + 1, log),
    )


def write_report(summary: Validation, out: str | Path) -> Path:
    """``validation.json`` and ``validation.md`` under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "validation.json").write_text(json.dumps(summary.to_json(), indent=1))
    s = summary.to_json()
    lines = [
        "# Frontier statistics on synthetic sweeps with a known truth", "",
        f"{s['repeats']} synthetic iso-compute sweeps (3 configs whose best changes with C, 2 seeds each, 512 eval "
        f"problems x 16 samples, binomial counts, seed-to-seed midpoint spread 15%), analysed exactly as a real "
        f"sweep is ({s['bootstrap']} bootstrap replicates over seeds and paired problems). Regenerate with "
        "`isosweep validate-stats`.", "",
        "| check | result |", "| --- | --- |",
        f"| winner at C_max is the true best | {s['winner_correct']:.0%} |",
        f"| ... or the table calls it a tie | {s['winner_correct_or_tie']:.0%} |",
        f"| 90% band of the winner holds its true value | {s['band_coverage_90']:.0%} |",
        f"| median abs. error of the winner's value | {s['value_error_median_abs']:.4f} |",
        f"| two truly equal configs called a tie | {s['equal_configs_called_tie']:.0%} |",
        f"| identified fits: median abs. error of A | {s['A_error_median_abs']:.4f} ({s['identified_fits']} fits) |",
        f"| identified fits: median fitted/true C_mid (within 2x) | {s['C_mid_ratio_median']:.2f} "
        f"({s['C_mid_within_2x']:.0%}) |",
        f"| decision hold-out (fit on C <= C_max/4): true best predicted | {s['decision_holdout_hit_rate']:.0%} "
        f"of {s['decision_holdout_possible']} |",
        f"| decision hold-out: median abs. value error at C_max | {s['decision_holdout_value_error_median_abs']:.4f} |",
    ]
    if "planner" in s:
        p = s["planner"]
        lines += [
            "", "## The planner (`isosweep recommend`) at a budget it was not given", "",
            f"The same synthetic truth, {p['repeats']} repeats per scenario, each seed run as its own sweep "
            f"({p['bootstrap']} bootstrap replicates). *between*: seed 0 run to C_max/4, seed 1 to C_max, the "
            "planner asked at C_max/2 (pooling two budgets); *beyond*: both seeds run to C_max/4, asked at C_max "
            "(a 4x extrapolation). *Good*: the recommendation is the true best, or the true best's value lies "
            "within the recommendation's 90% interval.", "",
            "| scenario | C | true best recommended | good | 90% interval holds its true value | median / max regret |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for name in ("between", "beyond"):
            q = p[name]
            lines.append(f"| {name} | {q['C']:,.0f} | {q['correct']:.0%} | {q['good']:.0%} | {q['coverage_90']:.0%} | "
                         f"{q['regret_median']:.4f} / {q['regret_max']:.4f} |")
    (out / "validation.md").write_text("\n".join(lines) + "\n")
    return out / "validation.md"


# --------------------------------------------------------------------------------- the planner

SYNTHETIC_PARAMS = {"task.name": "synthetic", "task.levels": "[0]", "task.difficulty": "easy",
                    "model.name": "synthetic", "algorithm.lr_ref": "1e-05"}


def as_sweeps(curves: list[Curve], budgets: dict[int, int]) -> list[SweepData]:
    """The synthetic curves split by seed into one sweep per seed, seed ``s`` run at budget ``budgets[s]``."""
    out = []
    for seed, budget in budgets.items():
        mine = [c for c in curves if c.fields["seed"] == seed]
        out += truncate([SweepData(f"synthetic-{budget}-{seed}", BUDGET, dict(SYNTHETIC_PARAMS), {}, mine)], budget)
    return out


@dataclass(frozen=True)
class PlannerRepeat:
    """One synthetic sweep pair planned from (:func:`planner_repeat`): the recommendation at C against the true best,
    whether the true best's value lies in its interval, whether its interval holds its own true value, its regret,
    P(best), whether it was extrapolated, and how many warnings it carried."""

    scenario: str
    C: float
    recommended: str
    true_best: str
    correct: bool
    best_within_interval: bool
    covered: bool
    regret: float
    p_best: float
    extrapolated: bool
    warnings: int


def planner_repeat(rng: np.random.Generator, bootstrap: int, scenario: str,
                   truth: dict[str, dict] = TRUTH) -> PlannerRepeat:
    """One synthetic sweep pair planned from. ``between``: seed 0 run to C_max / 4 and seed 1 to C_max, asked at
    C_max / 2; ``beyond``: both seeds run to C_max / 4, asked at C_max (an extrapolation by 4x)."""
    curves, offsets = synthetic_sweep(truth, rng)
    if scenario == "between":
        sweeps, C = as_sweeps(curves, {0: BUDGET // 4, 1: BUDGET}), BUDGET / 2
    else:
        sweeps, C = as_sweeps(curves, {0: BUDGET // 4, 1: BUDGET // 4}), float(BUDGET)
    rec = Planner(sweeps, "mean", bootstrap=bootstrap, seed=int(rng.integers(2**31))).at(C)
    truths = {key: float(true_value(p, C, offsets)[0]) for key, p in truth.items()}
    best = max(truths, key=truths.get)
    return PlannerRepeat(scenario, C, rec.config, best, rec.config == best, bool(rec.low <= truths[best] <= rec.high),
                         bool(rec.low <= truths[rec.config] <= rec.high), truths[best] - truths[rec.config],
                         rec.p_best, rec.extrapolated, len(rec.warnings))


@dataclass(frozen=True)
class ScenarioSummary:
    """A planner scenario over its repeats: the C asked, the share that recommended the true best, the share that
    was good (that, or the true best's value inside the interval), the interval's coverage, the regret's median
    and largest."""

    C: float
    correct: float
    good: float
    coverage_90: float
    regret_median: float
    regret_max: float

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class PlannerValidation:
    """The planner on synthetic sweeps: each scenario's :class:`ScenarioSummary`."""

    repeats: int
    bootstrap: int
    between: ScenarioSummary
    beyond: ScenarioSummary

    def to_json(self) -> dict:
        return {"repeats": self.repeats, "bootstrap": self.bootstrap, "between": self.between.to_json(),
                "beyond": self.beyond.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> PlannerValidation:
        return cls(data["repeats"], data["bootstrap"], ScenarioSummary(**data["between"]),
                   ScenarioSummary(**data["beyond"]))


def validate_planner(repeats: int = 20, bootstrap: int = 100, seed: int = 1,
                     log: Callable[[str], None] = print) -> PlannerValidation:
    """The planner on synthetic sweeps (:data:`TRUTH`): for each scenario of :func:`planner_repeat`, how often the
    recommendation is the true best or the true best's value lies within the recommendation's 90% interval
    (``good``), how often its interval holds its own true value (coverage), and its median regret."""
    rng = np.random.default_rng(seed)
    summaries = {}
    for scenario in ("between", "beyond"):
        reps = []
        for i in range(repeats):
            reps.append(planner_repeat(rng, bootstrap, scenario))
            log(f"[validate-stats] planner {scenario} {i + 1}/{repeats}: {reps[-1].recommended} (true best "
                f"{reps[-1].true_best}), covered {reps[-1].covered}")
        summaries[scenario] = ScenarioSummary(
            reps[0].C, float(np.mean([r.correct for r in reps])),
            float(np.mean([r.correct or r.best_within_interval for r in reps])),
            float(np.mean([r.covered for r in reps])), float(np.median([r.regret for r in reps])),
            float(np.max([r.regret for r in reps])))
    return PlannerValidation(repeats, bootstrap, **summaries)
