"""The real-study comparison of ``make hpo-bench``: thresholds, compute to reach them, per-method medians."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from isosweep.experiments.hpo_bench import (
    LiveComparison,
    LivePick,
    ReplayBeside,
    ScoredMethod,
    Synthetic,
    TableScore,
    compare,
    reach,
)
from isosweep.hpo.ledger import TrialEntry
from isosweep.report.hpo import BestTarget, HPOSummary

ROOT = Path(__file__).parents[2]


def study(seed: int, base: float | None, trajectory: list[tuple[float, float | None]], best: float | None,
          recommended: dict[str, float] | None = None) -> HPOSummary:
    """A ``run_hpo`` summary with what the comparison reads; the rest placeholders."""
    return HPOSummary(
        sweep_id=f"s{seed}", search="random", seed=seed, metric="eval/mean@4", target="big", budget=1000,
        study_budget=4000.0, cost_units="units", spent=trajectory[-1][0] if trajectory else 0.0, target_base=base,
        trials=[TrialEntry(f"t{i}", "big", 1000, {}) for i in range(len(trajectory))],
        trajectory=[{"spent": s, "incumbent": v} for s, v in trajectory],
        best_target=None if best is None else BestTarget("t0", best, {}), recommended=recommended, by_size={},
        promoted=0, stopped={})


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
    assert table.target_base == pytest.approx(base)
    assert table.thresholds == {"+0.01": pytest.approx(base + 0.01), "+0.02": pytest.approx(base + 0.02)}
    a, b = table.methods["a"], table.methods["b"]
    # seed 0 passes 0.815 at 2000 (0.816) and 0.825 at 3000; seed 1 never passes 0.815
    assert [p.compute_to_threshold for p in a.per_seed] == [{"+0.01": 2000, "+0.02": 3000},
                                                             {"+0.01": None, "+0.02": None}]
    assert a.reached_threshold == {"+0.01": "1/2", "+0.02": "1/2"}
    assert a.compute_to_threshold_median == {"+0.01": 2000, "+0.02": 3000}
    assert a.best_target_mean == pytest.approx((0.83 + 0.812) / 2)
    assert [p.wall_s_this_run for p in a.per_seed] == [3.0, 4.0]
    assert [p.trials for p in a.per_seed] == [3, 2] and a.per_seed[1].best_target == 0.812
    # a method that never got there, one of whose studies never trained the target
    assert b.reached_threshold == {"+0.01": "0/2", "+0.02": "0/2"}
    assert b.compute_to_threshold_median == {"+0.01": None, "+0.02": None}
    assert b.best_target_mean == pytest.approx(0.79)
    assert LiveComparison.from_json(json.loads(json.dumps(table.to_json()))) == table
    assert "against_table" not in table.to_json()


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
    from isosweep.experiments.replay import Comparison, Curves, MethodSummary, ReplayRecord, StudyResult

    grid = {"algorithm.lr_ref": [3e-6, 1e-5, 3e-5, 1e-4, 3e-4], "algorithm.kl_coef": [1e-3, 3e-2]}
    table = small_table(grid)
    curves = Curves(table)
    # log distance, as the replay snaps: 5.4e-5 is nearer 3e-5 than 1e-4 (ratios 1.8 and 1.85), kl 0.006 nearer 3e-2
    picks = [{"algorithm.lr_ref": 9e-5, "algorithm.kl_coef": 1.1e-3}, {"algorithm.lr_ref": 5.4e-5, "algorithm.kl_coef": 6e-3}]
    summaries = {"jfhpo": [study(i, None, [], None, p) for i, p in enumerate(picks)] + [study(2, None, [], None)]}
    replay_regrets = [0.0, 0.01, 0.02, 0.2]
    records = tuple(ReplayRecord(seed, "jfhpo", None, regret, None, 4.0, 1, 0, 0, {}, ())
                    for seed, regret in enumerate(replay_regrets))
    row = MethodSummary(0.015, (0.0, 0.2), 0.0575, "1/4", None, (None, None), "0/4", 1.0, 0.0, 0.0, {})
    replayed = Comparison(table="small", target="tiny-w128", sizes={}, budget=1024, points=(1024,), fixed=0.05,
                          eps=0.01, seeds=4, collapse=None, eval_variance=0.0, true_values={}, best=0.0,
                          best_configs=(), studies={"table@4x": StudyResult(4.0, "table", {"jfhpo": row},
                                                                            {"jfhpo": records})})
    scored = against_table(summaries, table, replayed, 4.0).methods["jfhpo"]
    rows = scored.per_seed
    assert [r.grid_point for r in rows] == ["lr_ref=0.0001,kl_coef=0.001", "lr_ref=3e-05,kl_coef=0.03", None]
    expected = [curves.best - curves.true[r.grid_point] for r in rows[:2]]
    assert [r.regret for r in rows[:2]] == pytest.approx(expected) and rows[2].regret is None
    assert scored.regret_mean == pytest.approx(sum(expected) / 2)
    assert scored.replay.study == "table@4x" and scored.replay.regret_median == 0.015
    assert scored.replay.mann_whitney_p == pytest.approx(
        mannwhitneyu(expected, replay_regrets, alternative="two-sided").pvalue)
    assert against_table(summaries, table, None, 4.0).methods["jfhpo"].replay is None
    # the file's layout: a pick without a recommendation has no true value; no fresh values, no fresh keys
    assert list(rows[2].to_json()) == ["sweep_id", "recommended", "grid_point", "regret"]
    assert list(rows[0].to_json()) == ["sweep_id", "recommended", "grid_point", "true_value", "regret"]
    # recommendations retrained with fresh seeds: their own values, their regret against the table's best
    fresh = {"lr_ref=9e-05,kl_coef=0.0011": {1: 0.61, 2: 0.63}}
    scored_again = against_table(summaries, table, None, 4.0, fresh)
    again = scored_again.methods["jfhpo"]
    assert again.per_seed[0].to_json()["fresh"] == {"1": 0.61, "2": 0.63}
    assert again.per_seed[0].fresh_regret == pytest.approx(curves.best - 0.62)
    assert again.per_seed[1].fresh is None and again.fresh_regret_mean == pytest.approx(curves.best - 0.62)
    through = lambda data: json.loads(json.dumps(data))  # noqa: E731
    for found in (scored_again, against_table(summaries, table, replayed, 4.0)):
        assert TableScore.from_json(through(found.to_json())) == found
        for method in found.methods.values():
            assert ScoredMethod.from_json(through(method.to_json())) == method
            assert all(LivePick.from_json(through(pick.to_json())) == pick for pick in method.per_seed)
            if method.replay is not None:
                assert ReplayBeside.from_json(through(method.replay.to_json())) == method.replay


def test_the_committed_bench_parts_read_back_and_write_again_unchanged():
    """``bench/hpo.json``'s synthetic and live parts (the live one scored against the table, with retrained
    picks), read as their dataclasses and written again: the same JSON, the same file."""
    text = (ROOT / "bench" / "hpo.json").read_text()
    figures = json.loads(text)
    parts = {key: (Synthetic if key == "synthetic" else LiveComparison).from_json(value)
             for key, value in figures.items() if key == "synthetic" or key.startswith("real")}
    assert {"synthetic", "real", "real-jfhpo-mup"} <= set(parts)
    assert parts["real-jfhpo-mup"].against_table.fresh_seeds == (1,) and parts["real"].against_table is None
    assert parts["synthetic"].per_seed[0].methods["random"].cost == float("inf")  # null in the file: never
    written = {**figures, **{key: part.to_json() for key, part in parts.items()}}
    assert json.dumps(written, indent=1, default=str) + "\n" == text
