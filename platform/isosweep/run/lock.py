"""A study's driver lock: one driver per sweep folder at a time.

The lock is an ``flock`` on ``<sweep folder>/driver.lock`` that holds the driver's pid, host and start
time. The kernel drops it when the driver exits, however it exits, so a killed driver leaves no stale
lock. (``flock`` is per host: drivers of one sweep on two machines sharing an NFS folder are not
serialised by it.) No Ray or torch here: cheap to import.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from isosweep.spec.yamlio import ConfigError

LOCK_FILE = "driver.lock"
"""In a study's folder: held (``flock``) by the driver running it, with that driver's pid, host and start time."""

_held: dict[Path, int] = {}


def lock_study(sweep_out: Path, sweep_id: str) -> None:
    """Take the study's driver lock, or raise :class:`ConfigError` naming the driver that holds it. The lock
    is an ``flock`` on ``LOCK_FILE``: the kernel drops it when its driver exits, however it exits (a
    killed driver leaves no stale lock). Taking it again in the same process is a no-op."""
    path = sweep_out / LOCK_FILE
    if path in _held:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "an unknown process"
        os.close(fd)
        raise ConfigError(f"{sweep_id} is already being run by another driver ({holder}; lock {path}): let it "
                          "finish or stop it (Ctrl-C) before running the same sweep again") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
              .encode(), 0)
    _held[path] = fd


def release_study(sweep_out: Path) -> None:
    """Give the study's driver lock back (the end of a run; exiting does it too)."""
    fd = _held.pop(sweep_out / LOCK_FILE, None)
    if fd is not None:
        os.close(fd)
