"""The planted control's known answer: the frontier that a sweep of the tabular policy must report.

:mod:`isosweep.experiments.tabular_truth` simulates the control's algorithm in numpy without any of isosweep's
code. This module hands it what it cannot know on its own -- the problems a trial of the sweep trains and is
scored on, which come from the tabular base model's probe (:mod:`isosweep.models.tabular`) -- and compares
its ``n*(C)`` with the report of a study folder:

    isosweep tabular-truth sweeps/studies/tabular-control.yaml dashboards/tabular-control

writes ``truth.json`` and ``truth.md`` into the folder: at every budget of the report's frontier table, the
simulation's n* (64 seeds), its margin over the runner-up in standard errors, the report's n* and 90% set, and
whether they agree. Where the simulation decides (``DECIDED`` standard errors or more) the report's n* must be
the simulation's; where it does not, the simulation's n* must lie in the report's 90% set.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from isosweep.experiments import tabular_truth as truth
from isosweep.models.warmup import resolve_model
from isosweep.report.schema import read_analysis
from isosweep.spec.grid import load_sweep
from isosweep.spec.trial import TrialConfig, task_of
from isosweep.tasks.codes import CodesTask
from isosweep.trial.loop import problem_sets

DECIDED = 3.0
"""Margin (standard errors of the paired per-seed difference, over the simulation's seeds) that decides n*."""
SEEDS = 64


def control_setup(cfg: TrialConfig) -> truth.TabularSetup:
    """The simulation's setup for a trial of the tabular control: its task's codes and planted epsilons, the
    families of its train problems and the family weights of its eval problems (as the trial selects them)."""
    task = task_of(cfg.task)
    if cfg.model.name != "tabular" or not isinstance(task, CodesTask):
        raise ValueError(f"the known answer is the tabular control's: model.name 'tabular' on a codes task, "
                         f"got model.name {cfg.model.name!r} and task.name {cfg.task.name!r}")
    # the trial's own problem sets: the base model carries its probe, so no engine is needed
    sets = problem_sets(cfg, resolve_model(cfg.model.name, cfg.task.name), engine=None)
    train = [task.family_of(p).id for p in sets.train]
    weights = np.zeros(len(task.families))
    for problem in sets.eval:
        weights[task.family_of(problem).id] += 1
    return truth.TabularSetup(codes=[[int(d) for d in f.code] for f in task.families],
                              eps=[f.epsilon for f in task.families], train=train, eval_weights=weights,
                              lr_ref=cfg.algorithm.lr_ref, batch_ref=cfg.algorithm.batch_ref,
                              scale_adv_by_std=cfg.algorithm.scale_adv_by_std, grad_clip=cfg.algorithm.grad_clip)


@dataclass(frozen=True)
class Agreement:
    """One budget of the report's frontier table beside the simulation's answer there."""

    C: float
    known: int
    """The simulation's n*."""
    margin: float
    """Its lead over the runner-up, in standard errors of the paired difference."""
    decided: bool
    reported: int | None
    """The report's n* (its best fitted config's n)."""
    reported_set: tuple[int, ...]
    """The report's 90% set of n*."""

    @property
    def agrees(self) -> bool:
        """Decided: the report's n* is the simulation's; undecided: the simulation's n* is in the report's set."""
        return self.reported == self.known if self.decided else self.known in self.reported_set


def compare(sweep_file: str | Path, folder: str | Path, metric: str = "mean@4", seeds: int = SEEDS) -> list[Agreement]:
    """The simulation's n* at every budget of ``folder``'s frontier table of ``metric``, beside the report's."""
    sweep = load_sweep(sweep_file)
    cfg = sweep.trials[0].cfg
    if len({t.cfg.Bp for t in sweep.trials}) != 1:
        raise ValueError(f"{sweep_file}: the known answer is computed for one Bp; the grid has several")
    configs = sorted({(t.cfg.Bp, t.cfg.n) for t in sweep.trials})
    rows = read_analysis(Path(folder) / "fits.json").metrics[metric].frontier
    found = truth.truth(control_setup(cfg), configs, sweep.budget, [int(row.C) for row in rows], seeds)
    return [Agreement(row.C, known.n_star, float(known.margin), bool(known.margin >= DECIDED), row.n,
                      tuple(row.n_range)) for row, known in zip(rows, found)]


def write(agreements: list[Agreement], folder: str | Path) -> str:
    """``truth.json`` and ``truth.md`` in ``folder``; returns the Markdown."""
    folder = Path(folder)
    (folder / "truth.json").write_text(json.dumps([asdict(a) | {"agrees": a.agrees} for a in agreements], indent=1)
                                       + "\n")
    lines = [f"# The known answer beside the report ({SEEDS}-seed simulation, decided at >= {DECIDED:g} se)", "",
             "| C | known n* | margin (se) | decided | report n* | report 90% set | agrees |",
             "|---:|---:|---:|:---:|---:|---|:---:|"]
    for a in agreements:
        lines.append(f"| {a.C:,.0f} | {a.known} | {a.margin:.1f} | {'yes' if a.decided else 'no'} | {a.reported} | "
                     f"{', '.join(map(str, a.reported_set))} | {'yes' if a.agrees else 'NO'} |")
    text = "\n".join(lines) + "\n"
    (folder / "truth.md").write_text(text)
    return text
