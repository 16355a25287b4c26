"""The study ledger, alone: spend, commitments, fidelity cuts, promotions, the incumbent, its state.

Everything here runs without Ray, MLflow or a trial folder: the ledger is plain bookkeeping over
the loaded smoke study (tiny-0.3m -> tiny-1m, C = 512, batch 64, per-trial charge 0.1 C).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from isosweep.hpo.ledger import StudyLedger, TrialEntry
from isosweep.spec.hpo import load_hpo

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "sweeps" / "hpo-smoke.yaml"
PARAMS = {"algorithm.lr_ref": 2e-5, "algorithm.clip_high": 0.3, "algorithm.kl_coef": 1e-3}


def study(**overrides):
    return load_hpo(SMOKE, overrides=overrides or None)


def records(reached: int, value: float, base: float = 0.5) -> list[dict]:
    """Eval records of a trial that reached ``reached`` rollouts (batch 64), the base model's first."""
    return [{"step": 0, "rollouts": 0, "eval/mean@4": base},
            {"step": reached // 64, "rollouts": reached, "eval/mean@4": value}]


def run(ledger: StudyLedger, key: str, size: str, budget: int, value: float, params=PARAMS, reached=None,
        stop_rule=None) -> TrialEntry:
    ledger.add(TrialEntry(key=key, size=size, budget=budget, params=dict(params)))
    reached = budget if reached is None else reached
    return ledger.complete(key, records(reached, value), trained_to=reached, error=False, stop_rule=stop_rule,
                           seconds=1.0)


def test_a_finished_trial_is_charged_what_it_trained_and_commits_nothing_more():
    s = study(jfhpo={"final_at_target": False})
    ledger = StudyLedger(s)
    ledger.add(TrialEntry(key="a", size="tiny-1m", budget=512, params=PARAMS))
    assert ledger.committed == pytest.approx(s.cost("tiny-1m", 512)) and ledger.spent == 0
    assert ledger.left == pytest.approx(s.study_budget - s.cost("tiny-1m", 512))
    entry = ledger.complete("a", records(512, 0.6), trained_to=512, error=False, stop_rule=None, seconds=3.0)
    assert (entry.status, entry.stop_reason, entry.reached, entry.value, entry.best) == ("done", "completed", 512, 0.6, 0.6)
    assert entry.cost == pytest.approx(512 + 0.1 * 512) and ledger.spent == pytest.approx(entry.cost)
    assert ledger.committed == 0 and entry.spent_after == ledger.spent


def test_a_stopped_trial_is_charged_for_what_it_trained_and_says_why():
    s = study(search="asha")
    ledger = StudyLedger(s)
    entry = run(ledger, "a", "tiny-1m", 512, 0.4, reached=192, stop_rule=None)
    assert (entry.status, entry.stop_reason) == ("stopped", "asha")
    assert entry.cost == pytest.approx(192 + 0.1 * 512)
    entry = run(ledger, "b", "tiny-1m", 512, 0.4, reached=128, stop_rule="kl_growth")
    assert entry.stop_reason == "kl_growth"
    ledger.add(TrialEntry(key="c", size="tiny-1m", budget=512, params=PARAMS))
    failed = ledger.complete("c", [], trained_to=64, error=True, stop_rule=None, seconds=None)
    assert (failed.status, failed.stop_reason, failed.value, failed.best) == ("failed", "error", None, None)


def test_the_incumbent_is_the_best_target_eval_after_training_began():
    ledger = StudyLedger(study(jfhpo={"final_at_target": False}))
    assert ledger.incumbent() is None
    run(ledger, "proxy", "tiny-0.3m", 256, 0.9)  # a proxy's value never counts for the target
    assert ledger.incumbent() is None
    ledger.add(TrialEntry(key="t", size="tiny-1m", budget=256, params=PARAMS))
    ledger.complete("t", records(256, 0.45, base=0.7), trained_to=256, error=False, stop_rule=None, seconds=1.0)
    assert ledger.incumbent() == 0.45  # not the base model's 0.7 at rollouts 0
    run(ledger, "t2", "tiny-1m", 256, 0.55)
    points = ledger.trajectory
    assert [p["incumbent"] for p in points] == [None, 0.45, 0.55]
    assert [p["best_any"] for p in points] == [0.9, 0.9, 0.9]
    assert [p["spent"] for p in points] == sorted(p["spent"] for p in points)


def test_random_search_starts_only_trials_it_can_pay_for_in_full():
    s = study(search="random", study_budget="2.5x")
    full = s.cost(s.target, s.budget)
    ledger = StudyLedger(s)
    assert ledger.next() == ("propose", None)
    ledger.add(TrialEntry(key="a", size=s.target, budget=s.budget, params=PARAMS))
    assert ledger.next() == ("propose", None)  # 2.5 - 1 committed leaves 1.5 full trials
    ledger.add(TrialEntry(key="b", size=s.target, budget=s.budget, params=PARAMS))
    assert ledger.next() == ("wait", None)  # 0.5 left: wait for the running ones...
    ledger.complete("a", records(s.budget, 0.5), trained_to=s.budget, error=False, stop_rule=None, seconds=1.0)
    ledger.complete("b", records(s.budget, 0.5), trained_to=s.budget, error=False, stop_rule=None, seconds=1.0)
    assert ledger.next() == ("finished", None)  # ...then end, never overspend
    assert ledger.spent == pytest.approx(2 * full) and ledger.spent <= s.study_budget


def test_jfhpo_keeps_one_full_trial_for_the_final_recommendation():
    s = study()
    full = s.cost(s.target, s.budget)
    ledger = StudyLedger(s)
    action, room = ledger.next()
    assert action == "propose" and room == pytest.approx(s.study_budget - full - 0.1 * s.budget)
    # spend all but the reserve (and less than the cheapest trial beyond it)
    ledger.spent = s.study_budget - full
    assert ledger.next() == ("final", None)
    ledger.add(TrialEntry(key="r", size=s.target, budget=s.budget, params=PARAMS))
    assert ledger.next() == ("wait", None)
    ledger.final_issued = True
    ledger.complete("r", records(s.budget, 0.5), trained_to=s.budget, error=False, stop_rule=None, seconds=1.0)
    assert ledger.next() == ("finished", None)


def test_nothing_is_proposed_after_a_promoted_final_recommendation_that_cost_less_than_its_reserve():
    s = study()
    ledger = StudyLedger(s)
    run(ledger, "t", s.target, 128, 0.5)  # the recommendation already ran at the target, at C / 4
    ledger.spent = s.study_budget - s.cost(s.target, s.budget)  # what is left is the reserve
    assert ledger.next() == ("final", None)
    ledger.final_issued = True
    ledger.add(TrialEntry(key="t-final", size=s.target, budget=s.budget, params=PARAMS, start_rollouts=128,
                          promoted_from="t", final=True))
    # the promotion commits only the added rollouts: room for a proxy opens, but the study only waits, then ends
    assert ledger.left - s.cost("tiny-0.3m", s.space.budget_min) > 0
    assert ledger.next() == ("wait", None)
    ledger.complete("t-final", records(s.budget, 0.55), trained_to=s.budget, error=False, stop_rule=None, seconds=1.0)
    assert ledger.next() == ("finished", None)


def test_the_final_recommendation_waits_for_running_trials():
    s = study()
    ledger = StudyLedger(s)
    ledger.spent = s.study_budget - s.cost(s.target, s.budget)
    ledger.add(TrialEntry(key="x", size="tiny-0.3m", budget=128, params=PARAMS))
    assert ledger.next() == ("wait", None)


def test_budgets_are_cut_to_what_is_left_then_moved_to_the_smallest_size():
    s = study()
    ledger = StudyLedger(s)
    assert ledger.fit_budget("tiny-1m", 512, room=1e9) == ("tiny-1m", 512)  # room enough: unchanged
    size, budget = ledger.fit_budget("tiny-1m", 512, room=300.0)
    assert size == "tiny-1m" and budget == 256 and budget % s.batch == 0  # 300 pays for 4 steps of 64
    small = s.size_fidelity("tiny-0.3m")
    size, budget = ledger.fit_budget("tiny-1m", 512, room=100.0)  # less than budget_min on tiny-1m
    assert size == "tiny-0.3m" and budget == min(512, int(100.0 / small) // 64 * 64)
    assert ledger.fit_budget("tiny-1m", 512, room=1.0)[1] == s.space.budget_min  # never below the smallest budget


def test_nearest_and_promotion_source_pick_the_furthest_finished_run_of_a_config():
    ledger = StudyLedger(study(jfhpo={"final_at_target": False}))
    near = {**PARAMS, "algorithm.lr_ref": 2.05e-5}
    far = {**PARAMS, "algorithm.lr_ref": 9e-5}
    run(ledger, "a", "tiny-1m", 128, 0.5)
    run(ledger, "b", "tiny-1m", 256, 0.5)
    run(ledger, "e", "tiny-1m", 128, 0.5, params=near)
    run(ledger, "c", "tiny-0.3m", 256, 0.5, params=near)
    assert ledger.nearest("tiny-1m", near, 512, radius=0.05).key == "e"  # the closest, at the same size only
    assert ledger.nearest("tiny-1m", far, 512, radius=0.05) is None  # none within the radius
    assert ledger.nearest("tiny-1m", PARAMS, 200, radius=1e-6).key == "a"  # only runs below the new budget
    entry = TrialEntry(key="d", size="tiny-1m", budget=512, params=dict(PARAMS))
    assert ledger.promotion_source(entry, has_checkpoint=lambda key: True).key == "b"  # the furthest of its config
    assert ledger.promotion_source(entry, has_checkpoint=lambda key: key == "a").key == "a"
    assert ledger.promotion_source(entry, has_checkpoint=lambda key: False) is None


def test_a_recommendation_that_already_ran_adds_no_trial():
    s = study()
    ledger = StudyLedger(s)
    run(ledger, "t", s.target, s.budget, 0.5)
    assert ledger.ran_at_target(PARAMS).key == "t"
    assert ledger.ran_at_target({**PARAMS, "algorithm.lr_ref": 5e-5}) is None
    run(ledger, "short", s.target, 256, 0.5, params={**PARAMS, "algorithm.clip_high": 0.25})
    rounded = {**PARAMS, "algorithm.clip_high": 0.25 + 1e-12}  # a unit-cube round trip away
    assert ledger.final_params(rounded) == {**PARAMS, "algorithm.clip_high": 0.25}  # snapped: it will be promoted


def test_the_state_round_trips_through_json():
    s = study()
    ledger = StudyLedger(s)
    run(ledger, "a", "tiny-0.3m", 256, 0.5)
    ledger.add(TrialEntry(key="b", size="tiny-1m", budget=512, params=PARAMS, promoted_from="a", start_rollouts=256))
    again = StudyLedger(s)
    again.load(json.loads(json.dumps(ledger.state())))
    assert again.trials == ledger.trials and again.spent == ledger.spent and again.trajectory == ledger.trajectory
    assert [t.key for t in again.running] == ["b"]
    assert again.committed == pytest.approx(s.cost("tiny-1m", 256))  # a promoted trial commits only what it adds
