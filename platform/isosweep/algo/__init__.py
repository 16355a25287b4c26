"""The RL math, pure functions of tensors and arrays: GRPO (``grpo``), the rollout/trainer mismatch
corrections TIS and AIS (``correction``), the eval estimators mean@k / best@k / worst@k (``estimators``)."""
