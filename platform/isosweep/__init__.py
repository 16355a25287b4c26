"""isosweep: iso-compute sweeps and joint-fidelity HPO of GRPO training.

The package is organised one concern per module:

- ``tasks``       verifiable problem families and their pure rewards
- ``models``      the tiny Qwen2 model family, its tokenizer and base-model warm-up
- ``grpo``        GRPO advantages and losses (pure tensor math)
- ``correction``  TIS / AIS corrections for rollout-trainer mismatch (pure tensor math)
- ``estimators``  mean@k / best@k / worst@k from n >= k samples
- ``config``      typed, validated trial configuration loaded from YAML
- ``rollout``     rollout engines behind one interface
- ``trial``       the GRPO training loop of one trial
- ``cli``         the ``isosweep`` command
"""

__version__ = "0.1.0"
