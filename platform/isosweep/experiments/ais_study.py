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
from pathlib import Path

from isosweep.rollout import vllm_available
from isosweep.spec.trial import load_trial
from isosweep.track.curves import COUNTS_KEY, SAMPLES_KEY
from isosweep.trial.files import TrialDir
from isosweep.trial.job import ray_init, run_trial

DEFAULT_ARMS = ("bf16", "fp8+none", "fp8+tis", "fp8+ais")
SETS = ("easy", "hard")
ENGINE = "vllm" if vllm_available() else "hf"


def arm_overrides(arm: str) -> list[str]:
    """``"int4+tis"`` -> the trial overrides of that arm (no ``+``: correction ``none``)."""
    precision, _, correction = arm.partition("+")
    return [f"rollout.precision={precision}", f"algorithm.correction={correction or 'none'}"]


def run_dir_name(difficulty: str, arm: str, seed: int) -> str:
    """Seed 0 keeps the name of the study's first, one-seed runs, so they resume."""
    return f"{difficulty}-{arm.replace('+', '-')}" + (f"-s{seed}" if seed else "")


def summarize_arm(records: list[dict], steps: list[dict], k: int) -> dict[str, float]:
    """Final and best eval mean@k, mean mismatch, and mean alpha over the first and last thirds of training."""
    key = f"eval/mean@{k}"
    third = max(1, len(steps) // 3)
    mean = lambda rows, name: sum(r[name] for r in rows) / len(rows)  # noqa: E731
    return {
        "start_mean@k": records[0][key],
        "final_mean@k": records[-1][key],
        "best_mean@k": max(r[key] for r in records),
        "logp_abs_diff": mean(steps, "mismatch/logp_abs_diff_mean"),
        "ratio_max": max(r["mismatch/ratio_max"] for r in steps),
        "alpha_early": mean(steps[:third], "ais/alpha"),
        "alpha_late": mean(steps[-third:], "ais/alpha"),
    }


def run_study(out: str | Path, budget: int, trials_dir: Path = Path("sweeps/trials"), extra: list[str] | None = None,
              address: str | None = None, log: Callable[[str], None] = print, arms: tuple[str, ...] = DEFAULT_ARMS,
              sets: tuple[str, ...] = SETS, seeds: tuple[int, ...] = (0,)) -> list[dict]:
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
        rows.append({"set": difficulty, "arm": arm, "seed": seed, **summarize_arm(records, steps, cfg.eval.k),
                     "_records": records, "_steps": steps})
    write_outputs(out, rows)
    return rows


def paired_vs_bf16(rows: list[dict]) -> list[dict]:
    """Per set, arm and seed: the final eval's mean@k minus the bf16 arm's (same set and seed), paired over
    the eval problems (each problem's fraction correct), with the standard error of that mean difference;
    then per set and arm the mean over seeds, its standard error the root of the seeds' summed variances over
    the number of seeds (eval noise only: with two seeds the spread between seeds is shown, not modelled)."""
    base = {(r["set"], r["seed"]): r for r in rows if r["arm"] == "bf16"}
    out = []
    for r in rows:
        ref = base.get((r["set"], r["seed"]))
        if r["arm"] == "bf16" or ref is None or COUNTS_KEY not in r["_records"][-1] or COUNTS_KEY not in ref["_records"][-1]:
            continue
        a, b = r["_records"][-1][COUNTS_KEY], ref["_records"][-1][COUNTS_KEY]
        samples = r["_records"][-1].get(SAMPLES_KEY) or ref["_records"][-1].get(SAMPLES_KEY)
        if len(a) != len(b) or not samples:
            continue
        diffs = [(x - y) / samples for x, y in zip(a, b)]
        mean = sum(diffs) / len(diffs)
        var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
        out.append({"set": r["set"], "arm": r["arm"], "seed": r["seed"], "diff": mean, "se": math.sqrt(var / len(diffs))})
    return out + pool_seeds(out)


def pool_seeds(per_seed: list[dict]) -> list[dict]:
    """Per set and arm, the mean over seeds of :func:`paired_vs_bf16`'s per-seed rows (``seed`` = ``all``)."""
    out = [d for d in per_seed if d["seed"] != "all"]
    pooled = []
    for key in dict.fromkeys((d["set"], d["arm"]) for d in out):
        group = [d for d in out if (d["set"], d["arm"]) == key]
        mean = sum(d["diff"] for d in group) / len(group)
        se = math.sqrt(sum(d["se"] ** 2 for d in group)) / len(group)
        pooled.append({"set": key[0], "arm": key[1], "seed": "all", "diff": mean, "se": se})
    return pooled


def _number(text: str):
    """A CSV cell back as the int or float it was written from (text otherwise)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def earlier_rows(out: Path, fresh: set[tuple[str, str, str]]) -> dict[str, list[dict]]:
    """What an earlier run of the study wrote to ``out`` for the (set, arm, seed) combinations not in ``fresh``:
    ``table`` and ``alpha`` rows and the per-seed ``paired`` rows of ``vs_bf16.csv`` (values parsed back)."""
    kept = {}
    for name, file in (("table", "table.csv"), ("paired", "vs_bf16.csv"), ("alpha", "alpha.csv")):
        path = out / file
        rows = list(csv.DictReader(path.open(newline=""))) if path.exists() else []
        kept[name] = [{k: _number(v) for k, v in r.items()} for r in rows
                      if r["seed"] != "all" and (r["set"], r["arm"], r["seed"]) not in fresh]
    return kept


def write_outputs(out: Path, rows: list[dict]) -> None:
    """``table.csv``, ``table.md``, ``vs_bf16.md``, ``vs_bf16.csv``, ``alpha.csv`` and ``ais_study.png``; the
    tables keep the rows of earlier runs into ``out`` that ``rows`` does not redo (:func:`earlier_rows`), the
    plot shows ``rows`` only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = earlier_rows(out, {(r["set"], r["arm"], str(r["seed"])) for r in rows})
    columns = [c for c in rows[0] if not c.startswith("_")]
    table = kept["table"] + [{c: r[c] for c in columns} for r in rows]
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(table)
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for r in table:
        lines.append("| " + " | ".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in columns) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    per_seed = kept["paired"] + [d for d in paired_vs_bf16(rows) if d["seed"] != "all"]
    paired = per_seed + pool_seeds(per_seed)
    lines = ["Final eval mean@k minus the bf16 arm's (same set and seed), paired over the same eval problems; "
             "se: standard error from eval noise (seed 'all': the mean over seeds).", "",
             "| set | arm | seed | diff | se | diff / se |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {d['set']} | {d['arm']} | {d['seed']} | {d['diff']:+.4f} | {d['se']:.4f} | {d['diff'] / d['se']:+.1f} |"
              for d in paired if d["se"] > 0]
    (out / "vs_bf16.md").write_text("\n".join(lines) + "\n")
    with open(out / "vs_bf16.csv", "w", newline="") as f:  # what the study report reads
        writer = csv.DictWriter(f, fieldnames=["set", "arm", "seed", "diff", "se"])
        writer.writeheader()
        writer.writerows(paired)
    with open(out / "alpha.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["set", "arm", "seed", "step", "rollouts", "alpha", "logp_abs_diff"])
        writer.writerows([r[c] for c in ("set", "arm", "seed", "step", "rollouts", "alpha", "logp_abs_diff")]
                         for r in kept["alpha"])
        for r in rows:
            for s in r["_steps"]:
                writer.writerow([r["set"], r["arm"], r["seed"], s["step"], s["rollouts"], s["ais/alpha"],
                                 s["mismatch/logp_abs_diff_mean"]])

    sets = list(dict.fromkeys(r["set"] for r in rows))
    fig, axes = plt.subplots(2, len(sets), figsize=(5.5 * len(sets), 7), squeeze=False)
    for col, difficulty in enumerate(sets):
        for r in (r for r in rows if r["set"] == difficulty):
            key = next(k for k in r["_records"][0] if k.startswith("eval/mean@"))
            axes[0][col].plot([x["rollouts"] for x in r["_records"]], [x[key] for x in r["_records"]],
                              marker="o", label=f"{r['arm']} s{r['seed']}")
            axes[1][col].plot([s["rollouts"] for s in r["_steps"]], [s["ais/alpha"] for s in r["_steps"]],
                              label=f"{r['arm']} s{r['seed']}", alpha=0.8)
        axes[0][col].set(title=f"{difficulty} set", xlabel="rollouts", ylabel="eval mean@k")
        axes[1][col].set(xlabel="rollouts", ylabel="AIS alpha (per step)", ylim=(0, 1.05))
        axes[0][col].legend()
        axes[1][col].legend()
    fig.tight_layout()
    fig.savefig(out / "ais_study.png", dpi=110)
    plt.close(fig)
