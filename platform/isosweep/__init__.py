"""isosweep: iso-compute sweeps and joint-fidelity HPO of GRPO training.

The package is layered; a module imports only from its own layer and the layers above it in
this list (``tests/test_layers.py`` reads the imports and fails on one that points up):

- ``tasks``        verifiable problem families and their pure rewards
- ``algo``         the RL math, pure: GRPO, TIS/AIS corrections, eval estimators
- ``hpo``          search space, stopping rules, searchers, the study ledger
- ``rollout``      rollout engines behind one interface (HF in-process, vLLM actors), FP8, weight sync
- ``models``       the tiny Qwen2 family, its tokenizer, problem sets, base-model warm-up
- ``spec``         YAML toolkit, trial config, hardware profiles, grid and HPO study files
- ``track``        MLflow: local server, runs, trial logger, null tracker
- ``trial``        one trial: its directory, the DeepSpeed learner, the GRPO loop, the Ray Train job
- ``report``       frontier fits, a sweep's analysis and plots, HPO summaries
- ``run``          Ray Tune: one runner core for grid sweeps and HPO studies, plan, submit
- ``experiments``  the AIS study, the benchmarks
- ``cli``          the ``isosweep`` command

Records flow spec -> trial -> track -> report; a trial is handed its tracker (so ``track`` sits
below ``trial``), and ``run`` wires the layers together for a study.
"""

__version__ = "0.1.0"
