"""A trial scores its ``eval.watch`` sets beside its eval set, and logs its step-0 zero-signal check: on the tabular
control, whose base pass rates are planted exactly, both are what the planting says."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from isosweep.spec.trial import load_trial
from isosweep.tasks import get_task
from isosweep.trial.job import run_trial

ROOT = Path(__file__).resolve().parents[2]


def test_a_watched_set_is_scored_beside_the_eval_set_and_the_zero_signal_check_is_logged_once(tmp_path):
    # trained on the needles (hard), the anchors (easy) watched: at step 0 their mean@4 is the anchors' planted
    # rates (0.3-0.6), the needles' about 0.02; the check sits in the first record after step 0 only
    cfg = load_trial(ROOT / "sweeps/trials/tabular-hard.yaml",
                     ["budget=1024", "n=8", "eval.every=4", "eval.samples=16", "eval.watch=[easy]"])
    records = run_trial(cfg, tmp_path / "trial", log=lambda *_: None)
    anchors = [f.epsilon for f in get_task("codes").families if not f.needle]
    first = records[0]
    assert abs(first["watch/easy/mean@4"] - np.mean(anchors)) < 0.05
    assert first["eval/mean@4"] < 0.05 and "watch/easy/stderr_mean@4" in first
    assert all("watch/easy/mean@4" in r for r in records)
    with_check = [r for r in records if "check/zero_signal_expected" in r]
    assert [r["step"] for r in with_check] == [4]
    check = with_check[0]
    # 16 groups of 8 at p ~ 0.02: most have no signal, and the observed fraction is within 4 sd of the prediction
    assert 0.6 < check["check/zero_signal_expected"] < 1.0 and check["check/zero_signal_sd"] > 0
    assert abs(check["check/zero_signal_observed"] - check["check/zero_signal_expected"]) < 4 * check["check/zero_signal_sd"]
