"""The tiny model family's size table and parameter counts, without torch or transformers.

Loading a trial config checks ``model.name`` against this table, and an HPO study prices its
proxies by parameter count: neither should pay for importing torch. ``family.qwen2_config``
turns a size into the Hugging Face config.
"""

from __future__ import annotations

from dataclasses import dataclass

from isosweep.tasks import ALPHABET

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


SIZES: dict[str, TinySize] = {
    "tiny-0.3m": TinySize(hidden=64, layers=6, intermediate=192),
    "tiny-1m": TinySize(hidden=128, layers=4, intermediate=448),
    "tiny-5m": TinySize(hidden=256, layers=6, intermediate=704),
}


def param_count(size: str, vocab: int = CHAR_VOCAB) -> int:
    """Parameters of a tiny size: tied embeddings, per block q/k/v (with bias) and o projections, a
    gated MLP and two RMSNorms, then the final norm (the count ``Qwen2ForCausalLM`` reports)."""
    shape = SIZES[size]
    h, i = shape.hidden, shape.intermediate
    block = 4 * h * h + 3 * h + 3 * h * i + 2 * h
    return vocab * h + shape.layers * block + h
