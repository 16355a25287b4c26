"""The AIS experiment: does correcting low-precision rollouts recover bf16 training?

Each arm is one ordinary trial (Ray Train job) on the same base model and budget, named
``<precision>[+<correction>]``: the rollout copy's weights at ``precision`` (``bf16``, ``fp8``, or an
integer grid ``int8`` ... ``int2`` -- a ladder of rollout errors, see
:func:`isosweep.rollout.fp8.int_roundtrip`) and the trainer's off-policy correction (``none``, ``tis``,
``ais``). The default arms are ``bf16``, ``fp8+none``, ``fp8+tis``, ``fp8+ais`` on the easy and the hard
set, one seed. Rollouts come from vLLM where it is installed: the mismatch under study is a serving
engine's, so ``auto`` (the in-process engine for tiny models on CPU) is not used.

The study writes, under its output directory: ``table.csv`` / ``table.md`` (per arm and seed: final and
best eval mean@k, mean mismatch, mean alpha early and late), ``vs_bf16.md`` / ``vs_bf16.csv`` (per arm, the final mean@k
minus the bf16 arm's of the same seed and set, paired over the same eval problems, with its standard
error), ``alpha.csv`` (alpha per step of every arm) and ``ais_study.png``.

    isosweep ais-study --budget 20000 --out dashboards/ais-study
    isosweep ais-study --sets easy --arms bf16,int4,int3,int2 --seeds 0,1 --out dashboards/ais-ladder

Arms that already ran are resumed (each run directory holds its checkpoints), so an interrupted
study continues where it stopped. A study extended by more seeds or arms into the same ``--out`` keeps
the rows its earlier runs wrote there for the set/arm/seed combinations it does not run again (read
back from ``table.csv``, ``vs_bf16.csv`` and ``alpha.csv``; their run directories are not needed), and
pools over all of them.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import astuple, dataclass, field
from pathlib import Path

from isosweep.rollout import vllm_available
from isosweep.spec.trial import load_trial
from isosweep.track.curves import COUNTS_KEY, SAMPLES_KEY
from isosweep.trial.files import TrialDir
from isosweep.trial.job import ray_init, run_trial

DEFAULT_ARMS = ("bf16", "fp8+none", "fp8+tis", "fp8+ais")
SETS = ("easy", "hard")
ENGINE = "vllm" if vllm_available() else "hf"
ARM_COLUMNS = ("start_mean@k", "final_mean@k", "best_mean@k", "logp_abs_diff", "ratio_max", "alpha_early", "alpha_late")
"""The columns of ``table.csv`` after set, arm and seed, in :class:`ArmSummary`'s field order."""


@dataclass(frozen=True)
class ArmSummary:
    """One trial's figures: start, final and best eval mean@k, mean mismatch (``|logp diff|``), the largest
    importance ratio, and mean alpha over the first and last thirds of training."""

    start_mean: float
    final_mean: float
    best_mean: float
    logp_abs_diff: float
    ratio_max: float
    alpha_early: float
    alpha_late: float

    def to_json(self) -> dict[str, float]:
        return dict(zip(ARM_COLUMNS, astuple(self)))

    @classmethod
    def from_json(cls, data: dict[str, float]) -> ArmSummary:
        return cls(*(data[c] for c in ARM_COLUMNS))


@dataclass(frozen=True)
class ArmRun:
    """One set x arm x seed of the study: its summary (a row of ``table.csv``) and, for the paired test and the
    plot, its eval records and steps (empty for a row read back from ``table.csv``)."""

    difficulty: str
    arm: str
    seed: int
    summary: ArmSummary
    records: list[dict] = field(default_factory=list, compare=False, repr=False)
    steps: list[dict] = field(default_factory=list, compare=False, repr=False)

    def to_json(self) -> dict:
        """The row of ``table.csv``: set, arm, seed, then :data:`ARM_COLUMNS`."""
        return {"set": self.difficulty, "arm": self.arm, "seed": self.seed, **self.summary.to_json()}

    @classmethod
    def from_json(cls, data: dict) -> ArmRun:
        return cls(data["set"], data["arm"], data["seed"], ArmSummary.from_json(data))


@dataclass(frozen=True)
class PairedDiff:
    """An arm's final eval mean@k minus the bf16 arm's of the same set and seed (``seed`` ``"all"``: the mean
    over seeds), with its standard error: a row of ``vs_bf16.csv``."""

    difficulty: str
    arm: str
    seed: int | str
    diff: float
    se: float

    def to_json(self) -> dict:
        return {"set": self.difficulty, "arm": self.arm, "seed": self.seed, "diff": self.diff, "se": self.se}

    @classmethod
    def from_json(cls, data: dict) -> PairedDiff:
        return cls(data["set"], data["arm"], data["seed"], data["diff"], data["se"])


@dataclass(frozen=True)
class AlphaPoint:
    """One step of one arm: AIS alpha and the mean ``|logp diff|`` (a row of ``alpha.csv``)."""

    difficulty: str
    arm: str
    seed: int
    step: int
    rollouts: int
    alpha: float
    logp_abs_diff: float

    def to_json(self) -> dict:
        return {"set": self.difficulty, "arm": self.arm, "seed": self.seed, "step": self.step,
                "rollouts": self.rollouts, "alpha": self.alpha, "logp_abs_diff": self.logp_abs_diff}

    @classmethod
    def from_json(cls, data: dict) -> AlphaPoint:
        return cls(data["set"], data["arm"], data["seed"], data["step"], data["rollouts"], data["alpha"],
                   data["logp_abs_diff"])

    @classmethod
    def of_step(cls, run: ArmRun, step: dict) -> AlphaPoint:
        return cls(run.difficulty, run.arm, run.seed, step["step"], step["rollouts"], step["ais/alpha"],
                   step["mismatch/logp_abs_diff_mean"])


@dataclass(frozen=True)
class Earlier:
    """What an earlier run of the study wrote to its folder for the combinations a new run does not redo."""

    table: list[ArmRun]
    paired: list[PairedDiff]
    alpha: list[AlphaPoint]


def arm_overrides(arm: str) -> list[str]:
    """``"int4+tis"`` -> the trial overrides of that arm (no ``+``: correction ``none``)."""
    precision, _, correction = arm.partition("+")
    return [f"rollout.precision={precision}", f"algorithm.correction={correction or 'none'}"]


def run_dir_name(difficulty: str, arm: str, seed: int) -> str:
    """Seed 0 keeps the name of the study's first, one-seed runs, so they resume."""
    return f"{difficulty}-{arm.replace('+', '-')}" + (f"-s{seed}" if seed else "")


def summarize_arm(records: list[dict], steps: list[dict], k: int) -> ArmSummary:
    """Start, final and best eval mean@k, mean mismatch, and mean alpha over the first and last thirds of training."""
    key = f"eval/mean@{k}"
    third = max(1, len(steps) // 3)
    mean = lambda rows, name: sum(r[name] for r in rows) / len(rows)  # noqa: E731
    return ArmSummary(records[0][key], records[-1][key], max(r[key] for r in records),
                      mean(steps, "mismatch/logp_abs_diff_mean"), max(r["mismatch/ratio_max"] for r in steps),
                      mean(steps[:third], "ais/alpha"), mean(steps[-third:], "ais/alpha"))


def run_study(out: str | Path, budget: int, trials_dir: Path = Path("sweeps/trials"), extra: list[str] | None = None,
              address: str | None = None, log: Callable[[str], None] = print, arms: tuple[str, ...] = DEFAULT_ARMS,
              sets: tuple[str, ...] = SETS, seeds: tuple[int, ...] = (0,)) -> list[ArmRun]:
    """Run every set x seed x arm (resuming any that exist) and write the tables, alpha trace and plot to
    ``out``. Each arm's config is checked before the first trial starts."""
    out = Path(out)
    plan = [(difficulty, seed, arm, load_trial(trials_dir / f"{difficulty}.yaml",
                                               [f"budget={budget}", f"rollout.engine={ENGINE}", f"seed={seed}",
                                                *arm_overrides(arm), *(extra or [])]))
            for difficulty in sets for seed in seeds for arm in arms]
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    ray_init(address)  # one Ray for every arm
    for difficulty, seed, arm, cfg in plan:
        run_dir = out / "runs" / run_dir_name(difficulty, arm, seed)
        log(f"[ais-study] {difficulty} / {arm} / seed {seed}")
        records = run_trial(cfg, run_dir, address=address, log=log)
        steps = TrialDir(run_dir).steps()
        rows.append(ArmRun(difficulty, arm, seed, summarize_arm(records, steps, cfg.eval.k), records, steps))
    write_outputs(out, rows)
    return rows


def paired_vs_bf16(rows: list[ArmRun]) -> list[PairedDiff]:
    """Per set, arm and seed: the final eval's mean@k minus the bf16 arm's (same set and seed), paired over
    the eval problems (each problem's fraction correct), with the standard error of that mean difference;
    then per set and arm the mean over seeds, its standard error the root of the seeds' summed variances over
    the number of seeds (eval noise only: with two seeds the spread between seeds is shown, not modelled)."""
    base = {(r.difficulty, r.seed): r for r in rows if r.arm == "bf16"}
    out = []
    for r in rows:
        ref = base.get((r.difficulty, r.seed))
        if r.arm == "bf16" or ref is None or COUNTS_KEY not in r.records[-1] or COUNTS_KEY not in ref.records[-1]:
            continue
        a, b = r.records[-1][COUNTS_KEY], ref.records[-1][COUNTS_KEY]
        samples = r.records[-1].get(SAMPLES_KEY) or ref.records[-1].get(SAMPLES_KEY)
        if len(a) != len(b) or not samples:
            continue
        diffs = [(x - y) / samples for x, y in zip(a, b)]
        mean = sum(diffs) / len(diffs)
        var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
        out.append(PairedDiff(r.difficulty, r.arm, r.seed, mean, math.sqrt(var / len(diffs))))
    return out + pool_seeds(out)


def pool_seeds(per_seed: list[PairedDiff]) -> list[PairedDiff]:
    """Per set and arm, the mean over seeds of :func:`paired_vs_bf16`'s per-seed rows (``seed`` = ``all``)."""
    out = [d for d in per_seed if d.seed != "all"]
    pooled = []
    for key in dict.fromkeys((d.difficulty, d.arm) for d in out):
        group = [d for d in out if (d.difficulty, d.arm) == key]
        mean = sum(d.diff for d in group) / len(group)
        se = math.sqrt(sum(d.se ** 2 for d in group)) / len(group)
        pooled.append(PairedDiff(key[0], key[1], "all", mean, se))
    return pooled


def _number(text: str):
    """A CSV cell back as the int or float it was written from (text otherwise)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def earlier_rows(out: Path, fresh: set[tuple[str, str, str]]) -> Earlier:
    """What an earlier run of the study wrote to ``out`` for the (set, arm, seed) combinations not in ``fresh``:
    the rows of ``table.csv`` and ``alpha.csv`` and the per-seed rows of ``vs_bf16.csv`` (values parsed back)."""

    def kept(file: str, kind):
        path = out / file
        rows = list(csv.DictReader(path.open(newline=""))) if path.exists() else []
        return [kind.from_json({k: _number(v) for k, v in r.items()}) for r in rows
                if r["seed"] != "all" and (r["set"], r["arm"], r["seed"]) not in fresh]

    return Earlier(kept("table.csv", ArmRun), kept("vs_bf16.csv", PairedDiff), kept("alpha.csv", AlphaPoint))


def write_outputs(out: Path, rows: list[ArmRun]) -> None:
    """``table.csv``, ``table.md``, ``vs_bf16.md``, ``vs_bf16.csv``, ``alpha.csv`` and ``ais_study.png``; the
    tables keep the rows of earlier runs into ``out`` that ``rows`` does not redo (:func:`earlier_rows`), the
    plot shows ``rows`` only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = earlier_rows(out, {(r.difficulty, r.arm, str(r.seed)) for r in rows})
    columns = ["set", "arm", "seed", *ARM_COLUMNS]
    table = [r.to_json() for r in kept.table + rows]
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for r in table:
        lines.append("| " + " | ".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in columns) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    per_seed = kept.paired + [d for d in paired_vs_bf16(rows) if d.seed != "all"]
    paired = per_seed + pool_seeds(per_seed)
    lines = ["Final eval mean@k minus the bf16 arm's (same set and seed), paired over the same eval problems; "
             "se: standard error from eval noise (seed 'all': the mean over seeds).", "",
             "| set | arm | seed | diff | se | diff / se |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {d.difficulty} | {d.arm} | {d.seed} | {d.diff:+.4f} | {d.se:.4f} | {d.diff / d.se:+.1f} |"
              for d in paired if d.se > 0]
    (out / "vs_bf16.md").write_text("\n".join(lines) + "\n")
    with open(out / "vs_bf16.csv", "w", newline="") as f:  # what the study report reads
        writer = csv.DictWriter(f, fieldnames=["set", "arm", "seed", "diff", "se"])
        writer.writeheader()
        writer.writerows(d.to_json() for d in paired)
    alpha = kept.alpha + [AlphaPoint.of_step(r, s) for r in rows for s in r.steps]
    with open(out / "alpha.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["set", "arm", "seed", "step", "rollouts", "alpha", "logp_abs_diff"])
        writer.writerows(astuple(point) for point in alpha)

    sets = list(dict.fromkeys(r.difficulty for r in rows))
    fig, axes = plt.subplots(2, len(sets), figsize=(5.5 * len(sets), 7), squeeze=False)
    for col, difficulty in enumerate(sets):
        for r in (r for r in rows if r.difficulty == difficulty):
            key = next(k for k in r.records[0] if k.startswith("eval/mean@"))
            axes[0][col].plot([x["rollouts"] for x in r.records], [x[key] for x in r.records],
                              marker="o", label=f"{r.arm} s{r.seed}")
            axes[1][col].plot([s["rollouts"] for s in r.steps], [s["ais/alpha"] for s in r.steps],
                              label=f"{r.arm} s{r.seed}", alpha=0.8)
        axes[0][col].set(title=f"{difficulty} set", xlabel="rollouts", ylabel="eval mean@k")
        axes[1][col].set(xlabel="rollouts", ylabel="AIS alpha (per step)", ylim=(0, 1.05))
        axes[0][col].legend()
        axes[1][col].legend()
    fig.tight_layout()
    fig.savefig(out / "ais_study.png", dpi=110)
    plt.close(fig)
