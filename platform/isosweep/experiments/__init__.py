"""Experiments about isosweep itself: the FP8/AIS study (``ais_study``), the benchmark (``bench``) with
its side-by-side against TRL and a plain loop (``side_by_side``, ``trl_baseline``), the HPO benchmark
(``hpo_bench``) and its two-fidelity Hartmann test function (``hartmann``)."""
