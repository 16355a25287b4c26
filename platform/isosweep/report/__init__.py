"""Reports: frontier fits (``frontier``), a sweep's analysis (``analysis``), HPO summaries (``hpo``), plots."""
