"""The runner core without a cluster: trial jobs as Tune sees them, concurrency, durations, progress lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from isosweep.run.core import TrialJob, duration, is_finished, max_concurrency, trial_of
from isosweep.run.grid import GridProgress
from isosweep.spec.grid import load_sweep
from isosweep.spec.yamlio import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "sweeps" / "smoke.yaml"


def test_a_trial_job_round_trips_through_tune_as_plain_data(tmp_path):
    sweep = load_sweep(SMOKE, 2000)
    point = sweep.trials[0]
    job = TrialJob(key=point.key, config_key=point.config_key, cfg=point.cfg, out=str(tmp_path / point.key),
                   sweep_id=sweep.sweep_id, parent_run_id="p", tracking_uri="http://127.0.0.1:1",
                   tags={"isosweep.promoted": "false"})
    data = job.to_tune()
    assert isinstance(data["cfg"], dict) and data["key"] == point.key
    assert TrialJob.from_tune(data) == job
    assert job.trial.path == tmp_path / point.key


def test_concurrency_is_what_the_cluster_fits():
    cfgs = [p.cfg for p in load_sweep(SMOKE, 2000).trials]  # cpu-half: 0.1 + 0.45 + 0.45 CPU per trial
    assert max_concurrency(cfgs, {"CPU": 2.0}, "smoke") == 2
    assert max_concurrency(cfgs, {"CPU": 8.0}, "smoke") == 2  # never more than there are trials
    assert max_concurrency(cfgs, {"CPU": 8.0}, "smoke", limit=1) == 1
    with pytest.raises(ConfigError, match="smoke: one trial needs 1 CPU and 0 GPU .* has 0.5 CPU"):
        max_concurrency(cfgs, {"CPU": 0.5}, "smoke")


def test_durations_read_as_people_write_them():
    assert [duration(s) for s in (0, 75, 3599, 3700)] == ["0m00s", "1m15s", "59m59s", "1h01m"]


def test_grid_progress_counts_finished_trials_and_estimates_only_once_settled(tmp_path):
    sweep = load_sweep(SMOKE, 2000)
    first, second = sweep.trials
    done = trial_of(tmp_path, first.key)
    done.path.mkdir(parents=True)
    last = first.cfg.budget // (first.cfg.Bp * first.cfg.n)
    done.append_record({"step": 0, "rollouts": 0, sweep.metric: 0.4})
    done.append_record({"step": last, "rollouts": last * first.cfg.Bp * first.cfg.n, sweep.metric: 0.6})
    assert is_finished(done, first.cfg) and not is_finished(trial_of(tmp_path, second.key), second.cfg)
    progress = GridProgress(sweep, tmp_path)
    line = progress.status(running=1, failed=0, elapsed_s=10)
    assert line.startswith("[sweep] 1/2 trials done, 1 running, 0 failed")
    assert f"best {sweep.metric} 0.600 ({first.key})" in line and "estimating time left" in line
    progress.result(second.key, {"rollouts": 1024, sweep.metric: 0.7})
    line = progress.status(running=1, failed=0, elapsed_s=10)
    assert f"best {sweep.metric} 0.700 ({second.key})" in line and "left" in line and "estimating" not in line
    assert progress.complete(second.key) == f"[sweep] trial {second.key} finished"
    assert progress.status(running=0, failed=0, elapsed_s=20).startswith("[sweep] 2/2 trials done")
