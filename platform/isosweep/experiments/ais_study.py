"""The AIS experiment: does correcting FP8 rollouts recover bf16 training?

Four arms on the same base model, seed and budget -- ``bf16`` (rollouts from bf16 weights, no
correction), ``fp8+none``, ``fp8+tis`` and ``fp8+ais`` -- on the easy and the hard set. Each arm
is one ordinary trial (Ray Train job) with vLLM rollouts where vLLM is installed: the mismatch
under study is a serving engine's, so ``auto`` (the in-process engine for tiny models on CPU) is
not used. The study writes, under its output directory: ``table.csv`` / ``table.md`` (final and
best eval mean@k, mean mismatch, mean alpha early and late), ``alpha.csv`` (alpha per step of
every arm) and ``ais_study.png``.

    isosweep ais-study --budget 20000 --out dashboards/ais-study

Arms that already ran are resumed (each run directory holds its checkpoints), so an interrupted
study continues where it stopped.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from isosweep.rollout import vllm_available
from isosweep.spec.trial import load_trial
from isosweep.trial.files import TrialDir
from isosweep.trial.job import ray_init, run_trial

ARMS: dict[str, list[str]] = {
    "bf16": ["rollout.precision=bf16", "algorithm.correction=none"],
    "fp8+none": ["rollout.precision=fp8", "algorithm.correction=none"],
    "fp8+tis": ["rollout.precision=fp8", "algorithm.correction=tis"],
    "fp8+ais": ["rollout.precision=fp8", "algorithm.correction=ais"],
}
SETS = ("easy", "hard")
ENGINE = "vllm" if vllm_available() else "hf"


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
              address: str | None = None, log: Callable[[str], None] = print) -> list[dict]:
    """Run the 2 x 4 arms (resuming any that exist) and write the table, alpha trace and plot to ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    ray_init(address)  # one Ray for every arm
    for difficulty in SETS:
        for arm, overrides in ARMS.items():
            cfg = load_trial(trials_dir / f"{difficulty}.yaml",
                             [f"budget={budget}", f"rollout.engine={ENGINE}", *overrides, *(extra or [])])
            run_dir = out / "runs" / f"{difficulty}-{arm.replace('+', '-')}"
            log(f"[ais-study] {difficulty} / {arm}")
            records = run_trial(cfg, run_dir, address=address, log=log)
            steps = TrialDir(run_dir).steps()
            rows.append({"set": difficulty, "arm": arm, **summarize_arm(records, steps, cfg.eval.k),
                         "_records": records, "_steps": steps})
    write_outputs(out, rows)
    return rows


def write_outputs(out: Path, rows: list[dict]) -> None:
    """``table.csv``, ``table.md``, ``alpha.csv`` and ``ais_study.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = [c for c in rows[0] if not c.startswith("_")]
    with open(out / "table.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows({c: r[c] for c in columns} for r in rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in columns) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    with open(out / "alpha.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["set", "arm", "step", "rollouts", "alpha", "logp_abs_diff"])
        for r in rows:
            for s in r["_steps"]:
                writer.writerow([r["set"], r["arm"], s["step"], s["rollouts"], s["ais/alpha"],
                                 s["mismatch/logp_abs_diff_mean"]])

    fig, axes = plt.subplots(2, len(SETS), figsize=(11, 7), squeeze=False)
    for col, difficulty in enumerate(SETS):
        for r in (r for r in rows if r["set"] == difficulty):
            key = next(k for k in r["_records"][0] if k.startswith("eval/mean@"))
            axes[0][col].plot([x["rollouts"] for x in r["_records"]], [x[key] for x in r["_records"]],
                              marker="o", label=r["arm"])
            axes[1][col].plot([s["rollouts"] for s in r["_steps"]], [s["ais/alpha"] for s in r["_steps"]],
                              label=r["arm"], alpha=0.8)
        axes[0][col].set(title=f"{difficulty} set", xlabel="rollouts", ylabel="eval mean@k")
        axes[1][col].set(xlabel="rollouts", ylabel="AIS alpha (per step)", ylim=(0, 1.05))
        axes[0][col].legend()
        axes[1][col].legend()
    fig.tight_layout()
    fig.savefig(out / "ais_study.png", dpi=110)
    plt.close(fig)
