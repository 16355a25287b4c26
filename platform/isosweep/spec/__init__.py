"""Specs: what a user writes, loaded and validated before anything runs.

- ``yamlio``    the YAML toolkit: ``ConfigError``, ``Section``, read / merge / ``--set`` overrides, validate
- ``profiles``  hardware profiles (``clusters/profiles.yaml``): Ray resources, DeepSpeed and vLLM settings
- ``trial``     the trial config and the values derived from it (M, learning rate, regularisation)
- ``grid``      grid sweep files (iso-compute, fixed batch) -> one trial config per grid point
- ``hpo``       HPO study files -> search space, fidelities, study budget
- ``study``     one loader for both kinds, by the file's ``study:`` key
"""
