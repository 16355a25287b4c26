"""The planted control's known answer: the committed report of the tabular control finds the n*(C) that an
independent simulation of the same algorithm gives, at every budget of its frontier table."""

from __future__ import annotations

from pathlib import Path

from isosweep.experiments.tabular_control import DECIDED, compare

ROOT = Path(__file__).resolve().parents[2]


def test_the_report_of_the_tabular_control_finds_the_known_n_star_at_every_budget():
    agreements = compare(ROOT / "sweeps/studies/tabular-control.yaml", ROOT / "dashboards/tabular-control")
    assert len(agreements) == 8
    missed = [a for a in agreements if not a.agrees]
    assert not missed, f"the report misses the known n* (decided at >= {DECIDED} se) at {missed}"
    # the control is not trivial: the simulation decides most budgets, and n* moves within the table
    assert sum(a.decided for a in agreements) >= 5
    assert len({a.known for a in agreements if a.decided}) >= 2
