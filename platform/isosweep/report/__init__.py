"""Reports: from the trials' eval curves to analyses, claims and plans.

In: each trial's eval curve (:class:`isosweep.track.curves.Curve`, from MLflow or a study folder's
``curves.json``). Out: a sweep's frontier analysis (``fits.json`` and its tables and plots), the study
report's verdicts on the papers' claims (``REPORT.md``), and what to run at a budget (``isosweep recommend``).

- :mod:`~isosweep.report.frontier`: the sigmoid fit of one config's points.
- :mod:`~isosweep.report.fitting`: the one fit-then-bootstrap pipeline (curves -> each config's fits, observed
  and on every replicate), shared by the analysis and the planner.
- :mod:`~isosweep.report.analysis`: a sweep's frontier, allocation verdict, hold-outs and n trend.
- :mod:`~isosweep.report.schema`: the saved analysis as typed data, its versions and their conversion.
- :mod:`~isosweep.report.render`: an analysis as text, CSV, plots and an HTML page.
- :mod:`~isosweep.report.planner`: sweeps pooled by allocation, the recommendation at a budget, the next sweep.
- :mod:`~isosweep.report.studies`: the claims tested on the study folders, ``REPORT.md`` and its HTML page.
- :mod:`~isosweep.report.hpo`: an HPO study's summary; :mod:`~isosweep.report.tables` and
  :mod:`~isosweep.report.plots`: fixed-width tables and matplotlib figures for all of them.
"""
