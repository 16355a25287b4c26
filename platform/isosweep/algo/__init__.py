"""The RL math, pure functions of tensors and arrays: GRPO (``grpo``), the rollout/trainer mismatch
corrections TIS and AIS (``correction``), the eval estimators mean@k / best@k / worst@k (``estimators``)."""

MIN_GROUP = 2
"""The smallest n GRPO can use: a group-relative advantage needs two samples of a problem (with one, every
advantage is 0). A study whose best n is 2 has found the floor, not a grid edge to extend."""
