"""A trial's directory on disk, and the one place that knows its layout.

    <trial>/metrics.jsonl            one eval record per line (``step``, ``rollouts``, ``eval/...``)
            steps.jsonl              per-step training statistics
            checkpoints/step-NNNNNN/ the two latest and the best checkpoint: ``save_pretrained`` files,
                                     ``deepspeed/`` (optimizer state) and ``trainer_state.json``
                                     (the eval record the checkpoint was taken at)
            checkpoints/best         the name of the best checkpoint
            STOP                     written by whoever stops the trial early (an HPO study)
            STOPPED                  written by the trial when it has seen STOP and ended
            PAUSE                    written by an adaptive sweep: the rollouts of the rung to pause at
            trial.log                the trial's log lines

Everything that reads or writes these files goes through :class:`TrialDir`: the training loop
(records, checkpoints, resume), the runners (finished or not, stopping a trial), the MLflow
logger (what to catch up) and an HPO study's promotion (a trial continued from another's
checkpoint). Writes that replace a file are atomic (temporary name, then rename), so a crash
never leaves a half-written checkpoint or metrics file behind.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import time
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
STEPS_FILE = "steps.jsonl"
CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
STOP_FILE = "STOP"
"""Written into a trial's directory by whoever decides to stop it early (an HPO study's stopper or
scheduler): the loop ends before its next step, and its Ray Train job with it."""
STOPPED_FILE = "STOPPED"
"""Written by the loop when it has seen ``STOP`` and ended: the step it stopped at."""
PAUSE_FILE = "PAUSE"
"""Written into a trial's directory by an adaptive sweep: a number of rollouts (a budget rung). The loop ends at its
first evaluation at or past it (a checkpoint is taken there), so the sweep can decide at the rung and start it
again later from that checkpoint; removed by the sweep when the trial may run to its budget."""
LOG_FILE = "trial.log"

KILL_AT = "ISOSWEEP_KILL_AT"
"""Fault injection for tests: ``ISOSWEEP_KILL_AT=<point>[:<n>]`` kills the trial process (SIGKILL) the n-th time
(default: the first) it reaches ``<point>``, one of :data:`KILL_POINTS`. Read only by :func:`kill_point`."""
KILL_POINTS = ("checkpoint-written", "checkpoint-committed", "record-appended", "between-log-batches")
"""Where a crash can land between two writes of an evaluation: inside the temporary checkpoint folder, all
written, not yet renamed; after the rename, before the eval record is appended to ``metrics.jsonl``; after
the append, before the record is logged to MLflow; between two ``log_batch`` requests of one record's metrics
(a record of a long interval carries more than 1,000 step metrics)."""
KILL_ONCE = "ISOSWEEP_KILL_ONCE"
"""With :data:`KILL_AT`: a file path; the kill fires only in the process that creates it, so a trial process that
is started again after the kill (a Ray Train worker group restarted in the same run) runs on."""
_reached: dict[str, int] = {}


def kill_point(name: str) -> None:
    """SIGKILL this process if ``$ISOSWEEP_KILL_AT`` names ``name`` (see :data:`KILL_AT`); otherwise nothing."""
    wanted = os.environ.get(KILL_AT)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point not in KILL_POINTS:
        raise ValueError(f"{KILL_AT}={wanted!r}: no such kill point; allowed: {', '.join(KILL_POINTS)} (optionally :n)")
    if point == name:
        _reached[name] = _reached.get(name, 0) + 1
        if _reached[name] == int(nth or 1) and _first_to_fire():
            os.kill(os.getpid(), signal.SIGKILL)


def _first_to_fire() -> bool:
    """Whether no earlier process fired the kill (see :data:`KILL_ONCE`; always true without it)."""
    marker = os.environ.get(KILL_ONCE)
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def atomic_write(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one rename (a reader sees the old or the new file, never half)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a JSONL file, one per non-empty line (empty if the file does not exist).

    A last line that is not JSON and lacks its newline is an append cut short by a crash: it is
    dropped (a resume rewrites the file from the checkpoint and recomputes it). A bad line anywhere
    else is damage this code did not do: a ``ValueError`` names the file and the line."""
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines) and not text.endswith("\n"):
                break
            raise ValueError(f"{path}, line {number}: not a JSON record ({e.msg}); the file is damaged: restore it, "
                             f"or remove the trial folder {path.parent} to run the trial again") from None
    return rows


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` is not whole (cut short, or a header that is not safetensors'), or None.

    The format is an 8-byte little-endian header length, a JSON header giving each tensor's byte range
    (``data_offsets``), then the data: a whole file is exactly as long as its header says."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if size < 8 + length:
                return f"{path}: cut short ({size} bytes, its header alone needs {8 + length})"
            header = json.loads(f.read(length))
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, IndexError) as e:
        return f"{path}: not a safetensors file ({type(e).__name__}: {e})"
    if size != 8 + length + end:
        return f"{path}: {size} bytes where its header declares {8 + length + end} (cut short or padded)"
    return None


class DiskFull(RuntimeError):
    """A trial's write found its disk full: the message names the path and says how to go on."""


FULL_BYTES = 4 << 20
"""Less free space than this on a trial's disk when a write fails means the disk is full."""


def out_of_space(error: BaseException, path: Path) -> bool:
    """Whether ``error``, raised by a write under ``path``, came of a full disk: ENOSPC or EDQUOT (a quota), or --
    torch's checkpoint writers raise a ``RuntimeError`` with no errno -- any write error while less than
    :data:`FULL_BYTES` are free on ``path``'s disk."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return shutil.disk_usage(path).free < FULL_BYTES
    except OSError:
        return False


def disk_full(trial_path: Path, what: str) -> DiskFull:
    """The error of a full disk met while writing ``what`` of the trial in ``trial_path``: the path, and how to go on."""
    return DiskFull(f"no space left on the disk of {trial_path} while writing {what}: the trial's last complete "
                    "checkpoint and its records up to it are intact; free space (or move the runs folder) and run the "
                    "same command again to resume from that checkpoint")


def jsonl_text(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class TrialDir:
    """One trial's directory: its records, per-step statistics, checkpoints and stop signals."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"TrialDir({str(self.path)!r})"

    @property
    def log_file(self) -> Path:
        return self.path / LOG_FILE

    # -- records and per-step statistics ------------------------------------------------------
    def records(self) -> list[dict]:
        """The eval records of ``metrics.jsonl`` (empty if none)."""
        return read_jsonl(self.path / METRICS_FILE)

    def steps(self) -> list[dict]:
        """The per-step statistics of ``steps.jsonl`` (empty if none)."""
        return read_jsonl(self.path / STEPS_FILE)

    def last_step_rollouts(self, tail_bytes: int = 16384) -> int:
        """The ``rollouts`` of the last whole line of ``steps.jsonl`` (0 if none): how far a running trial has
        trained since its last evaluation, read from the end of the file only (a long trial's file is megabytes).
        A line cut short by a crash, or a tail without one whole line, counts as nothing newer."""
        try:
            with open(self.path / STEPS_FILE, "rb") as f:
                start = max(0, f.seek(0, os.SEEK_END) - tail_bytes)
                f.seek(start)
                lines = f.read().split(b"\n")
        except OSError:
            return 0
        for line in reversed(lines[1:] if start else lines):  # a read that starts mid-file starts mid-line
            try:
                return int(json.loads(line)["rollouts"])
            except (ValueError, KeyError, TypeError):
                continue
        return 0

    def append_record(self, record: dict) -> None:
        self._append(METRICS_FILE, record)

    def append_step(self, stats: dict) -> None:
        self._append(STEPS_FILE, stats)

    def _append(self, name: str, row: dict) -> None:
        """One line appended; a full disk is a :class:`DiskFull` (a line it cut short is dropped on resume)."""
        try:
            with open(self.path / name, "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as e:
            if out_of_space(e, self.path):
                raise disk_full(self.path, name) from e
            raise

    def is_finished(self, last_step: int) -> bool:
        """Whether the trial has evaluated at ``last_step`` (its M)."""
        records = self.records()
        return bool(records) and records[-1]["step"] == last_step

    def reset(self) -> None:
        """A fresh start: nothing of an earlier attempt's records or statistics is kept."""
        self.path.mkdir(parents=True, exist_ok=True)
        for name in (METRICS_FILE, STEPS_FILE):
            (self.path / name).unlink(missing_ok=True)

    def truncate_to(self, record: dict, through: int | None = None) -> list[dict]:
        """Make the files agree with a checkpoint taken at ``record`` (or, between evaluations, at step
        ``through`` after it): records after it are dropped (they will be recomputed), the record itself is
        restored if the file lacks it (a crash between the checkpoint and the append), and per-step statistics
        after the checkpoint's step are dropped. Returns the per-step statistics kept after ``record``: what the
        next eval record averages."""
        through = record["step"] if through is None else through
        kept = [r for r in self.records() if r["step"] < record["step"]] + [record]
        steps = [r for r in self.steps() if r["step"] <= through]
        atomic_write(self.path / METRICS_FILE, jsonl_text(kept))
        atomic_write(self.path / STEPS_FILE, jsonl_text(steps))
        return [r for r in steps if r["step"] > record["step"]]

    # -- checkpoints --------------------------------------------------------------------------
    @property
    def checkpoint_root(self) -> Path:
        return self.path / CHECKPOINTS

    def checkpoints(self) -> list[Path]:
        """The complete checkpoints, oldest first (a temporary folder of a crashed save is not one)."""
        root = self.checkpoint_root
        return sorted(p for p in root.glob("step-*") if (p / STATE_FILE).exists()) if root.exists() else []

    def latest_checkpoint(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def checkpoint_at(self, step: int) -> Path:
        """Where the checkpoint of ``step`` lives once complete."""
        return self.checkpoint_root / f"step-{step:06d}"

    def checkpoint_tmp(self, step: int) -> Path:
        """Where the checkpoint of ``step`` is written before it is complete."""
        return self.checkpoint_root / f".tmp-step-{step:06d}"

    @staticmethod
    def write_checkpoint_state(folder: Path, record: dict, is_best: bool, at: dict | None = None) -> None:
        """``record``: the last eval record; ``at``: where training stood (``step``, ``tokens``,
        ``system/wall_s``) for a checkpoint taken between evaluations (None: at ``record``)."""
        state = {"record": record, "best": is_best, **({"at": at} if at else {})}
        (folder / STATE_FILE).write_text(json.dumps(state))

    @staticmethod
    def checkpoint_position(folder: Path) -> dict:
        """Where training stood at the checkpoint in ``folder``: ``step``, ``tokens`` and ``system/wall_s`` (its
        eval record's, for a checkpoint taken at an evaluation)."""
        state = json.loads((folder / STATE_FILE).read_text())
        record = state["record"]
        return state.get("at") or {key: record[key] for key in ("step", "tokens", "system/wall_s")}

    @staticmethod
    def checkpoint_record(folder: Path) -> dict:
        """The eval record a checkpoint was taken at."""
        path = folder / STATE_FILE
        try:
            return json.loads(path.read_text())["record"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a checkpoint state written by isosweep ({type(e).__name__}: {e}); "
                             f"the checkpoint is damaged: remove {folder} to resume from the one before it") from None

    def checkpoint_problem(self, folder: Path) -> str | None:
        """What makes the checkpoint in ``folder`` unusable -- its trainer state unreadable, a weights file
        cut short, no optimizer state -- naming the file; None if its files are whole. Cheap: a weights file is
        checked against the sizes its own header declares, not read; the optimizer state is checked by
        loading it (:func:`isosweep.trial.loop.resume`)."""
        try:
            self.checkpoint_record(folder)
        except ValueError as e:
            return str(e).split("; the checkpoint is damaged")[0]
        weights = sorted(folder.glob("model*.safetensors"))
        if not weights:
            return f"{folder}: no model.safetensors"
        for path in weights:
            problem = safetensors_problem(path)
            if problem:
                return problem
        state = folder / "deepspeed"
        if not state.is_dir() or not any(state.rglob("*.pt")):
            return f"{state}: no optimizer state"
        return None

    def set_aside(self, folder: Path) -> Path:
        """Move a damaged checkpoint out of the way (``damaged-step-NNNNNN``), kept for inspection, so the
        trial resumes from the one before it; returns where it went."""
        target = folder.with_name(f"damaged-{folder.name}")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(folder, target)
        best_file = self.checkpoint_root / "best"
        if best_file.exists() and best_file.read_text().strip() == folder.name:
            best_file.unlink()
        return target

    def commit_checkpoint(self, step: int, is_best: bool) -> Path:
        """Rename the finished temporary checkpoint of ``step`` into place; keep only the two latest and the best
        (the one before the latest is what a resume falls back to if the latest turns out damaged)."""
        tmp, final = self.checkpoint_tmp(step), self.checkpoint_at(step)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        best_file = self.checkpoint_root / "best"
        if is_best:
            atomic_write(best_file, final.name)
        keep = {final.name, best_file.read_text().strip() if best_file.exists() else ""}
        keep |= {p.name for p in self.checkpoints()[-2:]}
        for old in self.checkpoints():
            if old.name not in keep:
                shutil.rmtree(old)
        return final

    def promote_from(self, source: TrialDir) -> int:
        """Start this trial from ``source``'s latest checkpoint; returns the rollouts it holds.

        Copies (hard-links where the filesystem allows) the checkpoint and the records and per-step
        statistics up to it, so that the training loop resumes at that step here and the source
        trial stays as it was. A trial promoted before (a resumed study) keeps what it has."""
        checkpoint = source.latest_checkpoint()
        if checkpoint is None:
            raise FileNotFoundError(f"{source.path}: no checkpoint to promote from")
        mine = self.latest_checkpoint()
        if mine is not None:
            return int(self.checkpoint_record(mine)["rollouts"])
        record = self.checkpoint_record(checkpoint)
        tmp = TrialDir(self.path.with_name(f".{self.path.name}.promote"))
        shutil.rmtree(tmp.path, ignore_errors=True)
        tmp.checkpoint_root.mkdir(parents=True)
        shutil.copytree(checkpoint, tmp.checkpoint_root / checkpoint.name, copy_function=_link_or_copy)
        (tmp.path / METRICS_FILE).write_text(jsonl_text([r for r in source.records() if r["step"] <= record["step"]]))
        (tmp.path / STEPS_FILE).write_text(jsonl_text([r for r in source.steps() if r["step"] <= record["step"]]))
        shutil.rmtree(self.path, ignore_errors=True)
        os.replace(tmp.path, self.path)
        return int(record["rollouts"])

    # -- pausing at a rung (adaptive sweeps) -------------------------------------------------
    def request_pause(self, rollouts: int) -> None:
        """Ask the trial to end at its first evaluation at or past ``rollouts`` (it can be started again)."""
        self.path.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path / PAUSE_FILE, str(int(rollouts)))

    def pause_at(self) -> int | None:
        """The rollouts the trial is asked to pause at, or None."""
        path = self.path / PAUSE_FILE
        return int(path.read_text().strip()) if path.exists() else None

    def clear_pause(self) -> None:
        (self.path / PAUSE_FILE).unlink(missing_ok=True)

    # -- stopping early -----------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Ask the trial to end before its next step (it acknowledges with ``STOPPED``)."""
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / STOP_FILE).write_text(reason)

    def stop_requested(self) -> bool:
        return (self.path / STOP_FILE).exists()

    def stop_reason(self) -> str:
        return (self.path / STOP_FILE).read_text().strip()

    def acknowledge_stop(self, step: int) -> None:
        atomic_write(self.path / STOPPED_FILE, str(step))

    def stop_acknowledged(self) -> bool:
        return (self.path / STOPPED_FILE).exists()

    def wait_for_stop(self, timeout_s: float = 30.0, idle_s: float = 3.0) -> None:
        """Wait until the trial has acknowledged its stop, has trained nothing for ``idle_s`` (Tune's
        stop took its Ray Train job down with it) or ``timeout_s`` passed, so that the cost charged
        includes every step it trained."""
        deadline = time.monotonic() + timeout_s
        steps = self.path / STEPS_FILE
        while time.monotonic() < deadline:
            if not self.log_file.exists() or self.stop_acknowledged():
                return
            if not steps.exists() or time.time() - steps.stat().st_mtime > idle_s:
                return
            time.sleep(0.2)
