"""The tiny Qwen2 model family: a few sizes of one architecture, small enough for a 2-core CPU.

Every size keeps ``head_dim = 32`` because vLLM's CPU attention backend rejects smaller heads.
Parameter counts (with the 22-token character vocabulary, tied embeddings):

==========  ======  ======  =====  ============  ==========
size        hidden  layers  heads  intermediate  parameters
==========  ======  ======  =====  ============  ==========
tiny-0.3m   64      6       2      192           ~0.3M
tiny-1m     128     4       4      448           ~1.0M
tiny-5m     256     6       8      704           ~4.8M
==========  ======  ======  =====  ============  ==========
"""

from __future__ import annotations

from transformers import Qwen2Config

from isosweep.models.sizes import SIZES


def qwen2_config(size: str, vocab_size: int, pad_token_id: int, eos_token_id: int) -> Qwen2Config:
    """The Hugging Face config of one tiny size (raises ``KeyError`` for an unknown size)."""
    shape = SIZES[size]
    heads = shape.hidden // shape.head_dim
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=shape.head_dim,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=eos_token_id,
        torch_dtype="float32",
    )
