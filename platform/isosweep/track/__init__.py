"""Tracking: the local MLflow server (``server``), a sweep's runs and a trial's logger (``runs``, the
only importer of mlflow), the null tracker (``null``) and the learning-curve record read back from
the runs (``curves``)."""
