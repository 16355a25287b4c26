"""This machine's loopback interface: where a local Ray, a trial's process group and the test servers listen.

Kept apart (no Ray, no torch) so the modules that start a local Ray (:mod:`isosweep.trial.job`) and a trial's
process group on it (:mod:`isosweep.trial.loopback`, :mod:`isosweep.trial.learner`) share it without importing
each other.
"""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"
"""The loopback address every local server here binds to (never every interface)."""


def free_port() -> int:
    """A TCP port on the loopback interface that nothing listens on now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]
