"""The tiny model family's size table and parameter counts, without torch or transformers.

Loading a trial config checks ``model.name`` against this table, and an HPO study prices its
proxies by parameter count: neither should pay for importing torch. ``family.qwen2_config``
turns a size into the Hugging Face config.
"""

from __future__ import annotations

from dataclasses import dataclass

from isosweep.tasks import ALPHABET

WARMUP_VERSION = "2"
"""Version of the warm-up that builds the tiny base models (``warmup``): a base model's cache key and every sweep
id of a tiny model carry it. 2: built under pinned numerics, the same bits on any x86-64 CPU; 1: built with
whatever kernels the CPU offered, so the same size was another model on another machine."""

FIRST_WARMUP_VERSION = "1"
"""The version the first sweeps and studies ran on: left out of their ids, which stay as they were."""


def warmup_version_in_ids() -> str | None:
    """The warm-up version that sweep ids, HPO study ids and HPO tables of tiny models carry: None for the first."""
    return None if WARMUP_VERSION == FIRST_WARMUP_VERSION else WARMUP_VERSION

CHAR_VOCAB = len(ALPHABET) + 2
"""Vocabulary of the character tokenizer: the tasks' alphabet plus ``<pad>`` and ``<eos>``."""


@dataclass(frozen=True)
class TinySize:
    """Shape of one member of the tiny family."""

    hidden: int
    """Model width (hidden size)."""
    layers: int
    """Number of transformer blocks."""
    intermediate: int
    """Width of the MLP."""
    head_dim: int = 32
    """Width of one attention head; vLLM's CPU backend needs at least 32."""


FAMILY: dict[str, TinySize] = {
    "tiny-0.3m": TinySize(hidden=64, layers=6, intermediate=192),
    "tiny-1m": TinySize(hidden=128, layers=4, intermediate=448),
    "tiny-5m": TinySize(hidden=256, layers=6, intermediate=704),
}
"""The sizes the sweeps and studies run: each warmed up for the same number of steps."""

LADDER: dict[str, TinySize] = {
    "tiny-w64": TinySize(hidden=64, layers=4, intermediate=224),
    "tiny-w128": TinySize(hidden=128, layers=4, intermediate=448),
    "tiny-w256": TinySize(hidden=256, layers=4, intermediate=896),
}
"""A width ladder for HPO across sizes: width doubles at a fixed depth (4 blocks, MLP 3.5x the width),
and each size is warmed up *to the same stage* (until its pass rate on one shared problem set reaches
the same target, ``warmup.LADDER_RECIPES``), so the sizes differ in capacity, not in how far their
warm-up got. Pair it with ``algorithm.width_ref`` so the RL learning rate scales as 1 / width."""

SIZES: dict[str, TinySize] = {**FAMILY, **LADDER}

TABULAR = "tabular"
"""The ``model.name`` of the codes tasks' planted control: a table of logits per family and position, no transformer
(:mod:`isosweep.models.tabular`)."""


def param_count(size: str, vocab: int = CHAR_VOCAB) -> int:
    """Parameters of a tiny size: tied embeddings, per block q/k/v (with bias) and o projections, a
    gated MLP and two RMSNorms, then the final norm (the count ``Qwen2ForCausalLM`` reports)."""
    shape = SIZES[size]
    h, i = shape.hidden, shape.intermediate
    block = 4 * h * h + 3 * h + 3 * h * i + 2 * h
    return vocab * h + shape.layers * block + h
