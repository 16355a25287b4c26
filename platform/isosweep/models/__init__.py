"""The tiny Qwen2 model family and the base models built from it.

``ensure_base_model(size, task, seed)`` returns a directory that loads with
``AutoModelForCausalLM.from_pretrained(path)`` and ``AutoTokenizer.from_pretrained(path)``,
building and caching it on first use. ``resolve_model`` maps a trial's ``model.name`` to what
``from_pretrained`` takes: a tiny size becomes its cached base model; anything else (a local
path or a hub name such as ``Qwen/Qwen2.5-0.5B``) is passed through unchanged.
"""

from __future__ import annotations

from isosweep.models.family import SIZES, TinySize, qwen2_config
from isosweep.models.tokenizer import char_tokenizer
from isosweep.models.warmup import (
    PROBE_FILE,
    RECIPES,
    REPORT_FILE,
    WARMUP_VERSION,
    base_model_dir,
    cache_root,
    ensure_base_model,
)

__all__ = [
    "PROBE_FILE",
    "RECIPES",
    "REPORT_FILE",
    "SIZES",
    "TinySize",
    "WARMUP_VERSION",
    "base_model_dir",
    "cache_root",
    "char_tokenizer",
    "ensure_base_model",
    "qwen2_config",
    "resolve_model",
]


def resolve_model(name: str, task: str, seed: int = 0) -> str:
    """What ``from_pretrained`` should load for ``model.name``: a tiny size's base model, or ``name`` itself."""
    if name in SIZES:
        return str(ensure_base_model(name, task, seed))
    return name
