"""The study report: each claim of the papers behind isosweep, tested on the studies in ``dashboards/``.

Input is what ``make sweep`` (or ``isosweep frontier <id> --dashboards ...``) writes per study: a folder with
``fits.json``, read as a :class:`~isosweep.report.schema.SavedAnalysis` (an older version is converted on
reading; another method's is refused: :mod:`isosweep.report.schema`), and the ``curves.json`` the planner pools.
The AIS comparison (``ais-study/table.csv``, ``ais-ladder/vs_bf16.csv``), the learning-rate pilot
(``calibration/summary.md``) and the synthetic validation of the statistics (``methods/validation.json``) are
read where present.

Each claim gets the test, the numbers with their intervals and a verdict:

- **supported** / **contradicted**: the data decide, beyond their noise (a 90% interval that
  excludes the alternative; a tie decides nothing);
- **not resolvable at this scale**: ties, a grid edge, one seed, no study: with what it would take.

Each claim that rests on the studies is tested on each testbed apart (:data:`TESTBEDS`: the task and model a study
ran on, :func:`testbed_of`): a verdict on one testbed says nothing of another.

    isosweep report --dashboards dashboards     # -> dashboards/REPORT.md and report.html
"""

from __future__ import annotations

import csv
import html
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

from isosweep.report import analysis as A
from isosweep.report import planner as P
from isosweep.report.schema import DecisionHoldout, FrontierRow, SavedAnalysis, SavedMetric, read_analysis
from isosweep.report.tables import fmt
from isosweep.track.curves import SweepData

SUPPORTED, CONTRADICTED, UNRESOLVED, UNTESTED = ("supported", "contradicted", "not resolvable at this scale",
                                                 "not tested")


ARITHMETIC, CODES, PLANTED = "arithmetic", "codes", "planted control"
TESTBEDS = (ARITHMETIC, CODES, PLANTED)
"""The testbeds in the report's order: the arithmetic task with the tiny transformer, the codes tasks (needles
found by sampling), and the planted control (the tabular policy, whose answer is known). Another task is a testbed
of its own, named by the task, placed after codes and before the planted control."""

TESTBED_NOTE = ("Testbeds: **arithmetic** is the tiny transformer on 2-digit addition; **codes** is a task of needle "
                "problems whose answers must be found by sampling, and nothing learned on one family of needles "
                "transfers to another; the **planted control** is a tabular policy on a codes task whose answer is "
                "known from an independent simulation (`tabular-control/truth.md`), so a claim's verdict there tests "
                "the platform, not the scale. Each claim is tested on each testbed apart.")
"""The report's paragraph on the testbeds."""


def testbed_of(params: Mapping[str, object]) -> str:
    """The testbed of a trial's flattened settings (``trial_params``): :data:`PLANTED` when ``model.name`` is
    ``tabular``, :data:`CODES` when ``task.name`` starts with ``codes``, else the task's name; :data:`ARITHMETIC`
    without a ``task.name`` (every study before the other testbeds ran on arithmetic)."""
    if str(params.get("model.name", "")) == "tabular":
        return PLANTED
    task = str(params.get("task.name", "") or ARITHMETIC)
    return CODES if task.startswith("codes") else task


def read_testbed(folder: str | Path) -> str:
    """:func:`testbed_of` the top-level ``trial_params`` of the study folder's ``curves.json``; :data:`ARITHMETIC`
    for a folder without ``curves.json`` or whose ``trial_params`` lack ``task.name`` and ``model.name`` (such
    folders predate the other testbeds)."""
    path = P.curves_path(folder)
    if not path.exists():
        return ARITHMETIC
    params = json.loads(path.read_text()).get("trial_params") or {}
    return testbed_of(params)


def testbed_order(testbed: str) -> tuple[int, str]:
    """Sort key of a testbed: arithmetic, codes, any other task by name, then the planted control."""
    rank = {ARITHMETIC: 0, CODES: 1, PLANTED: 3}.get(testbed, 2)
    return rank, testbed


@dataclass(frozen=True)
class Study:
    """A study folder of ``dashboards/``, its saved analysis and the testbed it ran on (:func:`read_testbed`,
    filled in by :func:`read_studies`; :data:`ARITHMETIC` when not given)."""

    folder: str
    analysis: SavedAnalysis
    testbed: str = ARITHMETIC

    @property
    def difficulty(self) -> str:
        a = self.analysis
        return a.difficulty or ("hard" if "hard" in a.title else "easy" if "easy" in a.title else "?")

    @property
    def primary(self) -> SavedMetric:
        return self.analysis.metrics[self.analysis.primary]

    def label(self) -> str:
        a = self.analysis
        noise = a.eval
        evals = (f"; eval {noise.problems} problems x {noise.samples} samples, one evaluation's sampling se "
                 f"{noise.se_median:.4f}" if noise and noise.problems else "")
        return (f"`{self.folder}` ({self.difficulty}, C = {a.budget:,}, {len(a.configs)} configs, "
                f"{len(a.seeds)} seed{'s' if len(a.seeds) != 1 else ''}"
                + (f"; sweeps {', '.join(f'`{p}`' for p in a.pooled_from)} pooled" if len(a.pooled_from) > 1 else "")
                + evals + ")")

    def zero_signal_warning(self) -> str | None:
        """The warning when the study's step-0 zero-signal check disagrees beyond noise (``flagged``); None
        otherwise, and for a study whose trials did not log the check."""
        check = self.analysis.zero_signal
        if check is None or not check.flagged:
            return None
        return (f"**zero-signal check at step 0 disagrees beyond noise** (z = {fmt(check.z, '+.1f')} over "
                f"{check.trials} trial{'s' * (check.trials != 1)}): {check.observed:.3f} of groups without signal "
                f"observed, the probe predicts {check.expected:.3f}; check the reward, the sampler and the grouping "
                "before reading its numbers")


@dataclass(frozen=True)
class SetCount:
    """A claim's tests on one set of problems (easy, hard): how many decided, how many of those hit, and how many
    were tried in all (ties included)."""

    decided: int
    hits: int
    tried: int


@dataclass
class Claim:
    """A claim of the papers, its test, the verdict with the evidence it rests on, and what it would take to
    decide it where it is not decided."""

    title: str
    test: str
    verdict: str = UNTESTED
    evidence: list[str] = field(default_factory=list)
    needs: str = ""
    by_set: dict[str, SetCount] = field(default_factory=dict)
    """The tests that decide, per set of problems (the hold-out claim)."""


def read_studies(dashboards: Path) -> list[Study]:
    """Every ``<folder>/fits.json`` directly under ``dashboards``, sorted by folder name, each with the testbed
    its folder's ``curves.json`` names (:func:`read_testbed`)."""
    return [Study(path.parent.name, read_analysis(path), read_testbed(path.parent))
            for path in sorted(dashboards.glob("*/fits.json"))]


def load_studies(dashboards: Path) -> list[Study]:
    """:func:`read_studies`, less the folders of sweeps that a pooled analysis holds (its ``pooled_from``) and of
    studies whose every trial a larger study holds (:func:`contained_studies`): their trials are in the other,
    and counted once."""
    found = read_studies(dashboards)
    pooled = pooled_sweeps(found)
    kept = [s for s in found if s.analysis.title not in pooled]
    inside = contained_studies(kept)
    return [s for s in kept if s.folder not in inside]


def contained_studies(studies: list[Study]) -> dict[str, str]:
    """folder -> the folder of a larger study that holds every trial of it: the same study kind, budget, set,
    seeds and eval shape, a grid that is a strict subset of the larger one's, and each shared config's records
    (every seed's running best at every evaluation, the primary metric) the same numbers -- trials are
    deterministic, so the same trial run in two sweeps is one observation, and counting both studies would
    count it twice."""
    def shape(s: Study) -> tuple:
        a = s.analysis
        problems = (a.eval.problems, a.eval.samples) if a.eval else None
        return a.study, a.budget, s.difficulty, a.seeds, a.primary, problems

    def holds(big: Study, small: Study) -> bool:
        configs = small.analysis.configs
        if shape(big) != shape(small) or not set(configs) < set(big.analysis.configs):
            return False
        mine, theirs = small.primary.records, big.primary.records
        return all(configs[c] == big.analysis.configs[c] and mine.get(c) == theirs.get(c) for c in configs)

    out = {}
    for small in studies:
        bigger = [big for big in studies if big is not small and holds(big, small)]
        if bigger:
            out[small.folder] = max(bigger, key=lambda b: len(b.analysis.configs)).folder
    return out


def pooled_sweeps(studies: list[Study]) -> dict[str, str]:
    """sweep id -> the folder whose pooled analysis holds it."""
    return {sweep: s.folder for s in studies for sweep in s.analysis.pooled_from if sweep != s.analysis.title}


def combine(verdicts: list[str]) -> str:
    """One verdict from several studies': all that decided agree -> theirs; any disagreement -> unresolved."""
    decided = {v for v in verdicts if v in (SUPPORTED, CONTRADICTED)}
    if len(decided) == 1:
        return decided.pop()
    return UNRESOLVED if verdicts else UNTESTED


# --------------------------------------------------------------------------------- the claims


def _n_star_cell(row: FrontierRow) -> str:
    """One frontier row as the n* claim reads it: the tie, or n* with its P(best) and 90% set."""
    if row.n_tie:
        return f"tie {row.config} ~ {row.runner_up}" + (f" (n* 90% set {list(row.n_range)})"
                                                        if len(row.n_range) > 1 else "")
    configs = f"; configs tie {row.config} ~ {row.runner_up}" if row.tie else ""
    return f"n* {row.n} (P(best) {row.p_best:.2f}, n* 90% set {list(row.n_range)}{configs})"


def _grid_n(study: Study) -> list[int]:
    return sorted({c["n"] for c in study.analysis.configs.values()})


def n_star_claim(studies: list[Study]) -> Claim:
    """n* grows with C, then saturates (iso-compute studies, the primary metric)."""
    claim = Claim("n* grows with C, then saturates",
                  "per iso-compute study, n* of the primary metric at each C of the frontier table (an n* within "
                  "noise of another n, and winners at the edge of the grid, decide nothing; two configs of one n "
                  "tied still name n*); growth = an untied n* at a larger C above "
                  "an untied n* at a smaller C; saturation = the analysis's own verdict (an interior, untied n* "
                  "over at least 4x in C)")
    verdicts = []
    for study in (s for s in studies if s.analysis.study == "isocompute"):
        name, m = study.analysis.primary, study.primary
        rows = m.winners
        grid_n = _grid_n(study)
        if len(grid_n) < 2:
            claim.evidence.append(f"{study.label()}: one n studied, so it ranks no n (not counted)")
            continue
        untied = [r for r in rows if not r.n_tie and r.n not in (grid_n[0], grid_n[-1])]
        cells = ", ".join(f"C {r.C:,.0f}: " + _n_star_cell(r) for r in rows)
        claim.evidence.append(f"{study.label()}, {name}: {cells}. Verdict of the analysis: {m.verdict}")
        grows = any(b.n > a.n for i, a in enumerate(untied) for b in untied[i + 1:])
        shrinks = any(b.n < a.n for i, a in enumerate(untied) for b in untied[i + 1:])
        if shrinks and not grows:
            verdicts.append(CONTRADICTED)
        elif grows and not shrinks and m.saturates:
            verdicts.append(SUPPORTED)
        else:
            verdicts.append(UNRESOLVED)
    claim.verdict = combine(verdicts)
    if claim.verdict != SUPPORTED:
        claim.needs = ("untied interior winners at several budgets: a grid that brackets n* (n = 2 up to a large n), "
                       "budgets past the curves' bend, and enough seeds and eval problems that n*'s 90% set narrows to "
                       "one n")
    return claim


def n_metric_claim(studies: list[Study]) -> Claim:
    """Easy sets gain worst@k and hard sets best@k as n grows at a fixed C."""
    claim = Claim("as n grows at a fixed C, easy sets gain worst@k (sharpening) and hard sets best@k (coverage)",
                  "per iso-compute study, the change of the fitted worst@k (easy) or best@k (hard) per doubling of n "
                  "at a fixed Bp, at the largest C the configs share, with its 90% bootstrap interval; grows / falls "
                  "only when the interval excludes 0")
    verdicts = []
    for study in (s for s in studies if s.analysis.study == "isocompute"):
        family = {"easy": "worst", "hard": "best"}.get(study.difficulty)
        found = study.analysis.metric(family) if family else None
        if found is None or len(_grid_n(study)) < 2:
            continue  # a single n has no trend in n
        name, m = found
        t = m.n_trend
        if t is None:
            claim.evidence.append(f"{study.label()}, {name}: no C where two n of one Bp have fits")
            verdicts.append(UNRESOLVED)
            continue
        context = []
        for other in ("mean", "best" if family == "worst" else "worst"):
            o = study.analysis.metric(other)
            if o and o[1].n_trend:
                ot = o[1].n_trend
                context.append(f"{o[0]} {ot.slope_per_doubling:+.4f} [{fmt(ot.low, '+.4f')}, {fmt(ot.high, '+.4f')}]")
        rising = sum(1 for f in m.fits.values() if f.not_identified)
        claim.evidence.append(
            f"{study.label()}, {name} at C = {t.C:,.0f}, n in {list(t.n)}: {t.slope_per_doubling:+.4f} per doubling "
            f"of n, 90% CI [{fmt(t.low, '+.4f')}, {fmt(t.high, '+.4f')}] ({t.direction})"
            + (f"; for comparison {', '.join(context)}" if context else "")
            + (f". {rising} of {len(m.fits)} fits are not identified (curves still rising at the budget): this is what "
               "n buys at this C, not at the plateau" if rising else ""))
        verdicts.append({"grows": SUPPORTED, "falls": CONTRADICTED}.get(t.direction, UNRESOLVED))
    claim.verdict = combine(verdicts)
    if claim.verdict != SUPPORTED:
        claim.needs = ("an iso-compute study on each difficulty with intervals narrow enough to separate the slope "
                       "from 0 (more seeds, more eval problems), at budgets where the curves have bent")
    return claim


def fixed_batch_claim(studies: list[Study]) -> Claim:
    """Under a fixed batch, large Bp wins at small C and large n at large C."""
    claim = Claim("under a fixed batch Bp·n, many problems (large Bp) win at small C and many samples (large n) at "
                  "large C",
                  "per fixed-batch study, the untied winner of the primary metric at the smallest and the largest C "
                  "of the table: supported when n* grows between them, contradicted when one untied winner holds "
                  "at both ends or n* falls and the last winner's curve has bent (its fit identified)")
    verdicts, rising = [], []
    for study in (s for s in studies if s.analysis.study == "fixed-batch"):
        name, m = study.analysis.primary, study.primary
        rows = m.winners
        if not rows:
            continue
        first, last = rows[0], rows[-1]
        cells = "; ".join(f"C {r.C:,.0f}: " + (f"tie {r.config} ~ {r.runner_up}" if r.tie else
                                                f"{r.config} (P(best) {r.p_best:.2f})")
                          + (f", n* 90% set {{{', '.join(map(str, r.n_range))}}}" if r.n_range else "")
                          for r in (first, last))
        fits = m.fits
        rising_configs = sorted(c for c in fits if fits[c].not_identified)
        unbent = sorted(fits[c].params["C_mid"] for c in rising_configs)
        budget = study.analysis.budget
        bend = (f". {len(unbent)} of {len(fits)} {name} fits not identified (curves still rising at C = "
                f"{budget:,}, fitted C_mid up to {unbent[-1]:,.0f}): the largest C here is not past their "
                "bend" if unbent else f". Every {name} fit identified: the curves have bent by C = {budget:,}")
        if unbent and len(unbent) < len(fits):
            rest = len(fits) - len(unbent)
            bend += f" ({', '.join(rising_configs)}); " + ("the other one has bent" if rest == 1 else f"the other {rest} have bent")
        if unbent:
            rising.append((study, unbent[-1], rising_configs, len(fits)))
        claim.evidence.append(f"{study.label()}, {name}: {cells}{bend}")
        if first.tie or last.tie:
            verdicts.append(UNRESOLVED)
        elif last.n > first.n:
            verdicts.append(SUPPORTED)
        elif last.config not in fits or fits[last.config].not_identified:
            # the claim is about large C: a winner that still holds while its own curve rises is not past it
            claim.evidence[-1] += (f"; {last.config} leads at both ends, but its fit is not identified, so the "
                                   "largest C is not the large C of the claim: this decides nothing")
            verdicts.append(UNRESOLVED)
        else:
            verdicts.append(CONTRADICTED)
    claim.verdict = combine(verdicts)
    if claim.verdict != SUPPORTED:
        where = ""
        if rising:
            last, c_mid, configs, fitted = max(rising, key=lambda r: r[0].analysis.budget)
            which = "they had not" if len(configs) == fitted else f"{len(configs)} of {fitted} had not ({', '.join(configs)})"
            where = f" (at C = {last.analysis.budget:,}, `{last.folder}`, {which}: fitted C_mid up to {c_mid:,.0f})"
        claim.needs = ("a fixed-batch study with >= 2 seeds at a budget where the primary metric's curves have bent"
                       + where
                       + ", and untied winners at both ends of the table (more seeds or eval problems where the leaders "
                         "tie)")
    return claim


LADDER = ("bf16", "fp8", "int8", "int6", "int4", "int3", "int2")
"""Rollout precisions from the mildest error to the largest."""
LOSS_SE = 2.0
"""A difference counts when it is beyond this many standard errors, in the pooled mean and in every seed."""


@dataclass(frozen=True)
class LadderDiff:
    """A row of ``ais-ladder/vs_bf16.csv``: an arm's final mean@k minus bf16's on one set, for one seed (or
    ``all``: pooled over seeds), with its standard error from eval noise."""

    set: str
    arm: str
    seed: str
    diff: float
    se: float


def ais_claim(dashboards: Path) -> Claim:
    """FP8 rollouts with AIS match bf16 where naive FP8 loses -- tested where a rollout error is large enough to
    hurt: the mildest precision of the ladder (``ais-ladder``) whose naive arm loses to bf16."""
    claim = Claim("FP8 rollouts with AIS match bf16 where naive FP8 loses",
                  "`make ais-study` (bf16, naive FP8, FP8 with TIS / AIS) and `dashboards/ais-ladder` (a ladder of "
                  "rollout-weight errors, >= 2 seeds): each arm's final mean@k minus bf16's of the same seed, paired "
                  "over the eval problems (standard error from eval noise). Naive training *loses* when that difference "
                  f"is below -{LOSS_SE:g} se pooled over seeds and negative in every seed; at the mildest precision "
                  "where it loses, AIS *matches* bf16 when its own pooled difference is within one se of 0 or above "
                  "(a tie: supported), *loses too* by the same rule as naive training (contradicted); in between, "
                  "neither is shown. Per set of problems; the claim's verdict is that of the sets that decide (two "
                  "that disagree: not resolvable)")
    path = dashboards / "ais-study" / "table.csv"
    if path.exists():
        with open(path) as f:
            rows = list(csv.DictReader(f))
        key = next(k for k in rows[0] if k.startswith("final_"))
        for s in sorted({r["set"] for r in rows}):
            arms = {r["arm"]: float(r[key]) for r in rows if r["set"] == s}
            claim.evidence.append(f"ais-study, {s}: " + ", ".join(f"{arm} {v:.3f}" for arm, v in arms.items())
                                  + (f" (naive FP8 - bf16 = {arms['fp8+none'] - arms['bf16']:+.3f}, one seed)"
                                     if {"bf16", "fp8+none"} <= arms.keys() else ""))
    ladder = dashboards / "ais-ladder" / "vs_bf16.csv"
    if not ladder.exists():
        claim.verdict = UNRESOLVED
        claim.needs = ("a rollout error large enough that naive training degrades: `isosweep ais-study --arms "
                       "bf16,int4,int3,int2 --seeds 0,1 --out dashboards/ais-ladder`, then TIS and AIS at the "
                       "mildest precision that loses")
        return claim
    with open(ladder) as f:
        diffs = [LadderDiff(r["set"], r["arm"], r["seed"], float(r["diff"]), float(r["se"])) for r in csv.DictReader(f)]
    verdicts = {}
    for s in sorted({d.set for d in diffs}):
        def result(arm: str) -> tuple[LadderDiff | None, list[LadderDiff]]:
            rows = [d for d in diffs if d.set == s and d.arm == arm]
            return next((d for d in rows if d.seed == "all"), None), [d for d in rows if d.seed != "all"]

        def loses(arm: str) -> bool | None:
            pooled, seeds = result(arm)
            if pooled is None:
                return None
            return pooled.diff < -LOSS_SE * pooled.se and all(d.diff < 0 for d in seeds)

        shown = []
        for arm in dict.fromkeys(d.arm for d in diffs if d.set == s):
            pooled, seeds = result(arm)
            if pooled is not None:
                shown.append(f"{arm} {pooled.diff:+.3f} ± {pooled.se:.3f} (seeds "
                             + ", ".join(f"{d.diff:+.3f}" for d in seeds) + ")")
        claim.evidence.append(f"ais-ladder, {s}, final mean@k minus bf16: " + "; ".join(shown))
        naive = [p for p in LADDER[1:] if loses(p) or loses(f"{p}+none")]
        if not naive:
            claim.evidence.append(f"ais-ladder, {s}: naive training loses to bf16 at no precision of the ladder")
            verdicts[s] = UNRESOLVED
            continue
        level = naive[0]
        ais = result(f"{level}+ais")[0]
        if ais is None:
            claim.evidence.append(f"ais-ladder, {s}: naive training first loses at {level}; no {level}+ais arm yet")
            verdicts[s] = UNRESOLVED
            continue
        ratio = ais.diff / ais.se if ais.se > 0 else 0.0
        outcome = (CONTRADICTED, "AIS loses too") if loses(f"{level}+ais") else \
            (SUPPORTED, "AIS matches bf16 (a tie)") if ratio >= -1.0 else \
            (UNRESOLVED, "AIS between a tie with bf16 and a loss: more seeds would decide")
        tis = result(f"{level}+tis")[0]
        claim.evidence.append(f"ais-ladder, {s}: naive training first loses at {level}; {level}+ais - bf16 = "
                              f"{ais.diff:+.3f} ± {ais.se:.3f} ({ratio:+.2f} se): {outcome[1]}"
                              + (f"; for comparison {level}+tis - bf16 = {tis.diff:+.3f} ± {tis.se:.3f}"
                                 if tis is not None else ""))
        verdicts[s] = outcome[0]
    claim.verdict = combine(list(verdicts.values())) if verdicts else UNRESOLVED
    open_sets = [s for s, v in verdicts.items() if v not in (SUPPORTED, CONTRADICTED)]
    if claim.verdict in (SUPPORTED, CONTRADICTED) and open_sets:
        decided = [s for s in verdicts if s not in open_sets]
        claim.evidence.append(f"the verdict rests on the {', '.join(decided)} set{'s' * (len(decided) > 1)} alone: "
                              f"the {', '.join(open_sets)} set{'s' * (len(open_sets) > 1)} decide{'s' * (len(open_sets) == 1)} "
                              "nothing yet")
        claim.needs = (f"for the verdict to hold on every set: more seeds on the {', '.join(open_sets)} set (the seeds' "
                       "spread is not modelled by these standard errors, which are eval noise only)")
    elif claim.verdict != SUPPORTED:
        sets = sorted({d.set for d in diffs})
        claim.needs = (f"the ladder on every set (run so far: {', '.join(sets)}), with TIS and AIS arms at the mildest "
                       "precision where naive training loses, and more seeds where AIS sits between a tie with bf16 and "
                       "a loss (the seeds' spread is not modelled by these standard errors, which are eval noise only)")
    return claim


def holdout_outcome(study: Study, metric: str, d: DecisionHoldout) -> str:
    """``hit``, ``miss`` or ``tie`` for a study's decision hold-out (:func:`isosweep.report.analysis.holdout_outcome`)."""
    return A.holdout_outcome(study.analysis.metrics[metric].frontier, study.analysis.configs, d)


def picked_runs(study: Study, dashboards: Path, config: str) -> list[P.RunId] | None:
    """The runs (:func:`isosweep.report.planner.run_identity`) of ``config`` in the study's folder; None without
    the folder's curves."""
    path = P.curves_path(dashboards / study.folder)
    if not path.exists():
        return None
    data = SweepData.from_json(json.loads(path.read_text()), str(path))
    return [P.run_identity(data, c) for c in data.curves if c.config == config] or None


def same_prediction(study: Study, metric: str, d: DecisionHoldout, runs: list[P.RunId] | None = None) -> set:
    """What a decision hold-out's pick rests on, one key per run: the set, the predicted config and each of its
    runs (``runs``, from :func:`picked_runs`). Two picks that share a run (the same deterministic trial of the
    picked config, run to the same or to another budget, or pooled with other seeds) rest on the same curve: at
    most one test of the fits, not two. Without ``runs``, one key: the set, C_max, the config and every record of
    it (each seed's running best at each evaluation)."""
    if runs is not None:
        return {(study.difficulty, run) for run in runs}
    records = study.analysis.metrics[metric].records.get(d.predicted_config)
    if records is None:  # nothing to compare: a test of its own
        return {(study.folder, id(study))}
    return {(study.difficulty, d.C_max, d.predicted_config, records)}


def holdout_claim(studies: list[Study], dashboards: Path, synthetic: bool = True) -> Claim:
    """Fits predict 4x out. With ``synthetic``, the evidence ends with the hit rate on the synthetic sweeps of
    ``methods/validation.json`` where present (a check of the statistics, the same for every testbed: the report
    shows it once)."""
    claim = Claim("the fitted curves predict 4x beyond their data",
                  "decision hold-out: every config fitted on C <= C_max/4, the predicted winner and its value at C_max "
                  "against what was observed; on the real studies and on synthetic sweeps with a known truth")
    decided: list[tuple[set, list[tuple[str, bool]], str]] = []  # one test: its runs' keys, (folder, hit) of each
    # study whose pick rests on them, and the set of problems it was made on
    tried_on: Counter[str] = Counter()  # hold-outs per set, ties included
    for study in studies:
        name, d = study.analysis.primary, study.primary.decision_holdout
        if not d.predicted_config:
            claim.evidence.append(f"{study.label()}, {name}: no hold-out ({d.reason or 'no data'})")
            continue
        outcome = holdout_outcome(study, name, d)
        tried_on[study.difficulty] += 1
        repeat = ""
        if outcome != "tie":
            keys = same_prediction(study, name, d, picked_runs(study, dashboards, d.predicted_config))
            shared = [test for test in decided if test[0] & keys]
            if shared:
                repeat = (f"; the same pick as `{shared[0][1][0][0]}`'s from the same runs (its "
                          f"{d.predicted_config} trials, deterministic, to this or another budget"
                          + (", or some of them" if not any(keys <= test[0] for test in shared) else "")
                          + "), counted once with it: one hit only if every such pick hit")
            merged = (keys.union(*(t[0] for t in shared)), [p for t in shared for p in t[1]], study.difficulty)
            decided = [t for t in decided if all(t is not u for u in shared)] + [merged]
            merged[1].append((study.folder, outcome == "hit"))
        claim.evidence.append(f"{study.label()}, {name}: predicted {d.predicted_config} "
                              f"({fmt(d.predicted_value)}), observed best {d.observed_config} -> "
                              + A.holdout_words(outcome, d.hit) + f", value error {fmt(d.abs_error)}{repeat}")
    validation = dashboards / "methods" / "validation.json"
    if synthetic and validation.exists():
        v = json.loads(validation.read_text())
        hit_rate = v.get("decision_holdout_hit_rate")
        if hit_rate is not None:
            claim.evidence.append(f"synthetic sweeps (`methods/`, {v.get('decision_holdout_possible', '?')} hold-outs): "
                                  f"decision hold-out hit rate {hit_rate:.2f}, median value error "
                                  f"{fmt(v.get('decision_holdout_value_error_median_abs'))}")
    per_set: dict[str, list[bool]] = {}  # set -> whether each prediction that decided hit
    for _, same, on_set in decided:
        per_set.setdefault(on_set, []).append(all(hit for _, hit in same))
    claim.by_set = {on_set: SetCount(len(per_set.get(on_set, [])), sum(per_set.get(on_set, [])), tried)
                    for on_set, tried in sorted(tried_on.items())}
    hits = [hit for on_set in per_set.values() for hit in on_set]
    tied_sets = sorted(set(tried_on) - set(per_set))
    if per_set:
        claim.evidence.append("hold-outs that decide, by set (picks that share runs counted once): "
                              + decided_by_set(claim))
    _holdout_verdict(claim, hits, per_set, tied_sets, tried_on)
    return claim


def decided_by_set(claim: Claim) -> str:
    """``easy 3 (2 hit); hard none (2 hold-outs, every one a tie)``: the hold-outs that decided, per set."""
    decided = [f"{s} {c.decided} ({c.hits} hit)" for s, c in claim.by_set.items() if c.decided]
    ties = [f"{s} none ({c.tried} hold-out{'s' * (c.tried > 1)}, every one a tie)"
            for s, c in claim.by_set.items() if not c.decided]
    return "; ".join(decided + ties)


def _holdout_verdict(claim: Claim, hits: list[bool], per_set: dict[str, list[bool]], tied_sets: list[str],
                     tried_on: Counter[str]) -> None:
    """The hold-out claim's verdict and what it needs, from the decided tests (``hits``, per set)."""
    if not hits and tried_on:
        claim.verdict = UNRESOLVED
        claim.needs = "hold-outs against untied winners: studies whose curves bend within their budget, more seeds"
    elif not hits:
        claim.verdict = UNTESTED
        claim.needs = "a study of the current method whose curves bend within their budget (at least 3 for a verdict)"
    elif len(hits) >= 3:
        rate = sum(hits) / len(hits)
        claim.verdict = SUPPORTED if rate >= 0.75 else CONTRADICTED if rate <= 0.25 else UNRESOLVED
        against = [s for s, v in sorted(per_set.items())
                   if (claim.verdict == CONTRADICTED and sum(v) / len(v) > 0.25)
                   or (claim.verdict == SUPPORTED and sum(v) / len(v) < 0.75)]
        if against:
            rates = "; ".join(f"{s} {sum(v)} of {len(v)} hit" for s, v in sorted(per_set.items()))
            claim.needs = (f"the sets disagree ({rates}) and the verdict pools them: more hold-outs that decide on the "
                           f"{', '.join(against)} "
                           f"set{'s' * (len(against) > 1)} would tell whether the fits do better there")
        elif claim.verdict != UNRESOLVED and tied_sets:
            claim.needs = (f"for the verdict to hold on every set: hold-outs that decide on the {', '.join(tied_sets)} "
                           f"set{'s' * (len(tied_sets) > 1)} too (there the picked and the observed winner tied at "
                           "C_max: studies that separate the configs, or more seeds)")
        if claim.verdict == UNRESOLVED:
            claim.needs = (f"{sum(hits)} of {len(hits)} real decision hold-outs that decide hit (rate {rate:.2f}), "
                           "between the rates that would decide (0.75 or more: supported; 0.25 or less: "
                           "contradicted): more studies whose curves bend within their budget, each a hold-out of "
                           "its own (other difficulties, budgets or grids)")
    else:
        claim.verdict = UNRESOLVED
        claim.needs = (f"{len(hits)} real decision hold-out(s) that decide (not ties) so far, {sum(hits)} of them "
                       "hit: at least 3 studies whose curves bend within their budget (a pick that two studies make "
                       "from the same runs counts once)")


# --------------------------------------------------------------------------------- the report


def _pilot_pick(dashboards: Path) -> str | None:
    summary = dashboards / "calibration" / "summary.md"
    if not summary.exists():
        return None
    return next((line for line in summary.read_text().splitlines() if line.startswith("**Pick**")), None)


PLAN_BUDGETS = (1e5, 1e6, 1e7)
"""The budgets of the report's "what to run" table."""


def _budget(C: float) -> str:
    return f"{C:.0e}".replace("e+0", "e").replace("e+", "e")


def _holdout_verdict_words(claim: Claim) -> str:
    """``**verdict**`` and, where any hold-out decided, ``(hold-outs that decide: ...)``."""
    by_set = decided_by_set(claim) if any(c.decided for c in claim.by_set.values()) else ""
    return f"**{claim.verdict}**" + (f" (hold-outs that decide: {by_set})" if by_set else "")


def planning_section(dashboards: Path, bootstrap: int = 100,
                     holdouts: Claim | Mapping[str, Claim] | None = None) -> list[str]:
    """What to run at each of :data:`PLAN_BUDGETS`, per task/difficulty/model and method, from the study
    folders that keep their trials' curves (``curves.json``), with the warnings and a leave-one-budget-out check.
    The planted control (``model.name: tabular``, :data:`PLANTED`) is left out, and the section says so where a
    folder of it is there: it checks the platform, it is not a run to plan. ``holdouts`` (:func:`holdout_claim`'s
    verdict on the real studies, or testbed -> that testbed's) says how far a pick beyond the data is to be
    trusted; a mapping of one testbed reads as that testbed's claim alone."""
    lines = ["", "## What to run at C = 1e5, 1e6, 1e7", "",
             "From `isosweep recommend --budget C --from dashboards` (the planner: every study folder of one task, "
             "difficulty, model and method pooled by allocation; predicted value with its 90% interval, P(best) from "
             f"{bootstrap} bootstrap replicates over seeds, sweeps and paired eval problems). Beyond the data the "
             "values are fits extrapolated, flagged below: read them as a direction and run the suggested sweep "
             "(`--suggest`) before acting on them."]
    if isinstance(holdouts, Claim):
        holdouts = {"": holdouts}
    if holdouts:
        title = next(iter(holdouts.values())).title
        if len(holdouts) == 1:
            verdicts = f"above: {_holdout_verdict_words(next(iter(holdouts.values())))}"
        else:
            verdicts = "above, per testbed: " + "; ".join(f"{testbed} {_holdout_verdict_words(claim)}"
                                                           for testbed, claim in holdouts.items())
        lines[-1] += f" Whether such fits pick the winner 4x beyond their data is the claim \"{title}\" {verdicts}."
    found = P.load_folders(dashboards)
    sweeps = [data for data in found if testbed_of(P.trial_params(data)) != PLANTED]
    controls = sorted(data.sweep_id for data in found if testbed_of(P.trial_params(data)) == PLANTED)
    if controls:
        lines += ["", "The planted control (`model.name: tabular`: "
                      + ", ".join(f"`{sweep}`" for sweep in controls)
                      + ") is left out: it checks the platform against a known answer, it is not a run to plan."]
    if not sweeps:
        return lines + ["", "No study folder" + (" other than the planted control" if controls else "")
                        + " keeps its trials' curves (`curves.json`, written by `make report` and at the end of each "
                          "sweep): nothing to plan from yet."]
    groups: dict[tuple, list] = {}
    for data in sweeps:
        # sweeps scored on other eval problems ran on other base models (or task settings): planned apart
        key = (tuple(P.identity(data).values()), json.dumps(P.method(data), sort_keys=True), P.eval_sets(data))
        groups.setdefault(key, []).append(data)
    several = len({key[:2] for key in groups}) < len(groups)
    for (ident, method, scored), members in sorted(groups.items()):
        task, levels, difficulty, model = ident[:4]  # IDENTITY starts with these
        try:
            planner = P.Planner(members, "mean", bootstrap=bootstrap)
        except ValueError as e:
            lines += ["", f"### {task} {levels}, {difficulty}, {model}", "", f"Not plannable: {e}"]
            continue
        lr = json.loads(method).get("algorithm.lr_ref", "?")
        on = f"; eval set {', '.join(scored) or 'not recorded'}" if several else ""
        lines += ["", f"### {task} {levels}, {difficulty}, {model} (lr_ref {lr}{on})", "",
                  "Rests on: " + ", ".join(f"`{s.sweep_id}` (C = {s.budget:,}, {s.trials} trials"
                                           + (f"; {s.repeats_left_out} left out as repeats of the same run in "
                                              "another sweep" if s.repeats_left_out else "") + ")"
                                           for s in planner.sources()) + f"; data reach C = {planner.data_C:,.0f}.", "",
                  f"| C | run (n, Bp, M) | predicted {planner.metric} [90%] | P(best) | within noise | flags |",
                  "| --- | --- | --- | --- | --- | --- |"]
        notes: dict[str, list[str]] = {}
        for C in PLAN_BUDGETS:
            rec = planner.at(C)
            close = ", ".join(c.config for c in rec.within_noise()) or "none"
            flags = "; ".join(rec.flags) or "-"
            lines.append(f"| {_budget(C)} | n = {rec.n}, Bp = {rec.Bp}, M = {rec.M:,} | {fmt(rec.value)} "
                         f"[{fmt(rec.low)}, {fmt(rec.high)}] | {rec.p_best:.2f} | {close} | {flags} |")
            for w in rec.warnings:
                notes.setdefault(w, []).append(_budget(C))
        for w, at in notes.items():
            lines.append(f"- at C = {', '.join(at)}: {w}")
        try:
            check = P.leave_one_budget_out(members, bootstrap=bootstrap)
        except ValueError as e:  # too few evaluations below C_max / 4 to fit anything
            lines += ["", f"Leave-one-budget-out: not possible here ({e})."]
            continue
        full = planner.at(check.C_max)
        tied = [c.config for c in full.contenders if c.within_noise]
        lines += ["", f"Leave-one-budget-out: from the data at C <= {check.from_C:,.0f} only, the planner picks, "
                      f"among the {len(check.candidates)} allocations run to C = {check.C_max:,}, "
                      f"{check.recommended} (predicted {fmt(check.predicted)} "
                      f"[{fmt(check.low)}, {fmt(check.high)}], P(best) {check.p_best:.2f}); observed there: "
                      f"{fmt(check.observed_recommended)} (inside its interval: "
                      f"{'yes' if check.covered else 'no'}), the observed best {check.observed_best} "
                      f"{fmt(check.observed_best_value)} (shortfall {fmt(check.shortfall)}); with all the data "
                      f"the allocations within noise of the best at C = {check.C_max:,} are "
                      f"{', '.join(tied)}, so the pick is "
                      + ("among them." if check.recommended in tied else "not among them.")]
    return lines


def shared_runs(dashboards: Path, testbed: str | None = None) -> list[str]:
    """Lines naming the studies that ran the same trial (same allocation, seed, task, model and method: a
    deterministic run measured twice), so their verdicts are read as not independent; with ``testbed``, among
    that testbed's study folders only (a run is on one testbed: its task and model are part of what it is)."""
    owners: dict[P.RunId, list[str]] = {}
    for data in P.load_folders(dashboards):
        if testbed is not None and testbed_of(P.trial_params(data)) != testbed:
            continue
        for c in data.curves:
            owners.setdefault(P.run_identity(data, c), []).append(data.sweep_id)
    pairs: dict[tuple[str, ...], list[str]] = {}
    for run, ids in owners.items():
        if len(ids) > 1:
            pairs.setdefault(tuple(sorted(ids)), []).append(f"{run.config} seed {run.seed}")
    return [f"- {' and '.join(f'`{i}`' for i in ids)} each ran {len(runs)} trial(s) ({', '.join(sorted(runs))}) "
            "with the same allocation, seed and recipe: deterministic runs (bit-identical when they ran on the same "
            "number of torch threads), so their verdicts are not independent evidence"
            for ids, runs in sorted(pairs.items())]


def _scored_on(folder: Path) -> str:
    """``; eval set <id>, base mean@k <value>`` for a study folder with its curves (nothing without them)."""
    path = P.curves_path(folder)
    if not path.exists():
        return ""
    data = SweepData.from_json(json.loads(path.read_text()), str(path))
    name = min((n for c in data.curves for n in c.values if n.startswith("mean@")), default=None)
    starts = [c.values[name][0] for c in data.curves if name in c.values and len(c.compute) and c.compute[0] == 0]
    base = f", base {name} {sum(starts) / len(starts):.3f} at step 0" if starts else ""
    return f"; eval set {', '.join(P.eval_sets(data)) or 'not recorded'}{base}"


def testbeds(studies: list[Study]) -> list[str]:
    """The report's testbeds, in :func:`testbed_order`: each testbed with at least one study, and
    :data:`ARITHMETIC` always (the AIS claim is tested there, from its own folders)."""
    return sorted({ARITHMETIC, *(s.testbed for s in studies)}, key=testbed_order)


def testbed_claims(studies: list[Study], dashboards: Path) -> list[dict[str, Claim]]:
    """The report's claims in order (n*, the metric per difficulty, the fixed batch, AIS, the hold-out), each as
    testbed -> the claim tested on that testbed's studies alone, for every one of :func:`testbeds`. The AIS claim
    reads its own folders (arithmetic runs) and is there under :data:`ARITHMETIC` only; the synthetic sweeps'
    hold-out line (a check of the statistics, not of a testbed) is in the first testbed's hold-out claim only."""
    beds = testbeds(studies)
    on = {bed: [s for s in studies if s.testbed == bed] for bed in beds}
    claims = [{bed: make(on[bed]) for bed in beds} for make in (n_star_claim, n_metric_claim, fixed_batch_claim)]
    claims.append({ARITHMETIC: ais_claim(dashboards)})
    claims.append({bed: holdout_claim(on[bed], dashboards, synthetic=i == 0) for i, bed in enumerate(beds)})
    return claims


def summary_cell(claims: dict[str, Claim], testbed: str) -> str:
    """A summary table cell: ``—`` for a claim not tested on ``testbed`` at all (AIS beyond arithmetic), ``no
    study yet`` where none of its studies bears on the claim, else the verdict in bold."""
    claim = claims.get(testbed)
    if claim is None:
        return "—"
    if claim.verdict == UNTESTED and not claim.evidence:
        return "no study yet"
    return f"**{claim.verdict}**"


def build_report(dashboards: str | Path) -> str:
    """REPORT.md's text from the studies under ``dashboards``: a summary table with one column per testbed
    (:func:`testbeds`), each claim's test and, per testbed, its verdict, evidence and needs
    (:func:`testbed_claims`), the planning section, and the studies grouped by testbed."""
    dashboards = Path(dashboards)
    studies = load_studies(dashboards)
    beds = testbeds(studies)
    claims = testbed_claims(studies, dashboards)
    holdouts = claims[-1]
    lines = ["# What the studies found", "",
             "Generated by `make report` (`isosweep report`) from the study folders in this directory; every number "
             "comes from a study's `fits.json` (its frontier analysis, redone from MLflow by `isosweep frontier "
             "<sweep-id> --dashboards dashboards/<study>`). Verdicts: **supported** or **contradicted** only when "
             "the data decide beyond their noise (90% intervals from a bootstrap over seeds and paired eval "
             "problems); a difference inside its interval is a tie and decides nothing. A study's numbers are those of "
             "the base model it ran on, named below by its eval set (the easy and hard sets come from that model's "
             "pass rates): a tiny base model built by isosweep before warm-up version 2 depended on the CPU that "
             "built it, so a sweep run on another machine or version may start elsewhere and score other problems.",
             "", TESTBED_NOTE, "",
             "| claim | " + " | ".join(beds) + " |", "| --- |" + " --- |" * len(beds)]
    for by_bed in claims:
        title = next(iter(by_bed.values())).title
        lines.append(f"| {title} | " + " | ".join(summary_cell(by_bed, bed) for bed in beds) + " |")
    for by_bed in claims:
        first = next(iter(by_bed.values()))
        lines += ["", f"## {first.title}", "", f"Test: {first.test}."]
        for bed, c in by_bed.items():
            lines += ["", f"### {bed}", "", f"**Verdict: {c.verdict}.**", ""]
            lines += [f"- {e}" for e in c.evidence] or [
                "- no study of the current method on this testbed tests this yet"]
            if c.needs:
                lines += ["", f"What it would take: {c.needs}."]
    lines += planning_section(dashboards, holdouts={bed: c for bed, c in holdouts.items() if bed != PLANTED})
    lines += ["", "## Studies"]
    every = read_studies(dashboards)
    on_bed = {s.folder: s.testbed for s in every}
    pooled = pooled_sweeps(every)
    contained = contained_studies([s for s in every if s.analysis.title not in pooled])
    for bed in beds:
        group = [f"- sweep `{sweep}`: its trials are pooled into `{folder}` and counted there"
                 for sweep, folder in sorted(pooled.items()) if on_bed[folder] == bed]
        group += [f"- `{small}`: every trial of it is also in `{big}` (the same configs, seeds and numbers), counted "
                  "there" for small, big in sorted(contained.items()) if on_bed[small] == bed]
        for s in (s for s in studies if s.testbed == bed):
            group.append(f"- {s.label()}: {s.analysis.trials} trials, {s.analysis.noise}"
                         f"{_scored_on(dashboards / s.folder)}")
            warning = s.zero_signal_warning()
            if warning:
                group.append(f"  - {warning}")
        group += shared_runs(dashboards, bed)
        if group:
            lines += ["", f"**{bed}**", "", *group]
    pick = _pilot_pick(dashboards)
    if pick:
        lines += ["", f"Learning rate of the default recipe (`calibration/summary.md`): {pick.replace('**', '')}."]
    return "\n".join(lines) + "\n"


MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")
"""The report's Markdown renderer: CommonMark with pipe tables, raw HTML in the text escaped."""


def to_html(markdown: str, title: str = "What the studies found") -> str:
    """The report's Markdown as one standalone HTML page."""
    style = ("body{font-family:sans-serif;max-width:70em;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
             "code{background:#f4f4f4}")
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + MARKDOWN.render(markdown) + "</body></html>\n")


def write_report(dashboards: str | Path) -> Path:
    """``REPORT.md`` and the same as ``report.html`` in ``dashboards``; returns the markdown's path."""
    path = Path(dashboards) / "REPORT.md"
    text = build_report(dashboards)
    path.write_text(text)
    (Path(dashboards) / "report.html").write_text(to_html(text))
    return path
