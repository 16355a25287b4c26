"""Experiments about isosweep itself: the FP8/AIS study (``ais_study``), the engine benchmark (``bench``),
the HPO benchmark (``hpo_bench``) and its two-fidelity Hartmann test function (``hartmann``)."""
