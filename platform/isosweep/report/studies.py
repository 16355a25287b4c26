"""The study report: each claim of the papers behind isosweep, tested on the studies in ``dashboards/``.

Input is what ``make sweep`` (or ``isosweep frontier <id> --dashboards ...``) writes per study: a
folder with ``fits.json``, the frontier analysis of :mod:`isosweep.report.analysis`. Only
analyses of the current method (each seed's running best, ``R0`` fixed, paired bootstrap: their
JSON carries ``seeds`` and per-metric ``n_trend``) give verdicts; folders from the earlier method
are listed as such and not used. The AIS comparison (``ais-study/table.csv``), the learning-rate
pilot (``calibration/summary.md``) and the synthetic validation of the statistics
(``methods/validation.json``) are read where present.

Each claim gets the test, the numbers with their intervals and a verdict:

- **supported** / **contradicted**: the data decide, beyond their noise (a 90% interval that
  excludes the alternative; a tie decides nothing);
- **not resolvable at this scale**: ties, a grid edge, one seed, no study: with what it would take.

    isosweep report --dashboards dashboards     # -> dashboards/REPORT.md
"""

from __future__ import annotations

import csv
import html
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from isosweep.report import analysis as A
from isosweep.report import planner as P
from isosweep.report.tables import fmt
from isosweep.track.curves import SweepData

SUPPORTED, CONTRADICTED, UNRESOLVED, UNTESTED = ("supported", "contradicted", "not resolvable at this scale",
                                                 "not tested")


@dataclass
class Study:
    folder: str
    data: dict

    @property
    def current(self) -> bool:
        """Analysed with the current method (the only ones a verdict may rest on)."""
        return "seeds" in self.data and all("n_trend" in m for m in self.data["metrics"].values())

    @property
    def difficulty(self) -> str:
        return self.data.get("difficulty") or ("hard" if "hard" in self.data["title"] else
                                               "easy" if "easy" in self.data["title"] else "?")

    def metric(self, family: str) -> tuple[str, dict] | None:
        """The ``(name, analysis)`` of ``mean``/``best``/``worst`` at this study's k, if present."""
        for name, m in self.data["metrics"].items():
            if name.split("@")[0] == family:
                return name, m
        return None

    def label(self) -> str:
        seeds = self.data.get("seeds", [])
        pooled = self.data.get("pooled_from", [])
        noise = self.data.get("eval") or {}
        evals = (f"; eval {noise['problems']} problems x {noise['samples']} samples, one evaluation's sampling se "
                 f"{noise['sampling_se_mean']['median']:.4f}" if noise.get("problems") else "")
        return (f"`{self.folder}` ({self.difficulty}, C = {self.data['budget']:,}, {len(self.data['configs'])} configs, "
                f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''}"
                + (f"; sweeps {', '.join(f'`{p}`' for p in pooled)} pooled" if len(pooled) > 1 else "") + evals + ")")


@dataclass
class Claim:
    title: str
    test: str
    verdict: str = UNTESTED
    evidence: list[str] = field(default_factory=list)
    needs: str = ""


def load_studies(dashboards: Path) -> list[Study]:
    """Every ``<folder>/fits.json`` under ``dashboards`` (sorted by folder name), less the folders of sweeps that
    a pooled analysis holds (its ``pooled_from``) and of studies whose every trial a larger study holds
    (:func:`contained_studies`): their trials are in the other, and counted once."""
    found = [Study(path.parent.name, json.loads(path.read_text())) for path in sorted(dashboards.glob("*/fits.json"))]
    pooled = pooled_sweeps(found)
    kept = [s for s in found if s.data["title"] not in pooled]
    inside = contained_studies(kept)
    return [s for s in kept if s.folder not in inside]


def contained_studies(studies: list[Study]) -> dict[str, str]:
    """folder -> the folder of a larger study that holds every trial of it: the same study kind, budget, set,
    seeds and eval shape, a grid that is a strict subset of the larger one's, and each shared config's records
    (every seed's running best at every evaluation, the primary metric) the same numbers -- trials are
    deterministic, so the same trial run in two sweeps is one observation, and counting both studies would
    count it twice. Only current-method studies are compared."""
    def shape(s: Study) -> tuple:
        d = s.data
        return (d["study"], d["budget"], s.difficulty, tuple(d.get("seeds", [])), d["primary"],
                json.dumps({k: v for k, v in (d.get("eval") or {}).items() if k != "sampling_se_mean"}, sort_keys=True))

    def holds(big: Study, small: Study) -> bool:
        if shape(big) != shape(small) or not set(small.data["configs"]) < set(big.data["configs"]):
            return False
        metric = small.data["primary"]
        mine, theirs = small.data["metrics"][metric]["records"], big.data["metrics"][metric]["records"]
        return all(small.data["configs"][c] == big.data["configs"][c] and mine.get(c) == theirs.get(c)
                   for c in small.data["configs"])

    current = [s for s in studies if s.current]
    out = {}
    for small in current:
        bigger = [big for big in current if big is not small and holds(big, small)]
        if bigger:
            out[small.folder] = max(bigger, key=lambda b: len(b.data["configs"])).folder
    return out


def pooled_sweeps(studies: list[Study]) -> dict[str, str]:
    """sweep id -> the folder whose pooled analysis holds it."""
    return {sweep: s.folder for s in studies for sweep in s.data.get("pooled_from", []) if sweep != s.data["title"]}


def combine(verdicts: list[str]) -> str:
    """One verdict from several studies': all that decided agree -> theirs; any disagreement -> unresolved."""
    decided = {v for v in verdicts if v in (SUPPORTED, CONTRADICTED)}
    if len(decided) == 1:
        return decided.pop()
    return UNRESOLVED if verdicts else UNTESTED


# --------------------------------------------------------------------------------- the claims


def _winners(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("config")]


def _n_star_cell(row: dict) -> str:
    """One frontier row as the n* claim reads it: the tie, or n* with its P(best) and 90% set."""
    if A.n_tied(row):
        return f"tie {row['config']} ~ {row['runner_up']}" + (f" (n* 90% set {row['n_range']})"
                                                              if len(row.get("n_range") or []) > 1 else "")
    configs = f"; configs tie {row['config']} ~ {row['runner_up']}" if row.get("tie") else ""
    return f"n* {row['n']} (P(best) {row['p_best']:.2f}, n* 90% set {row.get('n_range', [row['n']])}{configs})"


def n_star_claim(studies: list[Study]) -> Claim:
    """n* grows with C, then saturates (iso-compute studies, the primary metric)."""
    claim = Claim("n* grows with C, then saturates",
                  "per iso-compute study, n* of the primary metric at each C of the frontier table (an n* within "
                  "noise of another n, and winners at the edge of the grid, decide nothing; two configs of one n "
                  "tied still name n*); growth = an untied n* at a larger C above "
                  "an untied n* at a smaller C; saturation = the analysis's own verdict (an interior, untied n* "
                  "over at least 4x in C)")
    verdicts = []
    for study in (s for s in studies if s.current and s.data["study"] == "isocompute"):
        name = study.data["primary"]
        m = study.data["metrics"][name]
        rows = _winners(m["frontier"])
        grid_n = sorted({c["n"] for c in study.data["configs"].values()})
        if len(grid_n) < 2:
            claim.evidence.append(f"{study.label()}: one n studied, so it ranks no n (not counted)")
            continue
        untied = [r for r in rows if not A.n_tied(r) and r["n"] not in (grid_n[0], grid_n[-1])]
        cells = ", ".join(f"C {r['C']:,.0f}: " + _n_star_cell(r) for r in rows)
        claim.evidence.append(f"{study.label()}, {name}: {cells}. Verdict of the analysis: {m['verdict']}")
        grows = any(b["n"] > a["n"] for i, a in enumerate(untied) for b in untied[i + 1:])
        shrinks = any(b["n"] < a["n"] for i, a in enumerate(untied) for b in untied[i + 1:])
        saturates = m.get("saturation_C") is not None and not (isinstance(m["saturation_C"], float)
                                                              and math.isnan(m["saturation_C"]))
        if shrinks and not grows:
            verdicts.append(CONTRADICTED)
        elif grows and not shrinks and saturates:
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
    for study in (s for s in studies if s.current and s.data["study"] == "isocompute"):
        family = {"easy": "worst", "hard": "best"}.get(study.difficulty)
        found = study.metric(family) if family else None
        if found is None or len({c["n"] for c in study.data["configs"].values()}) < 2:
            continue  # a single n has no trend in n
        name, m = found
        t = m.get("n_trend") or {}
        if not t:
            claim.evidence.append(f"{study.label()}, {name}: no C where two n of one Bp have fits")
            verdicts.append(UNRESOLVED)
            continue
        context = []
        for other in ("mean", "best" if family == "worst" else "worst"):
            o = study.metric(other)
            if o and o[1].get("n_trend"):
                ot = o[1]["n_trend"]
                context.append(f"{o[0]} {ot['slope_per_doubling']:+.4f} [{fmt(ot['low'], '+.4f')}, "
                               f"{fmt(ot['high'], '+.4f')}]")
        fits = m.get("fits", {})
        rising = sum(1 for f in fits.values() if f.get("not_identified"))
        claim.evidence.append(
            f"{study.label()}, {name} at C = {t['C']:,.0f}, n in {t['n']}: {t['slope_per_doubling']:+.4f} per doubling "
            f"of n, 90% CI [{fmt(t['low'], '+.4f')}, {fmt(t['high'], '+.4f')}] ({t['direction']})"
            + (f"; for comparison {', '.join(context)}" if context else "")
            + (f". {rising} of {len(fits)} fits are not identified (curves still rising at the budget): this is what n "
               "buys at this C, not at the plateau" if rising else ""))
        verdicts.append({"grows": SUPPORTED, "falls": CONTRADICTED}.get(t["direction"], UNRESOLVED))
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
    for study in (s for s in studies if s.current and s.data["study"] == "fixed-batch"):
        name = study.data["primary"]
        m = study.data["metrics"][name]
        rows = _winners(m["frontier"])
        if not rows:
            continue
        first, last = rows[0], rows[-1]
        cells = "; ".join(f"C {r['C']:,.0f}: " + (f"tie {r['config']} ~ {r['runner_up']}" if r["tie"] else
                                                   f"{r['config']} (P(best) {r['p_best']:.2f})")
                          + (f", n* 90% set {{{', '.join(map(str, r['n_range']))}}}" if r.get("n_range") else "") for r in (first, last))
        fits = m.get("fits", {})
        rising_configs = sorted(c for c in fits if fits[c].get("not_identified"))
        unbent = sorted(fits[c]["params"]["C_mid"] for c in rising_configs)
        bend = (f". {len(unbent)} of {len(fits)} {name} fits not identified (curves still rising at C = "
                f"{study.data['budget']:,}, fitted C_mid up to {unbent[-1]:,.0f}): the largest C here is not past their "
                "bend" if unbent else f". Every {name} fit identified: the curves have bent by C = {study.data['budget']:,}")
        if unbent and len(unbent) < len(fits):
            rest = len(fits) - len(unbent)
            bend += f" ({', '.join(rising_configs)}); " + ("the other one has bent" if rest == 1 else f"the other {rest} have bent")
        if unbent:
            rising.append((study, unbent[-1], rising_configs, len(fits)))
        claim.evidence.append(f"{study.label()}, {name}: {cells}{bend}")
        if first["tie"] or last["tie"]:
            verdicts.append(UNRESOLVED)
        elif last["n"] > first["n"]:
            verdicts.append(SUPPORTED)
        elif fits.get(last["config"], {}).get("not_identified", ["no fit"]):
            # the claim is about large C: a winner that still holds while its own curve rises is not past it
            claim.evidence[-1] += (f"; {last['config']} leads at both ends, but its fit is not identified, so the "
                                   "largest C is not the large C of the claim: this decides nothing")
            verdicts.append(UNRESOLVED)
        else:
            verdicts.append(CONTRADICTED)
    claim.verdict = combine(verdicts)
    if claim.verdict != SUPPORTED:
        where = ""
        if rising:
            last, c_mid, configs, fitted = max(rising, key=lambda r: r[0].data["budget"])
            which = "they had not" if len(configs) == fitted else f"{len(configs)} of {fitted} had not ({', '.join(configs)})"
            where = f" (at C = {last.data['budget']:,}, `{last.folder}`, {which}: fitted C_mid up to {c_mid:,.0f})"
        claim.needs = ("a fixed-batch study with >= 2 seeds at a budget where the primary metric's curves have bent"
                       + where
                       + ", and untied winners at both ends of the table (more seeds or eval problems where the leaders "
                         "tie)")
    return claim


LADDER = ("bf16", "fp8", "int8", "int6", "int4", "int3", "int2")
"""Rollout precisions from the mildest error to the largest."""
LOSS_SE = 2.0
"""A difference counts when it is beyond this many standard errors, in the pooled mean and in every seed."""


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
        diffs = [{**r, "diff": float(r["diff"]), "se": float(r["se"])} for r in csv.DictReader(f)]
    verdicts = {}
    for s in sorted({d["set"] for d in diffs}):
        def result(arm: str) -> tuple[dict | None, list[dict]]:
            rows = [d for d in diffs if d["set"] == s and d["arm"] == arm]
            return next((d for d in rows if d["seed"] == "all"), None), [d for d in rows if d["seed"] != "all"]

        def loses(arm: str) -> bool | None:
            pooled, seeds = result(arm)
            if pooled is None:
                return None
            return pooled["diff"] < -LOSS_SE * pooled["se"] and all(d["diff"] < 0 for d in seeds)

        shown = []
        for arm in dict.fromkeys(d["arm"] for d in diffs if d["set"] == s):
            pooled, seeds = result(arm)
            if pooled is not None:
                shown.append(f"{arm} {pooled['diff']:+.3f} ± {pooled['se']:.3f} (seeds "
                             + ", ".join(f"{d['diff']:+.3f}" for d in seeds) + ")")
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
        ratio = ais["diff"] / ais["se"] if ais["se"] > 0 else 0.0
        outcome = (CONTRADICTED, "AIS loses too") if loses(f"{level}+ais") else \
            (SUPPORTED, "AIS matches bf16 (a tie)") if ratio >= -1.0 else \
            (UNRESOLVED, "AIS between a tie with bf16 and a loss: more seeds would decide")
        tis = result(f"{level}+tis")[0]
        claim.evidence.append(f"ais-ladder, {s}: naive training first loses at {level}; {level}+ais - bf16 = "
                              f"{ais['diff']:+.3f} ± {ais['se']:.3f} ({ratio:+.2f} se): {outcome[1]}"
                              + (f"; for comparison {level}+tis - bf16 = {tis['diff']:+.3f} ± {tis['se']:.3f}"
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
        sets = sorted({d["set"] for d in diffs})
        claim.needs = (f"the ladder on every set (run so far: {', '.join(sets)}), with TIS and AIS arms at the mildest "
                       "precision where naive training loses, and more seeds where AIS sits between a tie with bf16 and "
                       "a loss (the seeds' spread is not modelled by these standard errors, which are eval noise only)")
    return claim


def holdout_outcome(study: Study, metric: str, d: dict) -> str:
    """``hit``, ``miss`` or ``tie`` for a study's decision hold-out (:func:`isosweep.report.analysis.holdout_outcome`)."""
    return A.holdout_outcome(study.data["metrics"][metric].get("frontier", []), study.data["configs"], d)


def picked_runs(study: Study, dashboards: Path, config: str) -> list | None:
    """The trials of ``config`` in the study's folder, each as (recipe, seed): the task, model and method settings
    and the seed that make it one deterministic run (see :func:`shared_runs`); None without the folder's curves."""
    path = P.curves_path(dashboards / study.folder)
    if not path.exists():
        return None
    data = SweepData.from_json(json.loads(path.read_text()), str(path))
    return sorted(list(run_key(data, c)) for c in data.curves if c.config == config) or None


def run_key(data: SweepData, curve) -> tuple[str, int]:
    """(recipe, seed) of one trial: with its config, what makes it one deterministic run -- the task, model and
    method settings (:func:`isosweep.report.planner.method`, :func:`~isosweep.report.planner.identity`) and the seed."""
    return json.dumps({**P.method(data), **P.identity(data)}, sort_keys=True), int(curve.fields.get("seed", 0))


def same_prediction(study: Study, metric: str, d: dict, runs: list | None = None) -> list[str]:
    """What a decision hold-out's pick rests on, one key per run: the set, the predicted config and each of its
    runs (``runs``, from :func:`picked_runs`). Two picks that share a run (the same deterministic trial of the
    picked config, run to the same or to another budget, or pooled with other seeds) rest on the same curve: at
    most one test of the fits, not two. Without ``runs``, one key: the set, C_max, the config and every record of
    it (each seed's running best at each evaluation)."""
    if runs is not None:
        return [json.dumps([study.difficulty, d["predicted_config"], run]) for run in runs]
    records = study.data["metrics"][metric].get("records", {}).get(d["predicted_config"])
    if records is None:  # nothing to compare: a test of its own
        return [json.dumps([study.folder, id(study)])]
    return [json.dumps([study.difficulty, d.get("C_max"), d["predicted_config"], records], sort_keys=True)]


HOLDOUTS_BY_SET = "hold-outs that decide, by set (picks that share runs counted once): "


def holdout_claim(studies: list[Study], dashboards: Path) -> Claim:
    """Fits predict 4x out."""
    claim = Claim("the fitted curves predict 4x beyond their data",
                  "decision hold-out: every config fitted on C <= C_max/4, the predicted winner and its value at C_max "
                  "against what was observed; on the real studies and on synthetic sweeps with a known truth")
    decided: list[tuple[set[str], list[tuple[str, bool]], str]] = []  # one test: its runs' keys, (folder, hit) of
    # each study whose pick rests on them, and the set of problems it was made on
    tried_on: Counter[str] = Counter()  # hold-outs per set, ties included
    for study in (s for s in studies if s.current):
        name = study.data["primary"]
        d = study.data["metrics"][name].get("decision_holdout") or {}
        if d.get("predicted_config"):
            outcome = holdout_outcome(study, name, d)
            tried_on[study.difficulty] += 1
            repeat = ""
            if outcome != "tie":
                keys = set(same_prediction(study, name, d, picked_runs(study, dashboards, d["predicted_config"])))
                shared = [test for test in decided if test[0] & keys]
                if shared:
                    repeat = (f"; the same pick as `{shared[0][1][0][0]}`'s from the same runs (its "
                              f"{d['predicted_config']} trials, deterministic, to this or another budget"
                              + (", or some of them" if not any(keys <= test[0] for test in shared) else "")
                              + "), counted once with it: one hit only if every such pick hit")
                merged = (keys.union(*(t[0] for t in shared)), [p for t in shared for p in t[1]], study.difficulty)
                decided = [t for t in decided if all(t is not u for u in shared)] + [merged]
                merged[1].append((study.folder, outcome == "hit"))
            claim.evidence.append(f"{study.label()}, {name}: predicted {d['predicted_config']} "
                                  f"({fmt(d['predicted_value'])}), observed best {d['observed_config']} -> "
                                  + A.holdout_words(outcome, d["hit"])
                                  + f", value error {fmt(d['abs_error'])}{repeat}")
        else:
            claim.evidence.append(f"{study.label()}, {name}: no hold-out ({d.get('reason', 'no data')})")
    validation = dashboards / "methods" / "validation.json"
    if validation.exists():
        v = json.loads(validation.read_text())
        synthetic = v.get("decision_holdout_hit_rate")
        if synthetic is not None:
            claim.evidence.append(f"synthetic sweeps (`methods/`, {v.get('decision_holdout_possible', '?')} hold-outs): "
                                  f"decision hold-out hit rate {synthetic:.2f}, median value error "
                                  f"{fmt(v.get('decision_holdout_value_error_median_abs'))}")
    per_set: dict[str, list[bool]] = {}  # set -> whether each prediction that decided hit
    for _, same, on_set in decided:
        per_set.setdefault(on_set, []).append(all(hit for _, hit in same))
    hits = [hit for on_set in per_set.values() for hit in on_set]
    tied_sets = sorted(set(tried_on) - set(per_set))
    if per_set:
        claim.evidence.append(HOLDOUTS_BY_SET
                              + "; ".join(f"{s} {len(v)} ({sum(v)} hit)" for s, v in sorted(per_set.items()))
                              + "".join(f"; {s} none ({tried_on[s]} hold-out{'s' * (tried_on[s] > 1)}, every one "
                                        "a tie)" for s in tied_sets))
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
    return claim


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


def planning_section(dashboards: Path, bootstrap: int = 100, holdouts: Claim | None = None) -> list[str]:
    """What to run at each of :data:`PLAN_BUDGETS`, per task/difficulty/model and method, from the study
    folders that keep their trials' curves (``curves.json``), with the warnings and a leave-one-budget-out check.
    ``holdouts`` (:func:`holdout_claim`'s verdict on the real studies) says how far a pick beyond the data is
    to be trusted."""
    lines = ["", "## What to run at C = 1e5, 1e6, 1e7", "",
             "From `isosweep recommend --budget C --from dashboards` (the planner: every study folder of one task, "
             "difficulty, model and method pooled by allocation; predicted value with its 90% interval, P(best) from "
             f"{bootstrap} bootstrap replicates over seeds, sweeps and paired eval problems). Beyond the data the "
             "values are fits extrapolated, flagged below: read them as a direction and run the suggested sweep "
             "(`--suggest`) before acting on them."]
    if holdouts is not None:
        by_set = next((e[len(HOLDOUTS_BY_SET):] for e in holdouts.evidence if e.startswith(HOLDOUTS_BY_SET)), "")
        lines[-1] += (f" Whether such fits pick the winner 4x beyond their data is the claim \"{holdouts.title}\" "
                      f"above: **{holdouts.verdict}**" + (f" (hold-outs that decide: {by_set})" if by_set else "") + ".")
    sweeps = P.load_folders(dashboards)
    if not sweeps:
        return lines + ["", "No study folder keeps its trials' curves (`curves.json`, written by `make report` and at "
                            "the end of each sweep): nothing to plan from yet."]
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
                  "Rests on: " + ", ".join(f"`{s['sweep_id']}` (C = {s['budget']:,}, {s['trials']} trials"
                                           + (f"; {s['repeats_left_out']} left out as repeats of the same run in "
                                              "another sweep" if s["repeats_left_out"] else "") + ")"
                                           for s in planner.sources()) + f"; data reach C = {planner.data_C:,.0f}.", "",
                  f"| C | run (n, Bp, M) | predicted {planner.metric} [90%] | P(best) | within noise | flags |",
                  "| --- | --- | --- | --- | --- | --- |"]
        notes: dict[str, list[str]] = {}
        for C in PLAN_BUDGETS:
            rec = planner.at(C)
            close = ", ".join(c["config"] for c in rec.within_noise()) or "none"
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
        full = planner.at(check["C_max"])
        tied = [c["config"] for c in full.contenders if c["within_noise"]]
        lines += ["", f"Leave-one-budget-out: from the data at C <= {check['from_C']:,.0f} only, the planner picks, "
                      f"among the {len(check['candidates'])} allocations run to C = {check['C_max']:,}, "
                      f"{check['recommended']} (predicted {fmt(check['predicted'])} "
                      f"[{fmt(check['low'])}, {fmt(check['high'])}], P(best) {check['p_best']:.2f}); observed there: "
                      f"{fmt(check['observed_recommended'])} (inside its interval: "
                      f"{'yes' if check['covered'] else 'no'}), the observed best {check['observed_best']} "
                      f"{fmt(check['observed_best_value'])} (shortfall {fmt(check['shortfall'])}); with all the data "
                      f"the allocations within noise of the best at C = {check['C_max']:,} are "
                      f"{', '.join(tied)}, so the pick is "
                      + ("among them." if check["recommended"] in tied else "not among them.")]
    return lines


def shared_runs(dashboards: Path) -> list[str]:
    """Lines naming the studies that ran the same trial (same allocation, seed, task, model and method: a
    deterministic run measured twice), so their verdicts are read as not independent."""
    owners: dict[tuple, list[str]] = {}
    for data in P.load_folders(dashboards):
        for c in data.curves:
            recipe, seed = run_key(data, c)
            owners.setdefault((recipe, c.config, seed), []).append(data.sweep_id)
    pairs: dict[tuple[str, ...], list[str]] = {}
    for (_, config, seed), ids in owners.items():
        if len(ids) > 1:
            pairs.setdefault(tuple(sorted(ids)), []).append(f"{config} seed {seed}")
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


def build_report(dashboards: str | Path) -> str:
    """REPORT.md's text from the studies under ``dashboards``."""
    dashboards = Path(dashboards)
    studies = load_studies(dashboards)
    holdouts = holdout_claim(studies, dashboards)
    claims = [n_star_claim(studies), n_metric_claim(studies), fixed_batch_claim(studies), ais_claim(dashboards),
              holdouts]
    lines = ["# What the studies found", "",
             "Generated by `make report` (`isosweep report`) from the study folders in this directory; every number "
             "comes from a study's `fits.json` (its frontier analysis, redone from MLflow by `isosweep frontier "
             "<sweep-id> --dashboards dashboards/<study>`). Verdicts: **supported** or **contradicted** only when "
             "the data decide beyond their noise (90% intervals from a bootstrap over seeds and paired eval "
             "problems); a difference inside its interval is a tie and decides nothing. A study's numbers are those of "
             "the base model it ran on, named below by its eval set (the easy and hard sets come from that model's "
             "pass rates): a tiny base model built by isosweep before warm-up version 2 depended on the CPU that "
             "built it, so a sweep run on another machine or version may start elsewhere and score other problems.",
             "",
             "| claim | verdict |", "| --- | --- |"]
    lines += [f"| {c.title} | **{c.verdict}** |" for c in claims]
    for c in claims:
        lines += ["", f"## {c.title}", "", f"**Verdict: {c.verdict}.**", "", f"Test: {c.test}.", ""]
        lines += [f"- {e}" for e in c.evidence] or ["- no study of the current method tests this yet"]
        if c.needs:
            lines += ["", f"What it would take: {c.needs}."]
    lines += planning_section(dashboards, holdouts=holdouts)
    lines += ["", "## Studies", ""]
    every = [Study(path.parent.name, json.loads(path.read_text())) for path in sorted(dashboards.glob("*/fits.json"))]
    pooled = pooled_sweeps(every)
    for sweep, folder in sorted(pooled.items()):
        lines.append(f"- sweep `{sweep}`: its trials are pooled into `{folder}` and counted there")
    for small, big in sorted(contained_studies([s for s in every if s.data["title"] not in pooled]).items()):
        lines.append(f"- `{small}`: every trial of it is also in `{big}` (the same configs, seeds and numbers), "
                     "counted there")
    for s in studies:
        if s.current:
            lines.append(f"- {s.label()}: {s.data['trials']} trials, {s.data['noise']}{_scored_on(dashboards / s.folder)}")
        else:
            lines.append(f"- `{s.folder}`: analysed with the earlier method (record points only, R0 fitted, one seed, "
                         "no paired counts): shown in its folder, not used for any verdict above")
    lines += shared_runs(dashboards)
    pick = _pilot_pick(dashboards)
    if pick:
        lines += ["", f"Learning rate of the default recipe (`calibration/summary.md`): {pick.replace('**', '')}."]
    return "\n".join(lines) + "\n"


def _inline(text: str) -> str:
    """Escaped ``text`` with the report's inline markdown: ``**bold**`` and `` `code` ``."""
    out = html.escape(text, quote=False)
    out = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def to_html(markdown: str, title: str = "What the studies found") -> str:
    """The report's markdown (headings, paragraphs, bullet lists, pipe tables, bold, code) as one standalone
    HTML page."""
    body, rows, items, para = [], [], [], []

    def flush() -> None:
        if para:
            body.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()
        if rows:
            cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows
                     if not re.fullmatch(r"\|?[\s\-|:]+\|?", r.strip())]
            head, *rest = cells
            body.append("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead><tbody>"
                        + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rest)
                        + "</tbody></table>")
            rows.clear()

    for line in markdown.splitlines():
        heading = re.match(r"(#{1,4}) (.*)", line)
        if heading:
            flush()
            level = len(heading.group(1))
            body.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif line.startswith("|"):
            if para or items:
                flush()
            rows.append(line)
        elif line.startswith("- "):
            if para or rows:
                flush()
            items.append(line[2:])
        elif not line.strip():
            flush()
        elif items:
            items[-1] += " " + line.strip()
        else:
            para.append(line.strip())
    flush()
    style = ("body{font-family:sans-serif;max-width:70em;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}"
             "code{background:#f4f4f4}")
    return (f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def write_report(dashboards: str | Path) -> Path:
    """``REPORT.md`` and the same as ``report.html`` in ``dashboards``; returns the markdown's path."""
    path = Path(dashboards) / "REPORT.md"
    text = build_report(dashboards)
    path.write_text(text)
    (Path(dashboards) / "report.html").write_text(to_html(text))
    return path
