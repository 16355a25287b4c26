"""Fixed-width text tables, the one way reports print rows (the frontier, the fits, an HPO study's trials)."""

from __future__ import annotations

import math


def fmt(value: float | None, spec: str = ".3f") -> str:
    """A number in format ``spec``; ``-`` for a missing one (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def text_table(header: list[str], rows: list[list[str]], align: str) -> list[str]:
    """The header and rows as lines of columns as wide as their widest cell; ``align`` has one
    character per column, ``<`` (left) or ``>`` (right)."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows)]

    def line(cells: list[str]) -> str:
        return " ".join(f"{cell:{a}{w}}" for cell, a, w in zip(cells, align, widths)).rstrip()

    return [line(header)] + [line(row) for row in rows]
