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


def small_table(grid: dict[str, list[float]]) -> dict:
    """Two sizes x the grid x two seeds, each curve two evaluations of 4 problems: the value rises with log lr."""
    import itertools
    import math

    cells = []
    for size, (lr, kl), seed in itertools.product(["tiny-w64", "tiny-w128"], itertools.product(*grid.values()), (0, 1)):
        value = 0.3 + 0.05 * (math.log10(lr) + 6) - (0.02 if kl > 0.01 else 0) + 0.01 * seed
        counts = [round(8 * min(1.0, value))] * 4
        cells.append({"size": size, "config": {"algorithm.lr_ref": lr, "algorithm.kl_coef": kl}, "seed": seed,
                      "curve": [{"rollouts": 0, "counts": [2] * 4, "samples": 8},
                                {"rollouts": 1024, "counts": counts, "samples": 8}]})
    spec = {"name": "small", "trial": "x.yaml", "budget": 1024, "sizes": ["tiny-w64", "tiny-w128"], "seeds": [0, 1],
            "grid": grid, "default": {key: values[0] for key, values in grid.items()}, "set": {}}
    return {"name": "small", "spec": spec, "cells": cells, "expected_cells": len(cells)}


def test_a_live_recommendation_is_scored_at_the_tables_nearest_grid_point_beside_the_replay():
    from scipy.stats import mannwhitneyu

    from isosweep.experiments.hpo_bench import against_table
    from isosweep.experiments.hpo_replay import Curves

    grid = {"algorithm.lr_ref": [3e-6, 1e-5, 3e-5, 1e-4, 3e-4], "algorithm.kl_coef": [1e-3, 3e-2]}
    table = small_table(grid)
    curves = Curves(table)
    # log distance, as the replay snaps: 5.4e-5 is nearer 3e-5 than 1e-4 (ratios 1.8 and 1.85), kl 0.006 nearer 3e-2
    picks = [{"algorithm.lr_ref": 9e-5, "algorithm.kl_coef": 1.1e-3}, {"algorithm.lr_ref": 5.4e-5, "algorithm.kl_coef": 6e-3}]
    summaries = {"jfhpo": [{"sweep_id": f"s{i}", "recommended": p} for i, p in enumerate(picks)]
                 + [{"sweep_id": "s2", "recommended": None}]}
    replay_regrets = [0.0, 0.01, 0.02, 0.2]
    replayed = {"studies": {"table@4x": {"summary": {"jfhpo": {"regret_median": 0.015, "regret_mean": 0.0575,
                                                               "regret_ci95": [0.0, 0.2]}}}},
                "runs": {"table@4x": {"jfhpo": [{"regret": r} for r in replay_regrets]}}}
    scored = against_table(summaries, table, replayed, 4.0)["methods"]["jfhpo"]
    rows = scored["per_seed"]
    assert [r["grid_point"] for r in rows] == ["lr_ref=0.0001,kl_coef=0.001", "lr_ref=3e-05,kl_coef=0.03", None]
    expected = [curves.best - curves.true[r["grid_point"]] for r in rows[:2]]
    assert [r["regret"] for r in rows[:2]] == pytest.approx(expected) and rows[2]["regret"] is None
    assert scored["regret_mean"] == pytest.approx(sum(expected) / 2)
    assert scored["replay"]["study"] == "table@4x" and scored["replay"]["regret_median"] == 0.015
    assert scored["replay"]["mann_whitney_p"] == pytest.approx(
        mannwhitneyu(expected, replay_regrets, alternative="two-sided").pvalue)
    assert "replay" not in against_table(summaries, table, None, 4.0)["methods"]["jfhpo"]
    # recommendations retrained with fresh seeds: their own values, their regret against the table's best
    fresh = {"lr_ref=9e-05,kl_coef=0.0011": {1: 0.61, 2: 0.63}}
    again = against_table(summaries, table, None, 4.0, fresh)["methods"]["jfhpo"]
    assert again["per_seed"][0]["fresh"] == {"1": 0.61, "2": 0.63}
    assert again["per_seed"][0]["fresh_regret"] == pytest.approx(curves.best - 0.62)
    assert "fresh" not in again["per_seed"][1] and again["fresh_regret_mean"] == pytest.approx(curves.best - 0.62)
