"""The runner core without a cluster: trial jobs as Tune sees them, concurrency, durations, progress lines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from isosweep.run.core import (
    Progress,
    TrialJob,
    TrialsOutcome,
    duration,
    is_finished,
    max_concurrency,
    open_study,
    trial_of,
    trials_outcome,
)
from isosweep.run.grid import GridProgress
from isosweep.run.lock import LOCK_FILE, lock_study, release_study
from isosweep.spec.grid import load_sweep
from isosweep.spec.yamlio import ConfigError
from isosweep.track import runs

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


@pytest.mark.parametrize(("made", "ended", "failed", "expected", "outcome"), [
    (2, 2, [], None, TrialsOutcome(interrupted=False)),  # every trial ended: done
    (2, 2, ["b"], 2, TrialsOutcome(interrupted=False, failed=("b",))),  # one failed after its retries
    (3, 1, [], None, TrialsOutcome(interrupted=True)),  # Ctrl-C: Tune stopped two trials it had made
    (3, 2, ["c", "a"], None, TrialsOutcome(interrupted=True, failed=("a", "c"))),  # both: failures sorted
    (1, 1, [], 2, TrialsOutcome(interrupted=True)),  # Ctrl-C between one grid trial's end and the next's start
    (0, 0, [], None, TrialsOutcome(interrupted=False)),  # an HPO search that proposed nothing more
])
def test_a_tune_runs_outcome_is_interrupted_only_when_a_trial_it_made_or_expected_never_ended(
        made, ended, failed, expected, outcome):
    assert trials_outcome(made, ended, failed, expected) == outcome


def test_the_outcome_reads_tunes_callbacks_as_progress_records_them(tmp_path):
    """What :func:`isosweep.run.core.run_trials` hands :func:`trials_outcome`: the trials that ended are those
    Tune called back as complete (an HPO study's early stop included) or failed; one Tune stopped at a Ctrl-C
    gets no call, and the outcome is interrupted."""
    state = SimpleNamespace(complete=lambda key: f"[t] {key} finished", status=lambda *args: "[t] status")
    progress = Progress(state, tmp_path, log=lambda line: None, every_s=1e9, prefix="t")
    trial = lambda key: SimpleNamespace(config={"trial": {"key": key}}, local_path=str(tmp_path / key))  # noqa: E731
    progress.on_trial_complete(0, [], trial("a"))
    progress.on_trial_error(0, [], trial("b"))
    assert trials_outcome(2, len(progress.ended), progress.failed) == TrialsOutcome(interrupted=False, failed=("b",))
    assert trials_outcome(3, len(progress.ended), progress.failed) == TrialsOutcome(interrupted=True, failed=("b",))


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


def test_grid_progress_counts_a_running_trials_steps_between_its_evaluations(tmp_path):
    """Evaluations are log-spaced, so a trial's last interval is half its rollouts: between two Tune results the
    line reads how far each unfinished trial has trained from its ``steps.jsonl``."""
    sweep = load_sweep(SMOKE, 2000)
    first, second = sweep.trials
    running = trial_of(tmp_path, second.key)
    running.path.mkdir(parents=True)
    running.append_record({"step": 0, "rollouts": 0, sweep.metric: 0.4})
    progress = GridProgress(sweep, tmp_path)
    total = f"/{sum(progress.total.values()):,} rollouts"
    assert f"| 0{total}" in progress.status(running=2, failed=0, elapsed_s=5)
    batch = second.cfg.Bp * second.cfg.n
    for step in (1, 2, 3):
        running.append_step({"step": step, "rollouts": step * batch})
    assert f"| {3 * batch:,}{total}" in progress.status(running=2, failed=0, elapsed_s=10)
    progress.result(second.key, {"rollouts": 2 * batch, sweep.metric: 0.5})  # an older report does not set it back
    assert f"| {3 * batch:,}{total}" in progress.status(running=2, failed=0, elapsed_s=15)
    progress.complete(second.key)
    assert f"| {progress.total[second.key]:,}{total}" in progress.status(running=1, failed=0, elapsed_s=20)
    # a driver started again (a resume) starts from where the files are, so its rate counts only new work
    assert GridProgress(sweep, tmp_path).at_start == 3 * batch


def test_a_report_folder_that_holds_other_reports_is_refused_before_anything_is_written(tmp_path):
    """`isosweep frontier --dashboards DIR` writes into DIR itself (`isosweep sweep --dashboards` into DIR/<name>): given
    the dashboards root, it once overwrote the study report's report.html and left a sweep's files beside it."""
    import json

    from isosweep.run.grid import check_report_folder

    root = tmp_path / "dashboards"
    (root / "bend-easy").mkdir(parents=True)
    (root / "bend-easy" / "fits.json").write_text(json.dumps({"title": "bend-easy-400k-abc"}))
    (root / "REPORT.md").write_text("# What the studies found\n")
    with pytest.raises(ConfigError, match=r"holds the study report and other studies' folders \(REPORT.md, bend-easy/\)"
                                          r".* --dashboards .*dashboards/<study>"):
        check_report_folder(root, "long-easy-bp64-800k-86f9e5")
    (root / "REPORT.md").unlink()
    with pytest.raises(ConfigError, match=r"other studies' folders \(bend-easy/\)"):
        check_report_folder(root, "long-easy-bp64-800k-86f9e5")
    with pytest.raises(ConfigError, match=r"holds the report of sweep bend-easy-400k-abc, which this sweep's report "
                                          r"\(bend-easy-800k-def\) would overwrite"):
        check_report_folder(root / "bend-easy", "bend-easy-800k-def")
    check_report_folder(root / "bend-easy", "bend-easy-400k-abc")  # its own report again: redone in place
    check_report_folder(root / "long-easy-bp64", "long-easy-bp64-800k-86f9e5")  # a new folder
    pooled = root / "long-easy"
    pooled.mkdir()
    (pooled / "fits.json").write_text(json.dumps({"title": "long-easy-1600k-a", "pooled_from": ["long-easy-1600k-a",
                                                                                                  "long-easy-seed1-b"]}))
    with pytest.raises(ConfigError, match=r"the pooled analysis of long-easy-1600k-a, long-easy-seed1-b.*--refresh"):
        check_report_folder(pooled, "long-easy-1600k-a")
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [  # the checks wrote nothing
        "bend-easy", "bend-easy/fits.json", "long-easy", "long-easy/fits.json"]


def _hold_lock(folder: Path) -> subprocess.Popen:
    """Another driver: a process that takes the study's lock and waits."""
    code = (f"import sys, time; from pathlib import Path; from isosweep.run.lock import lock_study; "
            f"lock_study(Path({str(folder)!r}), 'other'); print('held', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_driver_of_one_sweep_is_refused_and_a_killed_one_leaves_no_stale_lock(tmp_path):
    other = _hold_lock(tmp_path)
    try:
        with pytest.raises(ConfigError, match=rf"s1 is already being run by another driver \(pid {other.pid} on "):
            lock_study(tmp_path, "s1")
    finally:
        other.kill()
        other.wait()
    lock_study(tmp_path, "s1")  # the kernel dropped the killed driver's lock
    lock_study(tmp_path, "s1")  # the same driver again: a no-op
    assert f"pid {os.getpid()}" in (tmp_path / LOCK_FILE).read_text()
    release_study(tmp_path)
    again = _hold_lock(tmp_path)  # given back: another driver may take it
    again.kill()
    again.wait()


def test_a_rerun_pointed_at_another_runs_folder_is_refused_before_anything_is_written(mlflow_server, tmp_path):
    uri, _ = mlflow_server
    first = tmp_path / "first" / "moved-sweep-1k-abc"
    runs.open_study_parent(runs.client(uri), "moved-sweep-1k-abc", {"isosweep.out": str(first)}, {})
    with pytest.raises(ConfigError, match=rf"its trials in {first} .* --runs {first.parent} to resume"):
        open_study("moved-sweep-1k-abc", tmp_path / "second", log=lambda line: None)
    assert not (tmp_path / "second").exists()
    out, _ = open_study("moved-sweep-1k-abc", tmp_path / "first", log=lambda line: None)
    assert out == first and (first / LOCK_FILE).exists()
    release_study(out)


def test_a_band_too_small_for_bp_is_refused_before_any_folder_run_or_ray_job(tmp_path, capsys, monkeypatch):
    """A level's probe holds 1,024 train problems, so no band of tiny-1m's 2-digit additions can feed Bp = 2048 (how many
    fall in the hard band depends on the cached base model: 207 and 565 have both been seen): that grid point is a
    configuration error naming the sweep file, decided before the study's folder, its MLflow run or Ray exist
    (inside a trial it would be a failure Tune retries)."""
    from isosweep.cli import main

    monkeypatch.chdir(ROOT)
    bad = tmp_path / "hard-bp256.yaml"
    bad.write_text(f"name: hard-bp256\nstudy: isocompute\ntrial: {ROOT / 'sweeps/trials/easy.yaml'}\nbudget: 8192\n"
                   "grid: {n: [4], Bp: [64, 2048]}\nset: {task.difficulty: hard}\n")
    monkeypatch.setenv("ISOSWEEP_MLFLOW_PORT", "0")  # refused: any MLflow contact would fail loudly, not start one
    assert main(["sweep", str(bad), "--runs", str(tmp_path / "runs"), "--no-dashboards"]) == 2
    err = capsys.readouterr().err
    found = re.search(rf"{re.escape(str(bad))}: task.difficulty='hard' on levels \[2\] leaves (\d+) train and \d+ eval", err)
    assert found and int(found.group(1)) < 2048, err
    assert "at least Bp = 2048 train problems" in err
    assert not (tmp_path / "runs").exists()
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()


@pytest.mark.parametrize(("cluster", "cpu", "gpu"), [("aws-h200.yaml", 8 * 192, 8 * 8), ("gcp-h200.yaml", None, None)])
def test_an_autoscaling_cluster_is_sized_at_its_full_size_not_by_what_is_up(cluster, cpu, gpu, tmp_path):
    """A `ray up` cluster starts with no GPU worker: its size for the sweep's concurrency is every node type at its
    max_workers, read from the autoscaler config the head keeps (here the cluster YAML itself, which ray up copies)."""
    import yaml

    from isosweep.run.core import autoscaler_capacity

    config = yaml.safe_load((ROOT / "clusters" / cluster).read_text())
    capacity = autoscaler_capacity(ROOT / "clusters" / cluster)
    workers = {name: node for name, node in config["available_node_types"].items() if name != config["head_node_type"]}
    expected_gpu = sum(n["resources"].get("GPU", 0) * min(n["max_workers"], config["max_workers"]) for n in workers.values())
    assert capacity["GPU"] == expected_gpu > 0
    if gpu is not None:
        assert (capacity["CPU"], capacity["GPU"]) == (cpu, gpu)
    cfgs = [p.cfg for p in load_sweep(ROOT / "sweeps" / "qwen25-gsm8k-h200.yaml").trials]
    assert max_concurrency(cfgs, capacity, "qwen25") >= 1  # where the nodes that are up (none) would refuse it
    with pytest.raises(ConfigError, match="has 0 CPU and 0 GPU"):
        max_concurrency(cfgs, {"CPU": 0.0, "GPU": 0.0}, "qwen25")
    assert autoscaler_capacity(tmp_path / "none.yaml") == {}  # a local Ray or a fixed cluster: nothing to add
