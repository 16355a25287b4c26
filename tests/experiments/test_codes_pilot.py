"""The codes pilot's figures: the e-folding fit and its table, on records of known shape."""

from __future__ import annotations

import doctest
import math

from isosweep.experiments import codes_pilot
from isosweep.experiments.codes_pilot import e_folding, render


def test_docstring_examples_hold():
    assert doctest.testmod(codes_pilot).failed == 0


def test_the_e_folding_time_of_a_decay_and_of_a_curve_that_does_not_fall():
    steps = list(range(0, 200, 10))
    assert math.isclose(e_folding(steps, [0.03 * math.exp(-s / 40) for s in steps]), 40, rel_tol=1e-9)
    assert e_folding(steps, [0.03 + 0.001 * s for s in steps]) == math.inf
    assert e_folding([0, 10], [0.0, 0.0]) == math.inf  # nothing to fit: no fall is measured
    # zeros are left out of the log fit, not read as an infinite fall
    assert math.isclose(e_folding([0, 10, 20, 30], [0.04, 0.04 * math.exp(-1), 0.0, 0.04 * math.exp(-3)]), 10,
                        rel_tol=1e-9)


def test_the_table_names_both_variants_and_the_discovery():
    drift = {"task": "codes", "steps": [0, 10], "needle_rate": [0.02, 0.01], "anchor_rate": [0.4, 0.5],
             "tau_steps": 14.4, "tau_rollouts": 1848.0}
    result = {"budget": 1280, "drift": [drift, {**drift, "task": "codes-nodrift", "tau_steps": math.inf,
                                                "tau_rollouts": math.inf}],
              "discovery": {"task": "codes", "steps": [0, 10], "needle_rate": [0.02, 0.6], "cumulative_successes": [0, 90],
                            "families": 18, "learned_at": 10, "successes_per_family": 5.0}}
    text = render(result)
    assert "| anchors only, codes | 0.0200 | 0.0100 | 14 | 1848 |" in text
    assert "codes-nodrift" in text and "inf" in text
    assert "reached 0.5: step 10; 5.0 sampled successes per needle family (18 families)" in text
