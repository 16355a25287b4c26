"""A sweep's saved frontier analysis (``fits.json``) as typed data, and the one place older versions are read.

:class:`SavedAnalysis` is what :meth:`isosweep.report.analysis.Analysis.saved` keeps of an analysis (everything
but the live fits and the curves) and what the study report, ``isosweep recommend`` and the rendering read
back. Each part is a frozen dataclass with ``to_json``/``from_json``; plain JSON exists only at the file
boundary (:func:`read_analysis`, :meth:`SavedAnalysis.to_json`).

Versions (``schema_version``; :data:`SCHEMA_VERSION` is written):

- **1** (no ``schema_version`` key): frontier rows may lack ``n_tie`` (read as the row's ``tie``, the stricter
  reading: n* tied whenever the winner ties with its runner-up) and the file may lack ``eval``.
- **2**: every row has ``n_tie``; ``eval`` is always present (``{}`` when no trial saved counts). ``zero_signal``
  (:class:`ZeroSignalSummary`) is present only where a trial logged the step-0 zero-signal check: a file without
  it, whenever written, reads as None and is written back unchanged, so it needs no new version.

A file of the earlier fitting method (no ``seeds``, or a metric without ``n_trend``), or of a version newer
than this isosweep, is refused with a :class:`SchemaError` that says what to do. :func:`upgrade_folder`
rewrites every ``fits.json`` under a folder to the current version (``isosweep report --upgrade``); a second
run leaves every byte as it is.

Numbers: NaN (no value) is ``null`` in the file and ``nan`` in memory, so a file read and written again is
unchanged.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 2
"""The version of ``fits.json`` this isosweep writes."""


class SchemaError(ValueError):
    """A saved analysis this isosweep cannot read (another method, a newer version); the message says why and
    what to do."""


def _out(value: float | None) -> float | None:
    """A float as the file holds it: NaN as ``null``."""
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _in(value: float | None) -> float:
    """A float as memory holds it: ``null`` as NaN."""
    return math.nan if value is None else float(value)


def _opt(value: float | None) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class FrontierRow:
    """One compute of a frontier table: the winner at ``C`` (``config`` None: no config has a fit reaching C),
    its fitted value with its 90% band, P(best), the closest challenger and the lead over it with its 90%
    interval, whether they tie, n*'s 90% set (the n that win at least 5% of the replicates) and whether n* is
    tied, the winner's allocation, the observed best there (seed mean of the running best) and whether the
    winner's fit is identified."""

    C: float
    config: str | None = None
    value: float = math.nan
    low: float = math.nan
    high: float = math.nan
    p_best: float = math.nan
    runner_up: str | None = None
    lead: float = math.nan
    lead_low: float = math.nan
    lead_high: float = math.nan
    tie: bool = False
    n_range: tuple[int, ...] = ()
    n_tie: bool = False
    n: int | None = None
    Bp: int | None = None
    M: int | None = None
    observed_config: str | None = None
    observed_value: float | None = None
    identified: bool = False

    def to_json(self) -> dict:
        out = {"C": self.C, "config": self.config, "value": _out(self.value), "low": _out(self.low),
               "high": _out(self.high), "p_best": _out(self.p_best), "runner_up": self.runner_up,
               "lead": _out(self.lead), "lead_low": _out(self.lead_low), "lead_high": _out(self.lead_high),
               "tie": self.tie, "n_range": list(self.n_range), "n_tie": self.n_tie}
        out.update({k: v for k, v in (("n", self.n), ("Bp", self.Bp), ("M", self.M)) if v is not None})
        out.update(observed_config=self.observed_config, observed_value=_out(self.observed_value),
                   identified=self.identified)
        return out

    @classmethod
    def from_json(cls, data: dict) -> FrontierRow:
        return cls(C=float(data["C"]), config=data["config"], value=_in(data["value"]), low=_in(data["low"]),
                   high=_in(data["high"]), p_best=_in(data["p_best"]), runner_up=data["runner_up"],
                   lead=_in(data["lead"]), lead_low=_in(data["lead_low"]), lead_high=_in(data["lead_high"]),
                   tie=bool(data["tie"]), n_range=tuple(data["n_range"]), n_tie=bool(data["n_tie"]),
                   n=data.get("n"), Bp=data.get("Bp"), M=data.get("M"), observed_config=data["observed_config"],
                   observed_value=_opt(data["observed_value"]), identified=bool(data["identified"]))


@dataclass(frozen=True)
class ConfigHoldout:
    """One config's fit on ``C <= C_max / 4`` only, its value at ``C_max`` (``predicted``) against the mean over
    seeds of the running best there (``observed``, None when no seed reached C_max); ``reason``: why there is no
    prediction (None when there is one)."""

    predicted: float | None
    observed: float | None
    abs_error: float | None
    n_fit_points: int
    reason: str | None

    def to_json(self) -> dict:
        return {"predicted": self.predicted, "observed": self.observed, "abs_error": self.abs_error,
                "n_fit_points": self.n_fit_points, "reason": self.reason}

    @classmethod
    def from_json(cls, data: dict) -> ConfigHoldout:
        return cls(_opt(data["predicted"]), _opt(data["observed"]), _opt(data["abs_error"]), int(data["n_fit_points"]),
                   data["reason"])


@dataclass(frozen=True)
class DecisionHoldout:
    """Every config fitted on ``C <= fit_window`` only: the winner predicted at ``C_max`` and its value, against
    the observed best there; ``hit`` None (and ``reason`` set) when there is no decision to test."""

    C_max: float
    fit_window: float
    predicted_config: str | None = None
    observed_config: str | None = None
    hit: bool | None = None
    predicted_value: float | None = None
    observed_value: float | None = None
    abs_error: float | None = None
    reason: str | None = None

    def to_json(self) -> dict:
        return {"C_max": self.C_max, "fit_window": self.fit_window, "predicted_config": self.predicted_config,
                "observed_config": self.observed_config, "hit": self.hit, "predicted_value": self.predicted_value,
                "observed_value": self.observed_value, "abs_error": self.abs_error, "reason": self.reason}

    @classmethod
    def from_json(cls, data: dict) -> DecisionHoldout:
        return cls(float(data["C_max"]), float(data["fit_window"]), data["predicted_config"], data["observed_config"],
                   data["hit"], _opt(data["predicted_value"]), _opt(data["observed_value"]), _opt(data["abs_error"]),
                   data["reason"])


@dataclass(frozen=True)
class NTrend:
    """How the fitted value moves as n doubles at a fixed Bp, at compute ``C``: the slope with its 90% interval
    over the replicates, ``grows``/``falls`` only when that interval excludes 0 (else ``tie``), and the n that
    had a fit there."""

    C: float
    slope_per_doubling: float
    low: float
    high: float
    direction: str
    n: tuple[int, ...]

    def to_json(self) -> dict:
        return {"C": self.C, "slope_per_doubling": self.slope_per_doubling, "low": _out(self.low),
                "high": _out(self.high), "direction": self.direction, "n": list(self.n)}

    @classmethod
    def from_json(cls, data: dict) -> NTrend | None:
        if not data:
            return None
        return cls(float(data["C"]), float(data["slope_per_doubling"]), _in(data["low"]), _in(data["high"]),
                   data["direction"], tuple(data["n"]))


@dataclass(frozen=True)
class SavedFit:
    """One config's sigmoid: its parameters, their 90% intervals over the bootstrap refits, the points fitted,
    whether the optimiser converged, the number of refits, and why it is not identified (empty: identified)."""

    params: dict[str, float]
    ci90: dict[str, tuple[float, float]]
    points: int
    converged: bool
    bootstrap_refits: int
    not_identified: tuple[str, ...]

    def to_json(self) -> dict:
        return {"params": self.params, "ci90": {k: [_out(lo), _out(hi)] for k, (lo, hi) in self.ci90.items()},
                "points": self.points, "converged": self.converged, "bootstrap_refits": self.bootstrap_refits,
                "not_identified": list(self.not_identified)}

    @classmethod
    def from_json(cls, data: dict) -> SavedFit:
        return cls(dict(data["params"]), {k: (_in(lo), _in(hi)) for k, (lo, hi) in data["ci90"].items()},
                   int(data["points"]), bool(data["converged"]), int(data["bootstrap_refits"]),
                   tuple(data["not_identified"]))


@dataclass(frozen=True)
class Points:
    """The points a config's fit went through: each seed's running best at every evaluation with C > 0."""

    compute: tuple[float, ...]
    value: tuple[float, ...]

    def to_json(self) -> dict:
        return {"compute": list(self.compute), "value": list(self.value)}

    @classmethod
    def from_json(cls, data: dict) -> Points:
        return cls(tuple(data["compute"]), tuple(data["value"]))


@dataclass(frozen=True)
class SavedMetric:
    """One metric's analysis: fits, configs without one (and why), the base model's value, the fitted points, the
    frontier table, the saturation point (None: not shown; NaN: no fits), the allocation verdict, the hold-outs,
    the bootstrap replicates behind the intervals, and the n trend (None: no C where two n of one Bp fit)."""

    fits: dict[str, SavedFit]
    unfitted: dict[str, str]
    base: float | None
    records: dict[str, Points]
    frontier: tuple[FrontierRow, ...]
    saturation_C: float | None
    verdict: str
    holdout: dict[str, ConfigHoldout]
    decision_holdout: DecisionHoldout
    bootstrap_replicates: int
    n_trend: NTrend | None

    @property
    def winners(self) -> list[FrontierRow]:
        """The rows with a winner."""
        return [r for r in self.frontier if r.config]

    @property
    def saturates(self) -> bool:
        return self.saturation_C is not None and not math.isnan(self.saturation_C)

    def to_json(self) -> dict:
        return {"fits": {k: f.to_json() for k, f in self.fits.items()}, "unfitted": self.unfitted, "base": self.base,
                "records": {k: p.to_json() for k, p in self.records.items()},
                "frontier": [r.to_json() for r in self.frontier], "saturation_C": _out(self.saturation_C),
                "verdict": self.verdict, "holdout": {k: h.to_json() for k, h in self.holdout.items()},
                "decision_holdout": self.decision_holdout.to_json(), "bootstrap_replicates": self.bootstrap_replicates,
                "n_trend": self.n_trend.to_json() if self.n_trend else {}}

    @classmethod
    def from_json(cls, data: dict) -> SavedMetric:
        saturation = data["saturation_C"]
        return cls({k: SavedFit.from_json(f) for k, f in data["fits"].items()}, dict(data["unfitted"]),
                   _opt(data["base"]), {k: Points.from_json(p) for k, p in data["records"].items()},
                   tuple(FrontierRow.from_json(r) for r in data["frontier"]),
                   None if saturation is None else float(saturation), data["verdict"],
                   {k: ConfigHoldout.from_json(h) for k, h in data["holdout"].items()},
                   DecisionHoldout.from_json(data["decision_holdout"]), int(data["bootstrap_replicates"]),
                   NTrend.from_json(data["n_trend"]))


@dataclass(frozen=True)
class Gain:
    """A metric's base value (the evaluations at compute 0), its best observed by C_max, and the difference."""

    base: float
    best: float
    gain: float

    def to_json(self) -> dict:
        return {"base": self.base, "best": self.best, "gain": self.gain}

    @classmethod
    def from_json(cls, data: dict) -> Gain:
        return cls(float(data["base"]), float(data["best"]), float(data["gain"]))


@dataclass(frozen=True)
class EvalNoise:
    """The eval set behind the curves (problems x samples; None when the trials' sets differ in size) and one
    evaluation's standard error of mean@k from sampling alone: median and largest over ``evaluations``."""

    problems: int | None
    samples: int | None
    se_median: float
    se_max: float
    evaluations: int

    def to_json(self) -> dict:
        return {"problems": self.problems, "samples": self.samples, "sampling_se_mean": {
            "median": self.se_median, "max": self.se_max, "evaluations": self.evaluations}}

    @classmethod
    def from_json(cls, data: dict) -> EvalNoise | None:
        if not data:
            return None
        se = data["sampling_se_mean"]
        return cls(data["problems"], data["samples"], float(se["median"]), float(se["max"]), int(se["evaluations"]))


@dataclass(frozen=True)
class ZeroSignalSummary:
    """The step-0 zero-signal check over a study's trials (:func:`isosweep.report.analysis.zero_signal_summary`):
    how many trials logged it, the mean over them of the observed fraction of GRPO groups without signal and of
    the fraction the base model's probe predicts, the z-score of their pooled difference
    ``sum(observed - expected) / sqrt(sum sd^2)`` (NaN when every sd is 0), and whether it disagrees beyond noise
    (``flagged``: :data:`isosweep.report.analysis.ZERO_SIGNAL_Z`)."""

    trials: int
    observed: float
    expected: float
    z: float
    flagged: bool

    def to_json(self) -> dict:
        return {"trials": self.trials, "observed": self.observed, "expected": self.expected, "z": _out(self.z),
                "flagged": self.flagged}

    @classmethod
    def from_json(cls, data: dict | None) -> ZeroSignalSummary | None:
        if not data:
            return None
        return cls(int(data["trials"]), float(data["observed"]), float(data["expected"]), _in(data["z"]),
                   bool(data["flagged"]))


@dataclass(frozen=True)
class SavedAnalysis:
    """A sweep's (or a pooled study's) frontier analysis as ``fits.json`` keeps it; ``title`` is the sweep id (the
    first part's for a pooled study, whose parts are ``pooled_from``)."""

    title: str
    study: str
    budget: int
    primary: str
    difficulty: str
    seeds: tuple[int, ...]
    trials: int
    configs: dict[str, dict[str, int]]
    """config -> its allocation: ``n``, ``Bp`` and ``M``."""
    gains: dict[str, Gain]
    noise: str
    eval: EvalNoise | None
    metrics: dict[str, SavedMetric]
    pooled_from: tuple[str, ...] = ()
    zero_signal: ZeroSignalSummary | None = None
    """The step-0 zero-signal check over the trials that logged it (None: none did)."""
    schema_version: int = field(default=SCHEMA_VERSION, compare=False)

    @property
    def sweeps(self) -> tuple[str, ...]:
        """The ids of the sweeps analysed: the pooled parts, else the one sweep."""
        return self.pooled_from or (self.title,)

    def metric(self, family: str) -> tuple[str, SavedMetric] | None:
        """The ``(name, analysis)`` of ``mean``/``best``/``worst`` at this study's k, if present."""
        return next(((name, m) for name, m in self.metrics.items() if name.split("@")[0] == family), None)

    def to_json(self) -> dict:
        out = {"schema_version": SCHEMA_VERSION, "title": self.title, "study": self.study, "budget": self.budget,
               "primary": self.primary, "difficulty": self.difficulty, "seeds": list(self.seeds),
               "trials": self.trials, "configs": self.configs, "gains": {k: g.to_json() for k, g in self.gains.items()},
               "noise": self.noise, "eval": self.eval.to_json() if self.eval else {}}
        if self.zero_signal is not None:  # absent, not null: files of trials without the check stay as they were
            out["zero_signal"] = self.zero_signal.to_json()
        out["metrics"] = {k: m.to_json() for k, m in self.metrics.items()}
        if self.pooled_from:
            out["pooled_from"] = list(self.pooled_from)
        return out

    def dumps(self) -> str:
        """The file's text."""
        return json.dumps(self.to_json(), indent=1)

    @classmethod
    def from_json(cls, data: dict, where: str = "a saved analysis") -> SavedAnalysis:
        """Read ``data`` of any version this isosweep knows (:func:`upgrade`)."""
        data = upgrade(data, where)
        return cls(data["title"], data["study"], int(data["budget"]), data["primary"], data["difficulty"],
                   tuple(data["seeds"]), int(data["trials"]), data["configs"],
                   {k: Gain.from_json(g) for k, g in data["gains"].items()}, data["noise"],
                   EvalNoise.from_json(data["eval"]), {k: SavedMetric.from_json(m) for k, m in data["metrics"].items()},
                   tuple(data.get("pooled_from", ())), ZeroSignalSummary.from_json(data.get("zero_signal")),
                   data["schema_version"])


def upgrade(data: dict, where: str = "a saved analysis") -> dict:
    """``data`` (a ``fits.json`` of any known version) as the current version holds it; raises
    :class:`SchemaError` for another method or a newer version. The only place an older format is read."""
    version = data.get("schema_version", 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise SchemaError(f"{where}: schema_version {version!r} is newer than this isosweep reads (up to "
                          f"{SCHEMA_VERSION}): upgrade isosweep")
    if "seeds" not in data or not all("n_trend" in m for m in data.get("metrics", {}).values()):
        raise SchemaError(f"{where}: analysed with the earlier fitting method (record points only, R0 fitted, no "
                          "seeds or n trend), which this isosweep no longer reads: redo it from MLflow with "
                          "`isosweep frontier <sweep-id> --dashboards <folder>`")
    if version == 1:
        data = {**data, "eval": data.get("eval") or {}, "metrics": {
            name: {**m, "frontier": [{**row, "n_tie": row.get("n_tie", row["tie"])} for row in m["frontier"]]}
            for name, m in data["metrics"].items()}}
    return {**data, "schema_version": SCHEMA_VERSION}


def read_analysis(path: str | Path) -> SavedAnalysis:
    """The analysis saved at ``path`` (a ``fits.json``)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise SchemaError(f"{path}: not JSON ({e})") from None
    return SavedAnalysis.from_json(data, str(path))


def upgrade_folder(root: str | Path) -> list[Path]:
    """Rewrite every ``fits.json`` under ``root`` (at any depth) to the current version; returns those whose text
    changed. A file of another method or a newer version stops it before anything is written."""
    paths = sorted(Path(root).rglob("fits.json"))
    texts = {path: read_analysis(path).dumps() for path in paths}
    changed = [path for path, text in texts.items() if path.read_text() != text]
    for path in changed:
        path.write_text(texts[path])
    return changed
