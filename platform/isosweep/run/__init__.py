"""Running studies on Ray Tune: the shared runner core (``core``), grid sweeps (``grid``), HPO studies
(``hpo``), the dry-run plan (``plan``) and cluster submission (``submit``)."""
