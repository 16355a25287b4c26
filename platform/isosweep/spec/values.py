"""Values every study file uses: its name (``slug``), its budget (``parse_budget``) and the compact
count in its id (``short_count``)."""

from __future__ import annotations

import math
import re

from isosweep.spec.yamlio import ConfigError


def slug(name: str) -> str:
    """A study name: lower case letters, digits and dashes (it starts every sweep id)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        raise ValueError("must be lower case letters, digits and dashes")
    return name


def short_count(value: int) -> str:
    """A compact, exact spelling of a count: 100000 -> '100k', 2000000 -> '2M', 1500 -> '1500'.

    >>> [short_count(v) for v in (100000, 2000, 1500, 2000000, 7)]
    ['100k', '2k', '1500', '2M', '7']
    """
    for suffix, unit in (("M", 1_000_000), ("k", 1000)):
        if value % unit == 0:
            return f"{value // unit}{suffix}"
    return str(value)


def parse_budget(text: str | int | float) -> int:
    """``BUDGET=1e5`` -> 100000; a budget must be a whole, positive number of rollouts."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ConfigError(f"budget {text!r} is not a number; allowed: a positive count of rollouts, e.g. 1e5") from None
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise ConfigError(f"budget {text!r} must be a positive whole number of rollouts (e.g. 1e5 = 100000)")
    return int(value)
