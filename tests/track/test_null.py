"""The null tracker takes a trial logger's calls and keeps nothing, so trials run without MLflow."""

from __future__ import annotations

from isosweep.track.null import NullTracker, NullTrialLogger
from isosweep.trial.files import TrialDir


def test_the_null_tracker_takes_every_call(tmp_path):
    logger = NullTracker().trial_logger(TrialDir(tmp_path), k=4)
    assert isinstance(logger, NullTrialLogger)
    logger.log({"step": 0, "rollouts": 0, "eval/mean@4": 0.5})
    assert logger.catch_up() == 0
    logger.finish("FINISHED", reason=None)
    assert list(tmp_path.iterdir()) == []  # nothing written anywhere
