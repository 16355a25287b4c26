"""The real-study comparison of ``make hpo-bench``: thresholds, compute to reach them, per-method medians."""

from __future__ import annotations

import pytest

from isosweep.experiments.hpo_bench import compare, reach


def study(seed: int, base: float, trajectory: list[tuple[float, float | None]], best: float | None) -> dict:
    """A ``run_hpo`` summary with only what the comparison reads."""
    return {"sweep_id": f"s{seed}", "target": "big", "budget": 1000, "study_budget": 4000.0, "cost_units": "units",
            "metric": "eval/mean@4", "target_base": base, "spent": trajectory[-1][0] if trajectory else 0.0,
            "best_target": None if best is None else {"value": best},
            "trajectory": [{"spent": s, "incumbent": v} for s, v in trajectory],
            "trials": [{}] * len(trajectory), "by_size": {}, "promoted": 0, "stopped": {}, "recommended": {}}


def test_reach_is_the_spend_at_the_first_incumbent_over_the_threshold():
    trajectory = [{"spent": 100, "incumbent": None}, {"spent": 250, "incumbent": 0.5},
                  {"spent": 400, "incumbent": 0.7}, {"spent": 900, "incumbent": 0.9}]
    assert reach(trajectory, 0.6) == 400
    assert reach(trajectory, 0.7) == 400  # reaching counts, not only passing
    assert reach(trajectory, 0.95) is None
    assert reach([], 0.1) is None


def test_compare_at_several_thresholds():
    results = {
        "a": [study(0, 0.80, [(1000, 0.805), (2000, 0.816), (3000, 0.83)], 0.83),
              study(1, 0.81, [(1500, None), (3500, 0.812)], 0.812)],
        "b": [study(0, 0.80, [(1000, 0.79)], 0.79), study(1, 0.82, [], None)],
    }
    table = compare(results, [0, 1], margins=(0.01, 0.02), walls={"a": [3.0, 4.04], "b": [0.0, 1.0]})
    base = 0.805  # the median of 0.80, 0.81, 0.80, 0.82
    assert table["target_base"] == pytest.approx(base)
    assert table["thresholds"] == {"+0.01": pytest.approx(base + 0.01), "+0.02": pytest.approx(base + 0.02)}
    a, b = table["methods"]["a"], table["methods"]["b"]
    # seed 0 passes 0.815 at 2000 (0.816) and 0.825 at 3000; seed 1 never passes 0.815
    assert [p["compute_to_threshold"] for p in a["per_seed"]] == [{"+0.01": 2000, "+0.02": 3000},
                                                                   {"+0.01": None, "+0.02": None}]
    assert a["reached_threshold"] == {"+0.01": "1/2", "+0.02": "1/2"}
    assert a["compute_to_threshold_median"] == {"+0.01": 2000, "+0.02": 3000}
    assert a["best_target_mean"] == pytest.approx((0.83 + 0.812) / 2)
    assert [p["wall_s_this_run"] for p in a["per_seed"]] == [3.0, 4.0]
    # a method that never got there, one of whose studies never trained the target
    assert b["reached_threshold"] == {"+0.01": "0/2", "+0.02": "0/2"}
    assert b["compute_to_threshold_median"] == {"+0.01": None, "+0.02": None}
    assert b["best_target_mean"] == pytest.approx(0.79)
