"""Sweep files: every file in sweeps/ loads; a bad file or budget stops with the file, the key and why."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest

import isosweep.spec.grid as spec_grid
import isosweep.spec.trial as spec_trial
import isosweep.spec.values as values
from isosweep.run.grid import folder_sweeps
from isosweep.spec.grid import load_sweep
from isosweep.spec.trial import TrialConfig, eval_steps, steps
from isosweep.spec.values import parse_budget
from isosweep.spec.yamlio import ConfigError

ROOT = Path(__file__).resolve().parents[2]

def test_the_studies_the_readme_names_exist():
    names = {p.name for p in (ROOT / "sweeps").glob("*.yaml")}
    assert {"isocompute-easy.yaml", "isocompute-hard.yaml", "fixed-batch.yaml", "smoke.yaml"} <= names
    assert load_sweep(ROOT / "sweeps/isocompute-easy.yaml").trials[0].cfg.task.difficulty == "easy"
    assert load_sweep(ROOT / "sweeps/isocompute-hard.yaml").trials[0].cfg.task.difficulty == "hard"


def test_docstring_examples_hold():
    for module in (spec_grid, spec_trial, values):
        assert doctest.testmod(module).failed == 0


def test_isocompute_grid_is_n_times_Bp_at_one_budget_and_M_is_derived():
    sweep = load_sweep(ROOT / "sweeps/isocompute-easy.yaml", budget="1e5")
    spec = sweep.spec
    assert sweep.budget == 100_000
    assert [(p.cfg.n, p.cfg.Bp) for p in sweep.trials] == [(n, Bp) for n in spec.grid.n for Bp in spec.grid.Bp]
    for p in sweep.trials:
        assert p.fields["M"] == 100_000 // (p.cfg.n * p.cfg.Bp) == steps(p.cfg)
        assert p.key == f"n{p.cfg.n}-Bp{p.cfg.Bp}" == p.config_key


def test_fixed_batch_keeps_Bp_times_n_and_the_step_count():
    sweep = load_sweep(ROOT / "sweeps/fixed-batch.yaml", budget=12_800)
    batch = sweep.spec.grid.batch
    assert {p.cfg.Bp * p.cfg.n for p in sweep.trials} == {batch}
    assert {steps(p.cfg) for p in sweep.trials} == {12_800 // batch}


def write(tmp_path, text: str, trial: str | None = None) -> Path:
    (tmp_path / "trial.yaml").write_text(trial or (ROOT / "sweeps/trials/easy.yaml").read_text())
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


BASE = """name: study
study: isocompute
trial: trial.yaml
budget: 4096
grid: {n: [4, 8], Bp: [8, 16]}
"""


def error_of(path, budget=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_sweep(path, budget)
    return str(info.value)


def test_unknown_key_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path, BASE + "concurency: 4\n")
    message = error_of(path)
    assert str(path) in message and "'concurency'" in message and "unknown key" in message
    message = error_of(write(tmp_path, BASE.replace("grid: {", "grid: {bacth: 3, ")))
    assert "'grid.bacth'" in message and "allowed here: n, Bp, batch" in message


def test_budget_too_small_for_a_grid_point_names_the_point(tmp_path):
    message = error_of(write(tmp_path, BASE), budget=100)
    assert "grid point n8-Bp16" in message and "budget >= Bp * n" in message


@pytest.mark.parametrize("budget, reason", [("abc", "not a number"), ("0", "positive whole"), ("1.5", "positive whole"),
                                            ("-1e5", "positive whole")])
def test_impossible_budget_strings_say_why(tmp_path, budget, reason):
    assert reason in error_of(write(tmp_path, BASE), budget=budget)


def test_budget_strings_parse_as_rollouts():
    assert parse_budget("1e5") == 100_000 and parse_budget(2000) == 2000 and parse_budget("2e3") == 2000


@pytest.mark.parametrize("grid, fragment", [
    ("grid: {n: [4, 8]}", "needs grid.n and grid.Bp"),
    ("grid: {n: [4, 8], Bp: [8], batch: 64}", "needs grid.n and grid.Bp"),
    ("grid: {n: [4, 4], Bp: [8]}", "distinct"),
    ("grid: {n: [0, 4], Bp: [8]}", "must be > 0"),
    ("grid: {n: [], Bp: [8]}", "at least 1"),
])
def test_grid_must_fit_the_study(tmp_path, grid, fragment):
    message = error_of(write(tmp_path, BASE.replace("grid: {n: [4, 8], Bp: [8, 16]}", grid)))
    assert fragment in message and "study.yaml" in message


def test_fixed_batch_needs_a_batch_that_n_divides(tmp_path):
    text = BASE.replace("study: isocompute", "study: fixed-batch")
    assert "needs grid.n and grid.batch" in error_of(write(tmp_path, text))
    text = text.replace("grid: {n: [4, 8], Bp: [8, 16]}", "grid: {n: [3, 4], batch: 64}")
    assert "not a multiple of n = [3]" in error_of(write(tmp_path, text))


def test_missing_trial_file_and_bad_set_key_are_named(tmp_path):
    assert "key 'trial': no such file 'nope.yaml'" in error_of(write(tmp_path, BASE.replace("trial.yaml", "nope.yaml")))
    message = error_of(write(tmp_path, BASE + "set: {algorithm.lr_rfe: 1.0e-5}\n"))
    assert "'algorithm.lr_rfe'" in message and "grid point n4-Bp8" in message


def test_bad_name_is_rejected(tmp_path):
    assert "lower case" in error_of(write(tmp_path, BASE.replace("name: study", "name: My Study")))


def test_set_overrides_reach_every_trial_and_seeds_multiply_the_grid(tmp_path):
    path = write(tmp_path, BASE + "seeds: [0, 7]\nset: {algorithm.lr_ref: 3.0e-5, eval.points: 6, rollout.engine: hf}\n")
    sweep = load_sweep(path)
    assert len(sweep.trials) == 8
    assert {p.cfg.algorithm.lr_ref for p in sweep.trials} == {3e-5}
    assert {p.cfg.rollout.engine for p in sweep.trials} == {"hf"}
    assert [p.key for p in sweep.trials][4:6] == ["n4-Bp8-s7", "n4-Bp16-s7"]
    assert {p.config_key for p in sweep.trials if p.cfg.seed == 7} == {p.config_key for p in sweep.trials if p.cfg.seed == 0}


def test_sweep_id_is_stable_and_changes_with_the_grid_or_budget(tmp_path):
    path = write(tmp_path, BASE)
    first = load_sweep(path).sweep_id
    assert load_sweep(path).sweep_id == first and first.startswith("study-4096-")
    assert load_sweep(path, budget=8192).sweep_id.startswith("study-8192-")
    path.write_text(BASE.replace("Bp: [8, 16]", "Bp: [8, 32]"))
    assert load_sweep(path).sweep_id != first


def test_eval_points_are_log_spaced_in_compute():
    cfg = TrialConfig(budget=128 * 1000, Bp=16, n=8, eval={"points": 7, "first": 1 / 64})
    steps = eval_steps(cfg)
    assert steps[0] == 0 and steps[-1] == 1000 and steps == sorted(set(steps))
    ratios = [b / a for a, b in zip(steps[1:], steps[2:])]
    assert all(abs(r - ratios[0]) < 0.1 for r in ratios)  # a constant factor apart: 64 ** (1 / 6)
    tiny = TrialConfig(budget=128 * 3, Bp=16, n=8, eval={"points": 12})
    assert eval_steps(tiny) == [0, 1, 2, 3]
    assert eval_steps(TrialConfig(budget=128 * 50, Bp=16, n=8, eval={"every": 20})) == [0, 20, 40, 50]


STUDY_FILES = [ROOT / "sweeps" / "isocompute-hard.yaml", *sorted((ROOT / "sweeps" / "studies").glob("*.yaml"))]


def test_the_studies_of_this_repository_live_apart_from_the_sweeps_to_copy():
    studies = {p.stem for p in (ROOT / "sweeps" / "studies").glob("*.yaml")}
    assert len(studies) >= 18 and {"bend-easy", "long-easy-seed1", "easy-bp64-seeds45"} <= studies
    assert not studies & {p.stem for p in (ROOT / "sweeps").glob("*.yaml")}


@pytest.mark.parametrize("sweep_file", STUDY_FILES, ids=[p.name for p in STUDY_FILES])
def test_a_committed_study_is_the_sweep_its_file_runs(sweep_file):
    """Every study file's sweep was analysed into a committed dashboards/ folder (its own, or the one that pools
    it with its other seeds) under the id the file gives today: rerunning the file, from wherever it lives now,
    resumes (or finds finished) those trials instead of starting another sweep."""
    held = {sweep_id: folder for folder, ids in folder_sweeps(ROOT / "dashboards").items() for sweep_id in ids}
    name = load_sweep(sweep_file).spec.name
    budgets = {json.loads((folder / "fits.json").read_text())["budget"] for sweep_id, folder in held.items()
               if sweep_id.startswith(name + "-")}
    assert budgets, f"no dashboards/ folder holds a sweep of {sweep_file.name}"
    assert any(load_sweep(sweep_file, budget=budget).sweep_id in held for budget in budgets)


@pytest.mark.parametrize(("sweep_file", "folder"), [("isocompute-easy.yaml", "isocompute-easy"),
                                                    ("n-only.yaml", "n-only-easy"), ("fixed-batch.yaml", "fixed-batch")])
def test_a_sweep_keeps_its_id_across_versions_so_a_rerun_resumes_it(sweep_file, folder, tmp_path, monkeypatch):
    """Keys added to the trial config later (at their defaults) leave a sweep's id as it was: the studies
    committed in dashboards/ were run under these ids, and a rerun of their files must find their trials. The
    archived ones ran under earlier defaults: dashboards/v2-eval256/ on 256 eval problems x 8 samples,
    dashboards/v2-lr1e-5/ also at lr_ref 1e-5, and dashboards/warmup-v1/ also on base models of the first
    warm-up version, which carried no version in the id. Their files with those settings restored give their
    ids back; as they stand, a rerun is a new sweep, not a resumption."""
    from isosweep.models import sizes

    committed = json.loads((ROOT / "dashboards" / folder / "fits.json").read_text())
    sweep = load_sweep(ROOT / "sweeps" / sweep_file, budget=committed["budget"])
    assert sweep.sweep_id == committed["title"]
    text = (ROOT / "sweeps" / sweep_file).read_text().replace("trial: trials/", f"trial: {ROOT}/sweeps/trials/")

    def with_set(*lines: str) -> Path:
        path = tmp_path / f"{'-'.join(line.split(':')[0] for line in lines)}-{sweep_file}"
        path.write_text(text.replace("\nset:\n", "\nset:\n" + "".join(f"  {line}\n" for line in lines)))
        return path

    raw = load_sweep(with_set("task.prompt_format: raw"), budget=committed["budget"])  # a key set is a change
    assert raw.sweep_id != sweep.sweep_id and raw.sweep_id.startswith(sweep.sweep_id[:-6])

    smaller_eval = ("task.eval_problems: 256", "eval.samples: 8")  # the eval set before 512 problems x 16 samples
    eval256 = json.loads((ROOT / "dashboards" / "v2-eval256" / folder / "fits.json").read_text())
    assert sweep.sweep_id != eval256["title"]
    assert load_sweep(with_set(*smaller_eval), budget=eval256["budget"]).sweep_id == eval256["title"]

    earlier_lr = with_set(*smaller_eval, "algorithm.lr_ref: 1.0e-5")  # the default before the version-2 pilot
    archived = json.loads((ROOT / "dashboards" / "v2-lr1e-5" / folder / "fits.json").read_text())
    assert sweep.sweep_id != archived["title"] and eval256["title"] != archived["title"]
    assert load_sweep(earlier_lr, budget=archived["budget"]).sweep_id == archived["title"]

    first = json.loads((ROOT / "dashboards" / "warmup-v1" / folder / "fits.json").read_text())
    assert sizes.warmup_version_in_ids() == "2" and archived["title"] != first["title"]
    monkeypatch.setattr(sizes, "WARMUP_VERSION", sizes.FIRST_WARMUP_VERSION)  # the base models those studies ran on
    assert load_sweep(earlier_lr, budget=first["budget"]).sweep_id == first["title"]
