"""The null tracker: what a trial logs to when no MLflow run is attached (``isosweep trial``, tests).

It takes the same calls as :class:`isosweep.track.runs.MlflowTracker` and its logger, and does
nothing with them, so the trial code has no ``if tracking:`` branches.
"""

from __future__ import annotations


class NullTrialLogger:
    """A trial logger that logs nothing."""

    def log(self, record: dict, checkpoint: bool = True) -> None:
        pass

    def catch_up(self) -> int:
        return 0

    def finish(self, status: str, reason: str | None = None) -> None:
        pass


class NullTracker:
    """A tracker without a tracking server: every trial logger it opens is a :class:`NullTrialLogger`."""

    def trial_logger(self, trial, k: int, between_requests=None) -> NullTrialLogger:
        return NullTrialLogger()
