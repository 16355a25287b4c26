"""A trial's curve as ``curves.json`` keeps it: the round trip, the step-0 zero-signal check carried only where a
trial logged it, and every committed file read back to its own text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from isosweep.report.planner import cut
from isosweep.track.curves import ZERO_SIGNAL_KEYS, Curve, SweepData, ZeroSignalCheck, zero_signal_of

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "dashboards").rglob("curves.json"))


def a_curve(check: ZeroSignalCheck | None = None) -> Curve:
    return Curve(key="n8-Bp16-s1", config="n8-Bp16", fields={"n": 8, "Bp": 16, "M": 10, "seed": 1},
                 compute=np.array([0.0, 128.0, 1280.0]), values={"mean@4": np.array([0.5, 0.55, 0.6])},
                 counts=np.array([[1, 2], [2, 3], [3, 4]], dtype=float), samples=4, eval_set="abc", zero_signal=check)


def test_a_curve_with_the_check_round_trips_and_one_without_writes_no_new_key():
    check = ZeroSignalCheck(observed=0.4375, expected=0.398, sd=0.107)
    data = a_curve(check).to_json()
    assert data["zero_signal"] == {"observed": 0.4375, "expected": 0.398, "sd": 0.107}
    back = Curve.from_json(json.loads(json.dumps(data)))
    assert back.zero_signal == check and json.dumps(back.to_json()) == json.dumps(data)
    plain = a_curve().to_json()
    assert "zero_signal" not in plain
    assert set(plain) == {"key", "config", "fields", "compute", "values", "counts", "samples", "eval_set"}
    assert Curve.from_json(plain).zero_signal is None


def test_the_check_is_read_from_the_first_record_that_holds_all_three_numbers():
    observed, expected, sd = ZERO_SIGNAL_KEYS
    records = [{"rollouts": 0, "eval/mean@4": 0.5},  # the evaluation before step 0: no check yet
               {"rollouts": 128, observed: 0.5, expected: 0.25},  # one number missing: not a check
               {"rollouts": 256, observed: 0.5, expected: 0.4, sd: 0.1},
               {"rollouts": 512, observed: 0.9, expected: 0.9, sd: 0.1}]
    assert zero_signal_of(records) == ZeroSignalCheck(0.5, 0.4, 0.1)
    assert zero_signal_of(records[:2]) is None and zero_signal_of([]) is None
    assert zero_signal_of([{observed: None, expected: 0.4, sd: 0.1}]) is None  # a null the file held
    assert zero_signal_of([{observed: float("nan"), expected: 0.4, sd: 0.1}]) is None


def test_a_cut_keeps_the_check_once_an_evaluation_past_step_0_is_kept():
    check = ZeroSignalCheck(0.5, 0.4, 0.1)
    assert cut(a_curve(check), 128).zero_signal == check
    assert cut(a_curve(check), 0).zero_signal is None  # only the base evaluation: the check came later


@pytest.mark.parametrize("path", COMMITTED, ids=[str(p.relative_to(ROOT / "dashboards").parent) for p in COMMITTED])
def test_every_committed_curves_file_reads_back_to_its_own_text(path):
    text = path.read_text()
    assert json.dumps(SweepData.from_json(json.loads(text), str(path)).to_json()) == text
