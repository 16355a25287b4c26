"""The HPO table: its spec's errors, its signal check against a slow reference, and a small build."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from isosweep.experiments.hpo_table import (
    DEFAULT_SE,
    MEDIAN_SE,
    Cell,
    CurvePoint,
    Signal,
    Table,
    build,
    check_signal,
    config_key,
    load_table_spec,
    paired_difference,
    signal_text,
)
from isosweep.spec.yamlio import ConfigError

ROOT = Path(__file__).parents[2]
PILOT = ROOT / "sweeps" / "tables" / "hpo-table-pilot.yaml"


def spec_file(tmp_path, **changes):
    text = {"name": "t", "trial": str(ROOT / "sweeps" / "trials" / "easy.yaml"), "budget": 256,
            "sizes": ["tiny-1m"], "seeds": [0], "grid": {"algorithm.lr_ref": [1.0e-5, 1.0e-4]},
            "default": {"algorithm.lr_ref": 1.0e-5},
            "set": {"Bp": 8, "n": 4, "eval.every": 4, "task.eval_problems": 32, "eval.samples": 8,
                    "rollout.engine": "hf"}}
    text.update(changes)
    path = tmp_path / "table.yaml"
    path.write_text(json.dumps(text))
    return path


@pytest.mark.parametrize("name", ["hpo-table-pilot", "hpo-table-mup", "hpo-table-temperature", "hpo-table-temp"])
def test_the_committed_tables_load_with_every_cell_a_valid_trial(name):
    spec, grid = load_table_spec(ROOT / "sweeps" / "tables" / f"{name}.yaml")
    assert len(grid) == math.prod(len(v) for v in spec.grid.values()) and spec.default in grid


@pytest.mark.parametrize("changes, named", [
    ({"default": {"algorithm.lr_ref": 3.0e-5}}, "default"),
    ({"default": {}}, "default"),
    ({"sizes": []}, "sizes"),
    ({"grids": {}}, "grids"),
    ({"grid": {"Bp": [0], "algorithm.lr_ref": [1.0e-5]}, "default": {"Bp": 0, "algorithm.lr_ref": 1.0e-5}}, "Bp"),
    ({"grid": {"rollout.temperature": [0.5, 1.0]}, "default": {"rollout.temperature": 1.0}}, "eval.temperature"),
])
def test_a_bad_table_file_names_the_file_and_the_key(tmp_path, changes, named):
    path = spec_file(tmp_path, **changes)
    with pytest.raises(ConfigError) as err:
        load_table_spec(path)
    assert str(path) in str(err.value) and named in str(err.value)


def test_a_number_yaml_reads_as_a_string_is_a_number(tmp_path):
    path = tmp_path / "table.yaml"
    path.write_text(spec_file(tmp_path).read_text().replace('"default": {"algorithm.lr_ref": 1e-05}',
                                                             '"default": {"algorithm.lr_ref": "1e-5"}'))
    spec, _ = load_table_spec(path)  # YAML reads 1e-5 without a dot as a string
    assert spec.default == {"algorithm.lr_ref": 1e-5}


def table(values: dict[tuple[float, int], np.ndarray], samples=8, lrs=(1e-6, 1e-5, 1e-4), default=1e-5, sizes=None):
    """A made-up table: per (lr, seed) the per-problem counts at the end (the base: counts of 1)."""
    sizes = sizes or {"tiny-1m": values}
    cells = [{"size": size, "config": {"algorithm.lr_ref": lr}, "seed": seed,
              "curve": [{"rollouts": 0, "counts": [1] * len(counts), "samples": samples},
                        {"rollouts": 256, "counts": counts.tolist(), "samples": samples}]}
             for size, by_cell in sizes.items() for (lr, seed), counts in by_cell.items()]
    return {"name": "t", "cells": cells, "expected_cells": len(cells),
            "spec": {"name": "t", "trial": "x.yaml", "budget": 256, "sizes": list(sizes), "seeds": [0, 1],
                     "grid": {"algorithm.lr_ref": list(lrs)}, "default": {"algorithm.lr_ref": default}}}


def test_a_paired_difference_matches_a_slow_loop_over_problems_and_seeds():
    rng = np.random.default_rng(0)
    a = [{"seed": s, "curve": [{"counts": rng.integers(0, 9, 50).tolist(), "samples": 8}]} for s in (0, 1, 2)]
    b = [{"seed": s, "curve": [{"counts": rng.integers(0, 9, 50).tolist(), "samples": 8}]} for s in (2, 0, 1)]
    as_cells = lambda cells: [Cell("s", {}, c["seed"], [CurvePoint(0, None, p["counts"], p["samples"])  # noqa: E731
                                                         for p in c["curve"]]) for c in cells]
    diff, se, _ = paired_difference(as_cells(a), as_cells(b))
    by_b = {c["seed"]: c for c in b}
    per_problem = []
    for i in range(50):
        per_problem.append(sum(c["curve"][0]["counts"][i] / 8 - by_b[c["seed"]]["curve"][0]["counts"][i] / 8
                               for c in a) / 3)
    mean = sum(per_problem) / 50
    eval_se = math.sqrt(sum((x - mean) ** 2 for x in per_problem) / 49 / 50)
    per_seed = [sum(c["curve"][0]["counts"][i] / 8 - by_b[c["seed"]]["curve"][0]["counts"][i] / 8
                    for i in range(50)) / 50 for c in a]
    seed_mean = sum(per_seed) / 3
    seed_se = math.sqrt(sum((x - seed_mean) ** 2 for x in per_seed) / 2 / 3)
    assert diff == pytest.approx(mean) and se == pytest.approx(max(eval_se, seed_se))


def check(data: dict) -> Signal:
    """The signal check of a table given as ``table.json``'s content."""
    return check_signal(Table.from_json(data))


def test_a_clear_interior_optimum_meets_the_preconditions_and_a_flat_table_does_not():
    rng = np.random.default_rng(1)
    base = rng.integers(1, 7, 400)
    clear = {(lr, s): np.clip(base + shift + rng.integers(-1, 2, 400), 0, 8)
             for lr, shift in ((1e-6, 0), (1e-5, 1), (1e-4, 2), (1e-3, 0)) for s in (0, 1)}
    found = check(table(clear, lrs=(1e-6, 1e-5, 1e-4, 1e-3)))
    assert found.best == config_key({"algorithm.lr_ref": 1e-4}) and found.interior
    assert found.best_minus_default.diff / found.best_minus_default.se >= DEFAULT_SE
    assert all(found.checks.values()), found.checks
    assert "all met" in signal_text(Table.from_json(table(clear, lrs=(1e-6, 1e-5, 1e-4, 1e-3))))

    flat = {(lr, s): np.clip(base + rng.integers(-1, 2, 400), 0, 8) for lr in (1e-6, 1e-5, 1e-4) for s in (0, 1)}
    found = check(table(flat))
    ratio = found.best_minus_median.diff / found.best_minus_median.se
    assert ratio < MEDIAN_SE and not all(found.checks.values())
    assert "do not compare searchers" in signal_text(Table.from_json(table(flat)))


def test_an_optimum_on_the_grid_edge_is_not_interior_and_names_the_axis():
    rng = np.random.default_rng(2)
    base = rng.integers(1, 7, 300)
    edge = {(lr, s): np.clip(base + shift, 0, 8) for lr, shift in ((1e-6, 0), (1e-5, 1), (1e-4, 2)) for s in (0, 1)}
    found = check(table(edge))
    assert not found.interior and found.edge_axes == ["algorithm.lr_ref"]
    assert "edge of: algorithm.lr_ref" in signal_text(Table.from_json(table(edge)))


def test_the_proxy_ranking_is_a_spearman_rho_over_configurations():
    rng = np.random.default_rng(3)
    base = rng.integers(1, 7, 300)
    target = {(lr, s): np.clip(base + shift, 0, 8) for lr, shift in ((1e-6, 0), (1e-5, 2), (1e-4, 1)) for s in (0, 1)}
    same = {(lr, s): np.clip(base + shift, 0, 8) for lr, shift in ((1e-6, 0), (1e-5, 3), (1e-4, 2)) for s in (0, 1)}
    reversed_ = {(lr, s): np.clip(base - shift, 0, 8) for lr, shift in ((1e-6, 0), (1e-5, 2), (1e-4, 1)) for s in (0, 1)}
    agreeing = check(table({}, sizes={"p": same, "tiny-1m": target}))
    assert agreeing.rho["p"] == pytest.approx(1.0) and agreeing.proxy_best["p"] == agreeing.best
    assert f"rho(p, tiny-1m) = 1.00; p's best: {agreeing.best}" in signal_text(
        Table.from_json(table({}, sizes={"p": same, "tiny-1m": target})))
    found = check(table({}, sizes={"p": reversed_, "tiny-1m": target}))
    assert found.rho["p"] == pytest.approx(-1.0) and found.checks["rho(p, tiny-1m) >= 0.6"] is False
    assert found.proxy_best["p"] == found.ranking[-1]  # the proxy's best is the target's worst
    # a proxy not built yet is not a failed check: the verdict waits for it
    partial = table({}, sizes={"p": {key: same[key] for key in list(same)[:2]}, "tiny-1m": target})
    assert check(partial).checks["rho(p, tiny-1m) >= 0.6"] is None
    assert "| rho(p, tiny-1m) >= 0.6 | not yet: curves missing |" in signal_text(Table.from_json(partial))


def test_a_table_builds_in_process_keeps_per_problem_counts_and_a_rerun_runs_nothing(tmp_path, base_model,
                                                                                       monkeypatch):
    path = spec_file(tmp_path)
    lines: list[str] = []
    first = build(path, tmp_path / "out", log=lines.append, limit=1)
    assert len(first.cells) == 1 and sum("[hpo-table] cell" in line for line in lines) == 1
    assert "Not checked yet: 1 of 2 configurations" in (tmp_path / "out" / "signal.md").read_text()

    lines.clear()
    done = build(path, tmp_path / "out", log=lines.append)
    assert [line for line in lines if "[hpo-table] cell" in line] == [
        f"[hpo-table] cell 2/2: tiny-1m {config_key({'algorithm.lr_ref': 1e-4})} seed 0"]
    assert len(done.cells) == 2
    for cell in done.cells:
        assert [p.rollouts for p in cell.curve] == [0, 128, 256]
        assert all(len(p.counts) == 32 and p.samples == 8 for p in cell.curve)
    assert Table.from_json(json.loads((tmp_path / "out" / "table.json").read_text())) == done
    assert "| precondition | met |" in (tmp_path / "out" / "signal.md").read_text()

    lines.clear()
    build(path, tmp_path / "out", log=lines.append)
    assert not lines

    # a fresh clone has table.json but not the runs: the recorded curves stand and nothing runs
    import shutil
    shutil.rmtree(tmp_path / "out" / "runs")
    again = build(path, tmp_path / "out", log=lines.append)
    assert not lines and again.cells == done.cells

    # a newer warm-up builds other base models: the recorded curves are not this table's any more
    from isosweep.models import sizes
    monkeypatch.setattr(sizes, "WARMUP_VERSION", "99")
    other = build(path, tmp_path / "out", log=lines.append, limit=0)
    assert other.cells == [] and other.warmup_version == "99"


def test_the_committed_ladder_tables_signal_checks_are_what_the_readme_reports():
    """The README's verdicts on the two committed width-ladder tables, recomputed from their table.json:
    every parameter scaled by width fails rank transfer; the muP-style scaling meets every precondition."""
    ladder = check(json.loads((ROOT / "dashboards" / "hpo-table-ladder" / "table.json").read_text()))
    mup = check(json.loads((ROOT / "dashboards" / "hpo-table-mup" / "table.json").read_text()))
    rule = "rho(tiny-w128, tiny-w256) >= 0.6"
    assert ladder.checks[rule] is False and round(ladder.rho["tiny-w128"], 2) == 0.55
    assert all(mup.checks.values()) and list(mup.checks) == list(ladder.checks)
    assert round(mup.rho["tiny-w128"], 2) == 0.75 and round(mup.rho["tiny-w64"], 2) == 0.93
    assert mup.best == "lr_ref=0.0001,kl_coef=0.03" and set(mup.proxy_best.values()) == {"lr_ref=0.0001,kl_coef=0.001"}


@pytest.mark.parametrize("name", ["hpo-table-pilot", "hpo-table-mup"])
def test_a_committed_table_and_its_signal_round_trip_through_their_json(name):
    data = json.loads((ROOT / "dashboards" / name / "table.json").read_text())
    table_ = Table.from_json(data)
    assert Table.from_json(json.loads(json.dumps(table_.to_json()))) == table_
    assert [c.to_json() for c in table_.cells] == data["cells"]
    found = check_signal(table_)
    assert Signal.from_json(json.loads(json.dumps(found.to_json()))) == found
    assert signal_text(table_) == (ROOT / "dashboards" / name / "signal.md").read_text()
    incomplete = Signal(False, "1 of 2 configurations finished at tiny-1m")
    assert Signal.from_json(incomplete.to_json()) == incomplete and incomplete.to_json() == {
        "complete": False, "why": incomplete.why}
