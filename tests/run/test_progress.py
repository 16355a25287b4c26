"""A study's progress: on a terminal a live display (rich) of each running trial and the study's bar, elsewhere the
plain lines that scripts and tests read. Driven by hand with Tune's callbacks and a stand-in for Tune's trials; no
sweep runs."""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from isosweep.cli import build_parser
from isosweep.hpo.ledger import StudyLedger, TrialEntry
from isosweep.run.core import RAY_LOG, Progress, live_wanted, say, trial_of
from isosweep.run.grid import GridProgress
from isosweep.run.hpo import StudyProgress
from isosweep.spec.grid import load_sweep
from isosweep.spec.hpo import load_hpo

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "sweeps" / "smoke.yaml"
HPO_SMOKE = ROOT / "sweeps" / "hpo-smoke.yaml"


def tune_trial(key: str, status: str = "RUNNING") -> SimpleNamespace:
    """What the callback reads of a Tune trial: its status, its job's key, its Tune folder."""
    return SimpleNamespace(status=status, config={"trial": {"key": key}}, local_path=f"/tune/{key}")


def terminal() -> Console:
    return Console(file=io.StringIO(), record=True, force_terminal=True, width=100)


def redrawn(progress: Progress, console: Console) -> str:
    """The display as it stands, drawn once (what was recorded before is dropped)."""
    console.export_text(clear=True)
    progress.view.live.refresh()
    return console.export_text(clear=True)


def last_line(text: str, start: str) -> str:
    """The newest line of the display that starts with ``start`` (a frame is drawn again below each printed line)."""
    return [line for line in text.splitlines() if line.strip().startswith(start)][-1].strip()


def test_a_terminal_shows_each_running_trial_and_the_sweeps_bar_with_the_log_lines_above(tmp_path, capsys):
    sweep = load_sweep(SMOKE, 2000)
    first, second = sweep.trials
    state = GridProgress(sweep, tmp_path)
    total = sum(state.total.values())
    console = terminal()
    progress = Progress(state, tmp_path, say, every_s=30, prefix="sweep", live=True)
    progress.redraw_s = 0  # redraw at every step of Tune's loop
    trials = [tune_trial(first.key), tune_trial(second.key)]
    ray_handlers, engine = list(logging.getLogger("ray").handlers), os.environ.get("RAY_AIR_NEW_OUTPUT")
    with progress.shown(console):
        assert f"[sweep] Ray's and Tune's own messages go to {tmp_path / RAY_LOG}" in capsys.readouterr().out
        frame = console.export_text(clear=True)
        assert last_line(frame, "sweep").endswith(f"0/{total:,} rollouts 0.0/s, estimating time left")
        assert last_line(frame, "0/2") == "0/2 trials done, 0 running, 0 failed | no eval yet | elapsed 0m00s"

        # an evaluation: the trial's rollouts and its mean@4
        batch = first.cfg.Bp * first.cfg.n
        progress.on_trial_result(0, trials, trials[0], {"rollouts": 2 * batch, sweep.metric: 0.41})
        frame = console.export_text(clear=True)
        row = last_line(frame, first.key)
        assert f" {2 * batch:,}/{state.total[first.key]:,} rollouts " in row and row.endswith(" mean@4 0.410")
        assert last_line(frame, second.key).endswith(f" 0/{state.total[second.key]:,} rollouts no eval yet")
        assert f" {2 * batch:,}/{total:,} rollouts " in last_line(frame, "sweep")
        assert last_line(frame, "0/2").startswith(f"0/2 trials done, 2 running, 0 failed | best eval/mean@4 0.410 "
                                                  f"({first.key}) | elapsed ")

        # between evaluations a step of Tune's loop reads the trials' steps.jsonl
        running = trial_of(tmp_path, second.key)
        running.path.mkdir(parents=True)
        steps = 3 * second.cfg.Bp * second.cfg.n
        running.append_step({"step": 3, "rollouts": steps})
        progress.on_step_end(1, trials)
        frame = console.export_text(clear=True)
        assert last_line(frame, second.key).endswith(f" {steps:,}/{state.total[second.key]:,} rollouts no eval yet")
        assert f" {2 * batch + steps:,}/{total:,} rollouts " in last_line(frame, "sweep")

        # a finished trial: its line printed above, its row gone, its whole budget counted; no plain status line
        trials[0].status = "TERMINATED"
        progress.on_trial_complete(2, trials, trials[0])
        frame = console.export_text(clear=True)
        assert f"[sweep] trial {first.key} finished" in frame.splitlines()
        assert not any(line.startswith("[sweep] 1/2 trials done") for line in frame.splitlines())
        frame = redrawn(progress, console)
        assert not any(line.strip().startswith(first.key) for line in frame.splitlines())
        assert f" {state.total[first.key] + steps:,}/{total:,} rollouts " in last_line(frame, "sweep")
        assert last_line(frame, "1/2").startswith("1/2 trials done, 1 running, 0 failed |")

        # a failed one: the same line as ever, above the display
        trials[1].status = "ERROR"
        progress.on_trial_error(3, trials, trials[1])
        frame = console.export_text(clear=True)
        failed = (f"[sweep] trial {second.key} FAILED (its checkpoints and MLflow run are kept; re-run to retry): see "
                  f"{trial_of(tmp_path, second.key).log_file} and /tune/{second.key}")
        assert failed in " ".join(frame.split())  # wrapped at the console's width, as a terminal would
        frame = redrawn(progress, console)
        assert last_line(frame, "1/2").startswith("1/2 trials done, 0 running, 1 failed |")
        assert [line.split()[0] for line in frame.splitlines() if line.strip()] == ["sweep", "1/2"]  # no trial row

        # Ray's own messages go to the study's ray.log, and Tune's reporter is the one silent at verbose=0
        logging.getLogger("ray.tune").warning("a notice from Tune")
        assert os.environ["RAY_AIR_NEW_OUTPUT"] == "0"
    assert "a notice from Tune" in (tmp_path / RAY_LOG).read_text()
    assert "a notice from Tune" not in console.export_text() + capsys.readouterr().err
    assert logging.getLogger("ray").handlers == ray_handlers and os.environ.get("RAY_AIR_NEW_OUTPUT") == engine


def test_elsewhere_the_lines_are_the_plain_ones_as_before(tmp_path):
    sweep = load_sweep(SMOKE, 2000)
    first, second = sweep.trials
    state = GridProgress(sweep, tmp_path)
    total, budget = sum(state.total.values()), state.total[first.key]
    lines = []
    progress = Progress(state, tmp_path, lines.append, every_s=30, prefix="sweep", live=live_wanted(io.StringIO()))
    trials = [tune_trial(first.key), tune_trial(second.key)]
    with progress.shown():
        progress.on_step_end(0, trials)  # the first status line at once, the next one 30 s later
        progress.on_trial_result(0, trials, trials[0], {"rollouts": 64, sweep.metric: 0.41})
        progress.on_step_end(1, trials)
        trials[0].status = "TERMINATED"
        progress.on_trial_complete(2, trials, trials[0])
        trials[1].status = "ERROR"
        progress.on_trial_error(3, trials, trials[1])
    assert lines == [
        f"[sweep] 0/2 trials done, 2 running, 0 failed | 0/{total:,} rollouts | no eval yet | elapsed 0m00s, "
        "estimating time left",
        f"[sweep] trial {first.key} finished",
        f"[sweep] 1/2 trials done, 1 running, 0 failed | {budget:,}/{total:,} rollouts | best {sweep.metric} 0.410 "
        f"({first.key}) | elapsed 0m00s, ~0m00s left",
        f"[sweep] trial {second.key} FAILED (its checkpoints and MLflow run are kept; re-run to retry): see "
        f"{trial_of(tmp_path, second.key).log_file} and /tune/{second.key}",
    ]
    assert not (tmp_path / RAY_LOG).exists()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("env, live", [({}, True), ({"ISOSWEEP_PLAIN": "1"}, False), ({"ISOSWEEP_PLAIN": "0"}, True),
                                       ({"TERM": "dumb"}, False)])
def test_the_live_display_is_for_terminals_unless_plain_lines_are_asked_for(monkeypatch, env, live):
    monkeypatch.delenv("ISOSWEEP_PLAIN", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert live_wanted(Terminal()) is live
    assert live_wanted(io.StringIO()) is False  # a pipe, a file, CI
    assert build_parser().parse_args(["sweep", "sweeps/smoke.yaml", "--plain"]).plain is True
    assert build_parser().parse_args(["sweep", "sweeps/smoke.yaml"]).plain is False


def test_an_hpo_study_shows_its_trials_and_its_spent_budget(tmp_path):
    study = load_hpo(HPO_SMOKE)
    search = SimpleNamespace(study=study, ledger=StudyLedger(study), sweep_out=tmp_path)  # what StudyProgress reads
    key = f"t000-{study.target}-{study.budget}"
    search.ledger.add(TrialEntry(key=key, size=study.target, budget=study.budget, params={}))
    state = StudyProgress(search)
    assert state.status(running=1, failed=0, elapsed_s=10) == (
        f"[hpo] 0 trials finished, 1 running | spent 0 + {search.ledger.committed:,.0f} committed of "
        f"{study.study_budget:,.0f} | incumbent at {study.target}: none yet | elapsed 0m10s")

    console = terminal()
    progress = Progress(state, tmp_path, say, every_s=30, prefix="hpo", live=True)
    trial = trial_of(tmp_path, key)
    trial.path.mkdir(parents=True)
    trial.append_step({"step": 3, "rollouts": 192})
    with progress.shown(console):
        progress.on_trial_result(0, [tune_trial(key)], tune_trial(key), {"rollouts": 128, study.metric: 0.3})
        frame = console.export_text(clear=True)
    label = study.metric.split("/")[-1]
    assert last_line(frame, key).endswith(f" 192/{study.budget:,} rollouts {label} 0.300")
    assert last_line(frame, "hpo").endswith(f" 0/{study.study_budget:,.0f} target-eq. rollouts")
    assert last_line(frame, "0 trials").startswith(f"0 trials finished, 1 running | incumbent at {study.target}: none "
                                                   "yet | elapsed ")
