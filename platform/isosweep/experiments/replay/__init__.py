"""Searchers replayed on a table of learning curves: JF-HPO against random search, ASHA and Hyperband.

In: a finished table (``isosweep hpo-table``'s ``table.json``). Out: a :class:`Comparison` (every method x
study budget x searcher seed, on the table and on its shuffled-proxy control), written as the key
``table[-<name>]`` of ``bench/hpo.json`` plus runs, a report and plots under ``dashboards/hpo-bench/``.

Who owns each step, in the order :func:`run` takes them:

- ``simulator``: the table as a simulator (:class:`Curves`), what a trial costs and a study's spend
  (:class:`Study`), snapping a proposal to the grid (:func:`search_space`, :func:`snap`);
- ``baselines``: random search, ASHA, Hyperband; ``driver``: JF-HPO driven on the table (``jfhpo``,
  ``jfhpo-log``, ``bo-target``);
- ``compare``: one study per method x budget x seed (:func:`replay`), in a process pool (:func:`compare`),
  the entry point (:func:`run`);
- ``stats``: regret and compute to eps over seeds, bootstrap intervals, paired Wilcoxon tests;
- ``records``: the typed results; ``output``: the files (report text, plots, JSON).
"""

from isosweep.experiments.replay.baselines import run_asha, run_hyperband, run_random
from isosweep.experiments.replay.compare import METHODS, compare, measured_fixed, replay, run, wall_ratios
from isosweep.experiments.replay.driver import PROXY_CHECK, PROXY_SHARE, run_jfhpo
from isosweep.experiments.replay.output import DEFAULT_TABLE, output_name, plot, report_text
from isosweep.experiments.replay.records import (
    Comparison,
    MethodSummary,
    PairedTest,
    Pairing,
    ProxyVerdict,
    ReplayRecord,
    StudyResult,
)
from isosweep.experiments.replay.simulator import Curves, Run, Study, search_space, snap
from isosweep.experiments.replay.stats import bootstrap_median, compute_to_eps, paired_test, summarize, unmet

__all__ = [
    "DEFAULT_TABLE", "METHODS", "PROXY_CHECK", "PROXY_SHARE", "Comparison", "Curves", "MethodSummary", "PairedTest",
    "Pairing", "ProxyVerdict", "ReplayRecord", "Run", "Study", "StudyResult", "bootstrap_median", "compare",
    "compute_to_eps", "measured_fixed", "output_name", "paired_test", "plot", "replay", "report_text", "run",
    "run_asha", "run_hyperband", "run_jfhpo", "run_random", "search_space", "snap", "summarize", "unmet",
    "wall_ratios",
]
