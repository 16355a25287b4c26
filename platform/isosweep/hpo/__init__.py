"""Joint-fidelity Bayesian HPO (JF-HPO) of GRPO training.

Tuning the GRPO hyperparameters of a target model by running it is expensive; most of the
signal about a good learning rate or clip range is already visible on smaller members of the
same model family and on shorter budgets. This package spends most trials there:

- ``space``     the search space: continuous hyperparameters, the size ladder (data fidelity)
                and the budget range (iteration fidelity), and the config <-> unit-cube mapping
- ``searcher``  ``JFHPOSearcher`` (multi-fidelity GP + cost-aware EI, a Ray Tune searcher),
                the ``RandomSearcher`` baseline and the ``asha_scheduler`` baseline factory
- ``stopping``  early stopping from training dynamics (KL growth, reward drop, zero reward)
- ``bench_fn``  the two-fidelity Augmented Hartmann benchmark and the JF-HPO vs random comparison

Nothing here reads YAML, starts Ray or talks to MLflow: the sweep runner wires it in.
"""
