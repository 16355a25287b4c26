"""Fixtures shared by the trial-level tests."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EASY = ROOT / "sweeps" / "trials" / "easy.yaml"


@pytest.fixture(scope="session")
def base_model() -> Path:
    """The tiny-1m arithmetic base model (built and cached on first use)."""
    from isosweep.models import ensure_base_model

    return ensure_base_model("tiny-1m", "arithmetic", 0)
