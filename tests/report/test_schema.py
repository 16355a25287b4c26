"""Saved analyses (fits.json) as typed data: the round trip, the one converter of older versions, the refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from isosweep.experiments.stats_validation import BUDGET, TRUTH, synthetic_sweep
from isosweep.report.analysis import analyse
from isosweep.report.render import write_outputs
from isosweep.report.schema import (
    SCHEMA_VERSION,
    SavedAnalysis,
    SchemaError,
    ZeroSignalSummary,
    read_analysis,
    upgrade,
    upgrade_folder,
)
from isosweep.track.curves import ZeroSignalCheck

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted((ROOT / "dashboards").rglob("fits.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=[str(p.relative_to(ROOT / "dashboards").parent) for p in COMMITTED])
def test_every_committed_analysis_is_of_the_current_version_and_reads_back_to_its_own_text(path):
    text = path.read_text()
    assert json.loads(text)["schema_version"] == SCHEMA_VERSION
    assert read_analysis(path).dumps() == text


def test_a_fresh_analysis_survives_the_file_unchanged(tmp_path):
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(2))
    analysis = analyse(curves, title="t-100k-abc", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=20,
                       difficulty="easy")
    write_outputs(analysis, tmp_path)
    saved = read_analysis(tmp_path / "fits.json")
    assert saved == analysis.saved() or json.dumps(saved.to_json()) == json.dumps(analysis.to_json())  # NaN != NaN
    assert saved.dumps() == (tmp_path / "fits.json").read_text()
    rows = saved.metrics["mean@4"].frontier
    assert [r.config for r in rows] == [r.config for r in analysis.metrics["mean@4"].rows]
    assert saved.sweeps == ("t-100k-abc",) and saved.metric("worst")[0] == "worst@4"


def version_1(saved: SavedAnalysis, with_eval: bool = False) -> dict:
    """``saved`` as the first version wrote it: no schema_version, rows without n_tie (and no eval, unless
    ``with_eval``: the later files of that version had it)."""
    data = saved.to_json()
    del data["schema_version"]
    if not with_eval:
        del data["eval"]
    for m in data["metrics"].values():
        for row in m["frontier"]:
            del row["n_tie"]
    return data


def test_version_1_is_converted_in_one_place_reading_n_tie_as_the_rows_tie():
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(3))
    saved = analyse(curves, title="t", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=20).saved()
    old = version_1(saved)
    converted = upgrade(old)
    assert converted["schema_version"] == SCHEMA_VERSION and converted["eval"] == {}
    for name, m in converted["metrics"].items():
        assert [r["n_tie"] for r in m["frontier"]] == [r["tie"] for r in old["metrics"][name]["frontier"]]
    again = SavedAnalysis.from_json(old)
    assert again.eval is None and again.metrics["mean@4"].frontier[-1].n_tie == old["metrics"]["mean@4"]["frontier"][-1]["tie"]
    assert upgrade(converted) == converted  # the current version passes through


def test_a_newer_version_or_the_earlier_method_is_refused_with_what_to_do(tmp_path):
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(3))
    data = analyse(curves, title="t", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0).to_json()
    with pytest.raises(SchemaError, match=f"x.json: schema_version {SCHEMA_VERSION + 1} is newer .* upgrade isosweep"):
        SavedAnalysis.from_json({**data, "schema_version": SCHEMA_VERSION + 1}, "x.json")
    earlier = {k: v for k, v in data.items() if k != "seeds"}
    with pytest.raises(SchemaError, match="earlier fitting method.*isosweep frontier <sweep-id> --dashboards"):
        SavedAnalysis.from_json(earlier)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "fits.json").write_text("{not json")
    with pytest.raises(SchemaError, match="broken/fits.json: not JSON"):
        read_analysis(tmp_path / "broken" / "fits.json")


def test_upgrade_rewrites_older_files_once_and_refuses_before_writing_anything(tmp_path):
    """`isosweep report --upgrade`: every fits.json at any depth to the current version; a rerun changes no byte;
    one file it cannot read stops it before any file is written."""
    root = tmp_path / "dashboards"
    for folder in ("bend-easy", "v2-eval256/n-only-easy"):
        shutil.copytree(ROOT / "dashboards" / folder, root / folder)
    old = version_1(read_analysis(root / "bend-easy" / "fits.json"), with_eval=True)
    (root / "bend-easy" / "fits.json").write_text(json.dumps(old, indent=1))
    assert upgrade_folder(root) == [root / "bend-easy" / "fits.json"]
    first = {p: p.read_bytes() for p in root.rglob("fits.json")}
    assert upgrade_folder(root) == [] and {p: p.read_bytes() for p in root.rglob("fits.json")} == first
    assert (root / "bend-easy" / "fits.json").read_bytes() == (ROOT / "dashboards" / "bend-easy" / "fits.json").read_bytes()

    (root / "bend-easy" / "fits.json").write_text(json.dumps(old, indent=1))
    (root / "zz").mkdir()
    (root / "zz" / "fits.json").write_text(json.dumps({**old, "schema_version": SCHEMA_VERSION + 1}))
    with pytest.raises(SchemaError, match="zz/fits.json"):
        upgrade_folder(root)
    assert json.loads((root / "bend-easy" / "fits.json").read_text()) == old  # nothing written


def test_the_zero_signal_summary_is_an_optional_key_that_older_files_do_without(tmp_path):
    """A file written before the step-0 zero-signal check (every committed one) reads with no summary and writes
    back byte for byte; an analysis of trials that logged the check keeps its summary through the file, without
    a new schema version."""
    committed = ROOT / "dashboards" / "bend-easy" / "fits.json"
    old = read_analysis(committed)
    assert old.zero_signal is None and "zero_signal" not in json.loads(committed.read_text())
    assert old.dumps() == committed.read_text()
    curves, _ = synthetic_sweep(TRUTH, np.random.default_rng(2))
    for curve in curves:
        curve.zero_signal = ZeroSignalCheck(0.43, 0.41, 0.06)
    saved = analyse(curves, title="t", study="isocompute", budget=BUDGET, primary="mean@4", bootstrap=0).saved()
    data = saved.to_json()
    assert data["schema_version"] == SCHEMA_VERSION and data["zero_signal"] == saved.zero_signal.to_json()
    (tmp_path / "fits.json").write_text(saved.dumps())
    back = read_analysis(tmp_path / "fits.json")
    z = 0.02 * len(curves) / (0.06 * len(curves) ** 0.5)  # sum of differences over the pooled sd
    assert back.zero_signal == saved.zero_signal == ZeroSignalSummary(
        len(curves), pytest.approx(0.43), pytest.approx(0.41), pytest.approx(z), False)
    assert back.dumps() == (tmp_path / "fits.json").read_text()
    assert upgrade(data) == data
