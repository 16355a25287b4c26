"""The learning-rate pilot that picks the default recipe's ``algorithm.lr_ref``.

Grid: ``lr_ref`` (log-spaced, 1.6 decades) x the smallest and the largest batch (``Bp * n``) of the
default iso-compute grid x seeds, every trial at the same budget C on the trial file's task. Each
trial is an ordinary trial (Ray Train job, the default engine), so what the pilot picks is what a
sweep runs. Per trial it reads:

- **gain**: mean@k at the end (the mean of the last two evaluations, which halves the eval noise)
  minus the base model's mean@k (the evaluation at rollouts 0);
- **health**: no collapse (no evaluation below the base by more than ``COLLAPSE_DROP``, and the
  end within ``PEAK_DROP`` of the trial's best), entropy kept (the last third of steps above
  ``ENTROPY_KEEP`` of the first step's), KL bounded (mean ``train/kl`` of the last third of steps
  at most ``KL_MAX``, where KL is measured).

The pick, among the ``lr_ref`` healthy in every trial (the default must work at both ends of the
grid): each lr's *worst-batch gain* (the gain averaged over seeds at the worse of the two batch
sizes) with its standard error; the lrs whose worst-batch gain is within ``TIE_SE`` standard errors
of the best one are tied, and the pick is the largest of them (the fastest progress that stays
healthy: a smaller lr that is not measurably better only learns slower). A cell's standard error
is the larger of the seeds' (half their range, for two) and what the eval noise alone gives a
gain over that many seeds (``eval/stderr_mean@k`` x sqrt(1.5) / sqrt(seeds): the end is the mean
of two evaluations, the base one).
Outputs under ``out``: ``runs/`` (the trials; a rerun resumes them), ``pilot.csv`` (one row per
trial), ``summary.md`` (gain per lr and batch with the seed spread, health, the pick) and
``calibration.png`` (the curves).

    isosweep calibrate --budget 20000 --out dashboards/calibration
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from isosweep.spec.grid import load_sweep
from isosweep.spec.trial import learning_rate, load_trial
from isosweep.spec.trial import steps as total_steps
from isosweep.spec.yamlio import ConfigError
from isosweep.trial.files import TrialDir
from isosweep.trial.job import ray_init, run_trial

LRS = (4e-6, 1e-5, 2.5e-5, 6.3e-5, 1.6e-4)
SEEDS = (0, 1)
COLLAPSE_DROP = 0.03
PEAK_DROP = 0.10
ENTROPY_KEEP = 0.25
KL_MAX = 0.5
TIE_SE = 2.0


@dataclass(frozen=True)
class Judgement:
    """Gain and health of one trial (see the module docstring): mean@k at the base and at the end, the gain, the
    last evaluation's standard error (NaN where not logged), the best evaluation, entropy at the first step and
    over the last third, mean KL over the last third (NaN where not measured), and the problems found."""

    base: float
    end: float
    gain: float
    eval_se: float
    best: float
    entropy0: float
    entropy_end: float
    kl_end: float
    healthy: bool
    problems: str

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PilotTrial:
    """One trial of the pilot (a row of ``pilot.csv``): its lr_ref, batch shape, the learning rate it ran at, its
    seed and its judgement; its eval records for the plot."""

    lr_ref: float
    Bp: int
    n: int
    batch: int
    lr: float
    seed: int
    judged: Judgement
    records: list[dict] = field(default_factory=list, compare=False, repr=False)

    def to_json(self) -> dict:
        """The row of ``pilot.csv``."""
        return {"lr_ref": self.lr_ref, "Bp": self.Bp, "n": self.n, "batch": self.batch, "lr": self.lr,
                "seed": self.seed, **self.judged.to_json()}


@dataclass(frozen=True)
class LrVerdict:
    """One lr_ref's worst-batch mean gain, its standard error, whether every trial of it is healthy, and whether
    it ties with the best healthy lr_ref."""

    worst_gain: float
    se: float
    healthy: bool
    tied: bool = False


def grid_batches(sweep_file: Path) -> list[tuple[int, int]]:
    """The (Bp, n) of the smallest and the largest batch of ``sweep_file``'s grid; a :class:`ConfigError` naming
    the file when every point of it has one batch (a fixed-batch grid: nothing for the pilot to span)."""
    pairs = sorted({(p.cfg.Bp, p.cfg.n) for p in load_sweep(sweep_file).trials})
    small, large = min(pairs, key=lambda p: p[0] * p[1]), max(pairs, key=lambda p: p[0] * p[1])
    if small[0] * small[1] == large[0] * large[1]:
        raise ConfigError(f"{sweep_file}: every point of its grid has the batch Bp*n = {small[0] * small[1]}; the "
                          "learning-rate pilot needs a grid with a smallest and a largest batch (an isocompute sweep)")
    return [small, large]


def judge(records: list[dict], steps: list[dict], k: int) -> Judgement:
    """Gain and health of one trial (see the module docstring)."""
    key = f"eval/mean@{k}"
    values = [r[key] for r in records]
    base, end = values[0], statistics.fmean(values[-2:])
    third = steps[-max(1, len(steps) // 3):]
    entropy0 = steps[0]["train/entropy"]
    entropy_end = statistics.fmean(s["train/entropy"] for s in third)
    kls = [s["train/kl"] for s in third if "train/kl" in s]
    kl_end = statistics.fmean(kls) if kls else math.nan
    problems = []
    if min(values) < base - COLLAPSE_DROP:
        problems.append(f"mean@{k} fell to {min(values):.3f} from {base:.3f}")
    if end < max(values) - PEAK_DROP:
        problems.append(f"ended {max(values) - end:.3f} below its best")
    if entropy_end < ENTROPY_KEEP * entropy0:
        problems.append(f"entropy {entropy_end:.3f} < {ENTROPY_KEEP} x {entropy0:.3f}")
    if kls and kl_end > KL_MAX:
        problems.append(f"KL {kl_end:.3f} > {KL_MAX}")
    stderr = records[-1].get(f"eval/stderr_mean@{k}", math.nan)
    return Judgement(base, end, end - base, stderr, max(values), entropy0, entropy_end, kl_end, not problems,
                     "; ".join(problems))


def cell_stderr(cell: list[Judgement]) -> float:
    """Standard error of the mean gain of one (lr, batch) cell's trials (see the module docstring)."""
    gains = [r.gain for r in cell]
    seeds = statistics.stdev(gains) / math.sqrt(len(gains)) if len(gains) > 1 else 0.0
    eval_se = [r.eval_se for r in cell if not math.isnan(r.eval_se)]
    from_eval = statistics.fmean(eval_se) * math.sqrt(1.5) / math.sqrt(len(gains)) if eval_se else 0.0
    return max(seeds, from_eval)


def pick(rows: list[PilotTrial]) -> tuple[float | None, dict[float, LrVerdict]]:
    """The chosen ``lr_ref`` (None if none is healthy everywhere) and, per lr, its worst-batch mean gain with
    its standard error, its health and whether it ties with the best (see the module docstring)."""
    per_lr: dict[float, LrVerdict] = {}
    for lr in sorted({r.lr_ref for r in rows}):
        mine = [r.judged for r in rows if r.lr_ref == lr]
        cells = {b: [r.judged for r in rows if r.lr_ref == lr and r.batch == b]
                 for b in sorted({r.batch for r in rows if r.lr_ref == lr})}
        worst = min(cells, key=lambda b: statistics.fmean(r.gain for r in cells[b]))
        per_lr[lr] = LrVerdict(statistics.fmean(r.gain for r in cells[worst]), cell_stderr(cells[worst]),
                               all(r.healthy for r in mine))
    healthy = [lr for lr, v in per_lr.items() if v.healthy]
    if not healthy:
        return None, per_lr
    b = per_lr[max(healthy, key=lambda lr: per_lr[lr].worst_gain)]
    for lr in healthy:
        v = per_lr[lr]
        per_lr[lr] = replace(v, tied=v.worst_gain >= b.worst_gain - TIE_SE * math.hypot(v.se, b.se))
    return max(lr for lr in healthy if per_lr[lr].tied), per_lr


def run_pilot(out: str | Path, budget: int, trial_file: Path = Path("sweeps/trials/easy.yaml"),
              sweep_file: Path = Path("sweeps/isocompute-easy.yaml"), lrs: tuple[float, ...] = LRS,
              seeds: tuple[int, ...] = SEEDS, extra: list[str] | None = None, address: str | None = None,
              log: Callable[[str], None] = print) -> tuple[float | None, list[PilotTrial]]:
    """Run (resuming) every trial of the pilot and write its outputs; returns the pick and the rows."""
    batches = grid_batches(sweep_file)  # a grid it cannot pilot says so before any folder is made
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ray_started = False
    rows = []
    for seed in seeds:  # seed-major: an interrupted pilot has whole replicates
        for lr in lrs:
            for bp, n in batches:
                cfg = load_trial(trial_file, [f"budget={budget}", f"Bp={bp}", f"n={n}", f"seed={seed}",
                                              f"algorithm.lr_ref={lr:g}", *(extra or [])])
                run_dir = out / "runs" / f"lr{lr:g}-Bp{bp}-n{n}-s{seed}"
                log(f"[calibrate] lr_ref {lr:g}, Bp {bp} x n {n}, seed {seed}")
                trial = TrialDir(run_dir)
                if trial.is_finished(total_steps(cfg)):  # a rerun reads what is done, without Ray
                    records = trial.records()
                else:
                    if not ray_started:
                        ray_init(address)
                        ray_started = True
                    records = run_trial(cfg, run_dir, address=address, log=log)
                steps = trial.steps()
                rows.append(PilotTrial(lr, bp, n, bp * n, learning_rate(cfg), seed, judge(records, steps, cfg.eval.k),
                                       records))
    chosen, per_lr = pick(rows)
    write_outputs(out, rows, chosen, per_lr, budget, trial_file)
    return chosen, rows


def write_outputs(out: Path, rows: list[PilotTrial], chosen: float | None, per_lr: dict[float, LrVerdict],
                  budget: int, trial_file: Path) -> None:
    """``pilot.csv``, ``summary.md`` and ``calibration.png`` in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = [r.to_json() for r in rows]
    with open(out / "pilot.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)

    batches = sorted({r.batch for r in rows})
    lines = [f"# Learning-rate pilot ({trial_file}, C = {budget:,} rollouts per trial)", "",
             "Gain = mean@k at the end (mean of the last two evals) minus the base model's, mean over seeds "
             "(± half the spread of the seeds); ✗ marks an unhealthy trial; in brackets the learning rate the "
             "trials ran at (lr_ref scaled by sqrt(batch / batch_ref)).", "",
             "| lr_ref | " + " | ".join(f"gain, batch {b}" for b in batches) + " | healthy |",
             "| --- |" + " --- |" * (len(batches) + 1)]
    for lr, verdict in per_lr.items():
        cells = []
        for b in batches:
            mine = [r for r in rows if r.lr_ref == lr and r.batch == b]
            gains = [r.judged.gain for r in mine]
            half = (max(gains) - min(gains)) / 2 if len(gains) > 1 else math.nan
            cells.append(f"{statistics.fmean(gains):+.3f} ± {half:.3f}"
                         + (" ✗" if not all(r.judged.healthy for r in mine) else "") + f" (lr {mine[0].lr:.2g})")
        lines.append(f"| {lr:g} | " + " | ".join(cells) + f" | {'yes' if verdict.healthy else 'no'} |")
    tied = [lr for lr, v in per_lr.items() if v.tied]
    lines += ["", "Worst-batch gain per healthy lr_ref (± standard error): " + ", ".join(
        f"{lr:g} {v.worst_gain:+.3f} ± {v.se:.3f}" for lr, v in per_lr.items() if v.healthy) + "."]
    if len(tied) > 1:
        lines += [f"Tied within {TIE_SE:g} standard errors of the best: {', '.join(f'{lr:g}' for lr in tied)}; the "
                  "pick is the largest of them (the fastest healthy progress)."]
    lines += ["", f"**Pick**: lr_ref = {chosen:g}" if chosen is not None else "**Pick**: none healthy at both batches"]
    if chosen is not None and len(per_lr) > 1 and chosen in (min(per_lr), max(per_lr)):
        side = "smallest" if chosen == min(per_lr) else "largest"
        lines += ["", f"The pick is the {side} lr_ref tried: the best healthy value may lie beyond it. Extend the grid "
                      f"{'down' if side == 'smallest' else 'up'} before reading it as an optimum."]
    lines += ["", "Unhealthy trials:", ""]
    lines += [f"- lr {r.lr_ref:g}, batch {r.batch}, seed {r.seed}: {r.judged.problems}"
              for r in rows if not r.judged.healthy] or ["- none"]
    (out / "summary.md").write_text("\n".join(lines) + "\n")

    fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4.5), squeeze=False)
    colours = plt.cm.viridis([i / max(1, len(per_lr) - 1) for i in range(len(per_lr))])
    for ax, b in zip(axes[0], batches):
        for colour, lr in zip(colours, per_lr):
            for r in (r for r in rows if r.lr_ref == lr and r.batch == b):
                key = next(k for k in r.records[0] if k.startswith("eval/mean@"))
                ax.plot([max(x["rollouts"], 1) for x in r.records], [x[key] for x in r.records], color=colour,
                        marker="o", ms=3, label=f"lr {lr:g}" if r.seed == rows[0].seed else None,
                        ls="-" if r.seed == rows[0].seed else "--")
        ax.set(xscale="log", title=f"batch {b} rollouts/step", xlabel="rollouts", ylabel="eval mean@k")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "calibration.png", dpi=110)
    plt.close(fig)
