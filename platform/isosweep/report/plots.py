"""matplotlib for reports: pyplot on the file-only Agg backend, figures to PNG bytes."""

from __future__ import annotations

import io


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed); imported on first use,
    so that importing a report module does not choose a backend for the whole process."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig) -> bytes:
    """The figure as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return buffer.getvalue()
