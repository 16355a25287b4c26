"""One loader for every study file: the ``study:`` key decides its kind.

    study: isocompute | fixed-batch   a grid sweep (:mod:`isosweep.spec.grid`)  -> Sweep
    study: hpo                        an HPO study (:mod:`isosweep.spec.hpo`)   -> HPOStudy

A file without a known ``study:`` stops with the file, the key and the kinds allowed.
"""

from __future__ import annotations

from pathlib import Path

from isosweep.spec.grid import Sweep, load_sweep
from isosweep.spec.hpo import HPOStudy, load_hpo
from isosweep.spec.yamlio import ConfigError, read_yaml

Study = Sweep | HPOStudy
GRID_KINDS = ("isocompute", "fixed-batch")


def load_study(path: str | Path, budget: int | str | float | None = None,
               study_budget: str | float | None = None) -> Study:
    """Load and validate a study file of either kind; ``budget`` (``BUDGET=``) replaces its C and
    ``study_budget`` (``STUDY_BUDGET=``) an HPO study's total spend."""
    kind = read_yaml(path).get("study")
    if kind == "hpo":
        return load_hpo(path, budget, study_budget)
    if kind not in GRID_KINDS:
        raise ConfigError(f"{path}: key 'study': {kind!r} is not a study kind; allowed: "
                          + ", ".join(GRID_KINDS + ("hpo",)))
    if study_budget is not None:
        raise ConfigError(f"{path}: --study-budget (STUDY_BUDGET=) is for HPO studies (study: hpo), not grid sweeps")
    return load_sweep(path, budget)
