"""A trial's directory: records and steps, checkpoints kept and committed, truncation, promotion, stop signals."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from isosweep.spec.hpo import load_hpo
from isosweep.trial.files import CHECKPOINTS, METRICS_FILE, STEPS_FILE, TrialDir, safetensors_problem
from isosweep.trial.loop import train_loop

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "sweeps" / "hpo-smoke.yaml"


def record(step: int, value: float) -> dict:
    return {"step": step, "rollouts": step * 64, "tokens": step * 300, "eval/mean@4": value, "system/wall_s": step}


def checkpoint(trial: TrialDir, rec: dict, is_best: bool) -> Path:
    """A checkpoint as the loop writes one (the model files are irrelevant here), committed."""
    tmp = trial.checkpoint_tmp(rec["step"])
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"w%d" % rec["step"])
    trial.write_checkpoint_state(tmp, rec, is_best)
    return trial.commit_checkpoint(rec["step"], is_best)


def test_records_and_steps_append_and_read_back(tmp_path):
    trial = TrialDir(tmp_path)
    assert trial.records() == [] and trial.steps() == [] and not trial.is_finished(4)
    for step in range(3):
        trial.append_record(record(step * 2, 0.5 + step / 10))
        trial.append_step({"step": step + 1, "rollouts": (step + 1) * 64})
    assert [r["step"] for r in trial.records()] == [0, 2, 4] and len(trial.steps()) == 3
    assert trial.is_finished(4) and not trial.is_finished(5)
    trial.reset()
    assert trial.records() == [] and trial.steps() == []


def test_only_the_two_latest_and_the_best_checkpoint_are_kept(tmp_path):
    trial = TrialDir(tmp_path)
    checkpoint(trial, record(0, 0.5), is_best=True)
    checkpoint(trial, record(4, 0.6), is_best=True)
    checkpoint(trial, record(8, 0.55), is_best=False)
    checkpoint(trial, record(12, 0.58), is_best=False)
    assert [p.name for p in trial.checkpoints()] == ["step-000004", "step-000008", "step-000012"]
    checkpoint(trial, record(16, 0.57), is_best=False)
    assert [p.name for p in trial.checkpoints()] == ["step-000004", "step-000012", "step-000016"]
    assert (tmp_path / CHECKPOINTS / "best").read_text() == "step-000004"
    assert trial.latest_checkpoint().name == "step-000016"
    assert trial.checkpoint_record(trial.latest_checkpoint()) == record(16, 0.57)
    trial.checkpoint_tmp(20).mkdir()  # a save that crashed half-way is not a checkpoint
    assert trial.latest_checkpoint().name == "step-000016"


def test_truncation_makes_the_files_agree_with_a_checkpoint(tmp_path):
    trial = TrialDir(tmp_path)
    for step in (0, 4, 8):
        trial.append_record(record(step, 0.5))
    for step in range(1, 11):
        trial.append_step({"step": step, "rollouts": step * 64})
    trial.truncate_to(record(4, 0.5))
    assert [r["step"] for r in trial.records()] == [0, 4] and [r["step"] for r in trial.steps()] == [1, 2, 3, 4]
    # a record the checkpoint holds but the file lost (a crash between the two writes) comes back
    (tmp_path / METRICS_FILE).write_text("")
    trial.truncate_to(record(4, 0.5))
    assert trial.records() == [record(4, 0.5)]
    assert not list(tmp_path.glob(".*.tmp"))  # written by rename, nothing left behind


@pytest.mark.parametrize("name", [METRICS_FILE, STEPS_FILE])
def test_a_torn_last_line_is_dropped_and_truncation_heals_the_file(tmp_path, name):
    trial = TrialDir(tmp_path)
    for step in (0, 4, 8):
        trial.append_record(record(step, 0.5))
        trial.append_step({"step": step, "rollouts": step * 64})
    whole = (tmp_path / name).read_text()
    (tmp_path / name).write_text(whole + whole.splitlines()[-1][:17])  # an append cut short by a crash
    read = trial.records() if name == METRICS_FILE else trial.steps()
    assert [r["step"] for r in read] == [0, 4, 8]
    trial.truncate_to(record(4, 0.5))  # what a resume does
    trial.append_record(record(8, 0.6))
    trial.append_step({"step": 8, "rollouts": 512})
    assert [r["step"] for r in trial.records()] == [0, 4, 8] and [r["step"] for r in trial.steps()] == [0, 4, 8]
    assert (tmp_path / name).read_text().endswith("}\n")


@pytest.mark.parametrize("tail_bytes", [200, 1000, 16384])  # lines of 40-90 bytes
def test_the_last_steps_rollouts_read_from_the_tail_agree_with_reading_the_whole_file(tmp_path, tail_bytes):
    trial = TrialDir(tmp_path)
    assert trial.last_step_rollouts(tail_bytes) == 0  # no file yet
    for step in range(1, 301):  # lines of uneven length, so that the tail starts at every kind of place
        trial.append_step({"step": step, "rollouts": step * 96, "pad": "x" * (step % 37)})
        if step % 23 == 0 or step < 5:
            assert trial.last_step_rollouts(tail_bytes) == trial.steps()[-1]["rollouts"], step
    whole = (tmp_path / STEPS_FILE).read_text()
    (tmp_path / STEPS_FILE).write_text(whole + '{"step": 301, "roll')  # an append cut short: the line before counts
    assert trial.last_step_rollouts(tail_bytes) == trial.steps()[-1]["rollouts"] == 300 * 96
    assert trial.last_step_rollouts(16) == 0  # a tail shorter than a line holds no whole line: nothing newer


def test_a_damaged_line_in_the_middle_names_the_file_and_the_line(tmp_path):
    trial = TrialDir(tmp_path)
    for step in (0, 4, 8):
        trial.append_record(record(step, 0.5))
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    lines[1] = lines[1][:10]
    (tmp_path / METRICS_FILE).write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"{METRICS_FILE}, line 2: not a JSON record"):
        trial.records()


def test_stop_is_requested_acknowledged_and_waited_for(tmp_path):
    trial = TrialDir(tmp_path)
    assert not trial.stop_requested() and not trial.stop_acknowledged()
    trial.request_stop("kl_growth at report 3")
    assert trial.stop_requested() and trial.stop_reason() == "kl_growth at report 3"
    trial.log_file.write_text("[trial] step 1\n")
    (tmp_path / STEPS_FILE).write_text("{}\n")  # still training: the wait would last until the timeout...
    trial.acknowledge_stop(5)
    started = time.monotonic()
    trial.wait_for_stop(timeout_s=20.0, idle_s=15.0)  # ...but the trial said it stopped
    assert time.monotonic() - started < 10.0


def test_promotion_copies_only_up_to_the_latest_checkpoint(base_model, tmp_path):
    source = TrialDir(tmp_path / "source")
    cfg = load_hpo(SMOKE).trial_config({"algorithm.lr_ref": 2e-5, "algorithm.clip_high": 0.3,
                                        "algorithm.kl_coef": 1e-3}, "tiny-1m", 256)
    train_loop(cfg, source.path, log=lambda line: None)
    source.append_step({"step": 5, "rollouts": 320, "train/reward": 0.1})  # trained past the checkpoint, then killed
    dest = TrialDir(tmp_path / "dest")
    assert dest.promote_from(source) == 256
    assert [r["step"] for r in dest.steps()] == [1, 2, 3, 4]
    assert dest.records() == source.records()
    assert dest.promote_from(source) == 256  # idempotent: a resumed study promotes again safely
    with pytest.raises(FileNotFoundError):
        TrialDir(tmp_path / "other").promote_from(TrialDir(tmp_path / "nothing"))


def whole_checkpoint(trial: TrialDir, rec: dict) -> Path:
    """A checkpoint with a real safetensors file and an optimizer-state file, committed."""
    import torch
    from safetensors.torch import save_file

    tmp = trial.checkpoint_tmp(rec["step"])
    (tmp / "deepspeed" / "state").mkdir(parents=True)
    save_file({"w": torch.arange(6.0), "b": torch.zeros(3, dtype=torch.bfloat16)}, tmp / "model.safetensors")
    torch.save({"m": torch.ones(2)}, tmp / "deepspeed" / "state" / "optim_states.pt")
    trial.write_checkpoint_state(tmp, rec, is_best=False)
    return trial.commit_checkpoint(rec["step"], is_best=False)


def test_a_whole_checkpoint_has_no_problem_and_each_damage_is_named(tmp_path):
    trial = TrialDir(tmp_path)
    folder = whole_checkpoint(trial, record(4, 0.5))
    assert trial.checkpoint_problem(folder) is None and safetensors_problem(folder / "model.safetensors") is None
    weights = (folder / "model.safetensors").read_bytes()

    (folder / "model.safetensors").write_bytes(weights[:-5])  # cut short in the data
    assert "model.safetensors" in trial.checkpoint_problem(folder) and "cut short" in trial.checkpoint_problem(folder)
    (folder / "model.safetensors").write_bytes(weights[:20])  # cut short in the header
    assert "its header alone needs" in safetensors_problem(folder / "model.safetensors")
    (folder / "model.safetensors").write_bytes(b"\x05" + b"\x00" * 7 + b"nope!")
    assert "not a safetensors file" in safetensors_problem(folder / "model.safetensors")
    (folder / "model.safetensors").write_bytes(weights)
    assert trial.checkpoint_problem(folder) is None

    (folder / "trainer_state.json").write_text('{"record": ')
    assert "trainer_state.json is not a checkpoint state" in trial.checkpoint_problem(folder)
    trial.write_checkpoint_state(folder, record(4, 0.5), is_best=False)
    (folder / "deepspeed" / "state" / "optim_states.pt").unlink()
    assert trial.checkpoint_problem(folder).endswith("deepspeed: no optimizer state")


def test_a_damaged_checkpoint_is_set_aside_with_its_best_mark(tmp_path):
    trial = TrialDir(tmp_path)
    checkpoint(trial, record(4, 0.5), is_best=True)
    latest = checkpoint(trial, record(8, 0.6), is_best=True)
    moved = trial.set_aside(latest)
    assert moved.name == "damaged-step-000008" and (moved / "model.safetensors").exists()  # kept, for inspection
    assert [p.name for p in trial.checkpoints()] == ["step-000004"] and not (tmp_path / CHECKPOINTS / "best").exists()
    checkpoint(trial, record(8, 0.6), is_best=True)  # the step is redone and saved again
    assert [p.name for p in trial.checkpoints()] == ["step-000004", "step-000008"]
