"""What a replay hands on, as typed data: one study's record, the statistics over searcher seeds, a comparison.

Each is a frozen dataclass with ``to_json``/``from_json``; the plain JSON they write is what ``bench/hpo.json``
(:meth:`Comparison.to_json`) and ``<key>_runs.json`` (:meth:`Comparison.runs_json`) hold, key for key, so a file
read and written again is unchanged. The files carry no ``schema_version``: they are byte-for-byte the layout
written before these types existed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from isosweep.experiments.hpo_table import Signal

DRIVEN = ("jfhpo", "jfhpo-log", "bo-target")
"""The methods the JF-HPO driver runs: their records carry a ``proxy_verdict`` (None where no check ran)."""


@dataclass(frozen=True)
class ProxyVerdict:
    """What JF-HPO's proxy check found: Spearman ``rho`` (None: undefined) of ``pairs`` configurations run at
    the target against the GP's predicted ranking, the ``threshold`` it had to reach, and the verdict."""

    rho: float | None
    pairs: int
    threshold: float
    trusted: bool

    def to_json(self) -> dict[str, Any]:
        return {"rho": self.rho, "pairs": self.pairs, "threshold": self.threshold, "trusted": self.trusted}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProxyVerdict:
        return cls(rho=data["rho"], pairs=int(data["pairs"]), threshold=data["threshold"],
                   trusted=bool(data["trusted"]))


@dataclass(frozen=True)
class ReplayRecord:
    """One replayed study's outcome. Spends in full target trials (``1 + fixed`` each); ``regret`` of the final
    recommendation (None: it recommended nothing); ``compute_to_eps`` the spend at which the recommendation
    first came within eps of the best (None: never); ``trajectory`` the ``(spent, regret)`` after each trial,
    rounded to 4 and 5 decimals."""

    seed: int
    method: str
    recommended: str | None
    regret: float | None
    compute_to_eps: float | None
    spent: float
    trials: int
    promotions: int
    stops: int
    by_size: dict[str, int]
    trajectory: tuple[tuple[float, float | None], ...]
    proxy_verdict: ProxyVerdict | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seed": self.seed, "method": self.method, "recommended": self.recommended, "regret": self.regret,
            "compute_to_eps": self.compute_to_eps, "spent": self.spent, "trials": self.trials,
            "promotions": self.promotions, "stops": self.stops, "by_size": dict(self.by_size)}
        if self.method in DRIVEN:
            out["proxy_verdict"] = None if self.proxy_verdict is None else self.proxy_verdict.to_json()
        out["trajectory"] = [list(point) for point in self.trajectory]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayRecord:
        verdict = data.get("proxy_verdict")
        return cls(seed=int(data["seed"]), method=data["method"], recommended=data["recommended"],
                   regret=data["regret"], compute_to_eps=data["compute_to_eps"], spent=data["spent"],
                   trials=int(data["trials"]), promotions=int(data["promotions"]), stops=int(data["stops"]),
                   by_size=dict(data["by_size"]),
                   trajectory=tuple((spent, regret) for spent, regret in data["trajectory"]),
                   proxy_verdict=None if verdict is None else ProxyVerdict.from_json(verdict))


@dataclass(frozen=True)
class PairedTest:
    """A Wilcoxon signed-rank test of ``a - b`` paired by searcher seed: the median difference (None: none, or
    one that involves a never-reached seed), the p-value, and the pairs ``a`` won (lower), lost and tied."""

    median_diff: float | None
    p: float
    wins: int
    losses: int
    ties: int

    def to_json(self) -> dict[str, Any]:
        return {"median_diff": self.median_diff, "p": self.p, "wins": self.wins, "losses": self.losses,
                "ties": self.ties}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PairedTest:
        return cls(median_diff=data["median_diff"], p=data["p"], wins=int(data["wins"]), losses=int(data["losses"]),
                   ties=int(data["ties"]))


@dataclass(frozen=True)
class Pairing:
    """A JF-HPO method against one other method of the same study: on regret and on compute to eps."""

    regret: PairedTest
    compute_to_eps: PairedTest

    def to_json(self) -> dict[str, Any]:
        return {"regret": self.regret.to_json(), "compute_to_eps": self.compute_to_eps.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Pairing:
        return cls(PairedTest.from_json(data["regret"]), PairedTest.from_json(data["compute_to_eps"]))


@dataclass(frozen=True)
class MethodSummary:
    """One method over searcher seeds: medians with 95% bootstrap intervals (compute to eps None: never),
    counts as ``"k/n"`` strings, means of the trial counts; ``proxies_trusted`` for the driven methods whose
    check ran; ``versus``: a JF-HPO method paired against each other method (key: that method), written as
    ``vs_<method>`` keys."""

    regret_median: float
    regret_ci95: tuple[float, float]
    regret_mean: float
    zero_regret: str
    compute_to_eps_median: float | None
    compute_to_eps_ci95: tuple[float | None, float | None]
    reached_eps: str
    trials_mean: float
    promotions_mean: float
    stops_mean: float
    by_size_mean: dict[str, float]
    proxies_trusted: str | None = None
    versus: dict[str, Pairing] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "regret_median": self.regret_median, "regret_ci95": list(self.regret_ci95),
            "regret_mean": self.regret_mean, "zero_regret": self.zero_regret,
            "compute_to_eps_median": self.compute_to_eps_median,
            "compute_to_eps_ci95": list(self.compute_to_eps_ci95), "reached_eps": self.reached_eps,
            "trials_mean": self.trials_mean, "promotions_mean": self.promotions_mean, "stops_mean": self.stops_mean,
            "by_size_mean": dict(self.by_size_mean)}
        if self.proxies_trusted is not None:
            out["proxies_trusted"] = self.proxies_trusted
        out.update({f"vs_{method}": pairing.to_json() for method, pairing in self.versus.items()})
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MethodSummary:
        low, high = data["regret_ci95"]
        c_low, c_high = data["compute_to_eps_ci95"]
        return cls(regret_median=data["regret_median"], regret_ci95=(low, high), regret_mean=data["regret_mean"],
                   zero_regret=data["zero_regret"], compute_to_eps_median=data["compute_to_eps_median"],
                   compute_to_eps_ci95=(c_low, c_high), reached_eps=data["reached_eps"],
                   trials_mean=data["trials_mean"], promotions_mean=data["promotions_mean"],
                   stops_mean=data["stops_mean"], by_size_mean=dict(data["by_size_mean"]),
                   proxies_trusted=data.get("proxies_trusted"),
                   versus={key.removeprefix("vs_"): Pairing.from_json(value) for key, value in data.items()
                           if key.startswith("vs_")})


@dataclass(frozen=True)
class StudyResult:
    """One study setting of a comparison (``variant`` ``table`` or ``shuffled``, at ``study_budget`` full target
    trials): the summary per method and every searcher seed's record per method (``runs``: not in the summary
    file; ``<key>_runs.json`` holds them)."""

    study_budget: float
    variant: str
    summary: dict[str, MethodSummary]
    runs: dict[str, tuple[ReplayRecord, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The summary as ``bench/hpo.json`` holds it (the runs left out)."""
        return {"study_budget": self.study_budget, "variant": self.variant,
                "summary": {method: row.to_json() for method, row in self.summary.items()}}

    def runs_json(self) -> dict[str, list[dict[str, Any]]]:
        return {method: [record.to_json() for record in records] for method, records in self.runs.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any], runs: dict[str, list[dict[str, Any]]] | None = None) -> StudyResult:
        return cls(study_budget=data["study_budget"], variant=data["variant"],
                   summary={method: MethodSummary.from_json(row) for method, row in data["summary"].items()},
                   runs={method: tuple(ReplayRecord.from_json(r) for r in records)
                         for method, records in (runs or {}).items()})


@dataclass(frozen=True)
class Comparison:
    """Every method on one table: the table's facts (``sizes``: parameters per size; ``points``: its evaluation
    budgets; ``true_values`` per configuration key and the ``best``; ``best_configs`` within ``eps`` of it),
    the settings (``fixed`` cost per trial, ``eps``, ``seeds``: searcher seeds per method, ``collapse``), and
    the studies by name (``table@4x``, ``shuffled@4x``). ``wall_ratios`` and ``signal`` (the table's signal
    check, :func:`isosweep.experiments.hpo_table.check_signal`) are None until a replay run adds them."""

    table: str
    target: str
    sizes: dict[str, int]
    budget: int
    points: tuple[int, ...]
    fixed: float
    eps: float
    seeds: int
    collapse: float | None
    eval_variance: float
    true_values: dict[str, float]
    best: float
    best_configs: tuple[str, ...]
    studies: dict[str, StudyResult]
    wall_ratios: dict[str, float] | None = None
    signal: Signal | None = None

    def to_json(self) -> dict[str, Any]:
        """The summary as ``bench/hpo.json`` holds it under the replay's key (the runs left out)."""
        out: dict[str, Any] = {
            "table": self.table, "target": self.target, "sizes": dict(self.sizes), "budget": self.budget,
            "points": list(self.points), "fixed": self.fixed, "eps": self.eps, "seeds": self.seeds,
            "collapse": self.collapse, "eval_variance": self.eval_variance, "true_values": dict(self.true_values),
            "best": self.best, "best_configs": list(self.best_configs),
            "studies": {name: study.to_json() for name, study in self.studies.items()}}
        if self.wall_ratios is not None:
            out["wall_ratios"] = dict(self.wall_ratios)
        if self.signal is not None:
            out["signal"] = self.signal.to_json()
        return out

    def runs_json(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        """Every study's records, as ``<key>_runs.json`` holds them."""
        return {name: study.runs_json() for name, study in self.studies.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any], runs: dict[str, Any] | None = None) -> Comparison:
        """The summary ``data`` (:meth:`to_json`) with the records of ``runs`` (:meth:`runs_json`), when given."""
        return cls(table=data["table"], target=data["target"], sizes=dict(data["sizes"]), budget=int(data["budget"]),
                   points=tuple(data["points"]), fixed=data["fixed"], eps=data["eps"], seeds=int(data["seeds"]),
                   collapse=data["collapse"], eval_variance=data["eval_variance"],
                   true_values=dict(data["true_values"]), best=data["best"], best_configs=tuple(data["best_configs"]),
                   studies={name: StudyResult.from_json(study, (runs or {}).get(name))
                            for name, study in data["studies"].items()},
                   wall_ratios=data.get("wall_ratios"),
                   signal=None if data.get("signal") is None else Signal.from_json(data["signal"]))
