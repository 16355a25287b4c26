"""FP8 (e4m3) weight rounding: what a rollout engine's FP8 weights do to the policy, in plain torch.

``fp8_roundtrip`` quantizes a ``(out_features, in_features)`` weight to ``float8_e4m3fn`` with
one scale per output channel (row), ``scale = amax(|row|) / 448``, and dequantizes it again.
This is the weight half of vLLM's online ``quantization="fp8_per_channel"`` (its
``Fp8PtpcOnlineLinearMethod``: per-channel weight scales, including the floor on the scale),
so a rollout engine that cannot run FP8 kernels (vLLM on CPU) can still sample from a policy
with FP8 weight error. It departs from the GPU path in two ways: activations stay bf16 (vLLM on
a GPU also quantizes activations per token), and the dequantized weight is rounded to the
input dtype instead of being applied through the scaled matmul.

The arithmetic is done in float64 so that the max of each row survives the round trip exactly;
that makes the round trip idempotent and exactly equivariant under power-of-two scaling.

A ladder of larger rollout errors, for studying importance-sampling corrections where FP8 is too
mild to hurt: ``int_roundtrip`` rounds a weight to a symmetric ``bits``-bit integer grid with one
scale per output channel (``scale = amax(|row|) / (2^(bits-1) - 1)``, round to nearest), the
weight-only "fake quantization" of GPTQ/AWQ-style int8/int4 serving without their error
compensation. ``rounded_state_dict`` applies the precision a trial names (``fp8``, ``int8`` ...
``int2``) to the linear weights; every engine serves the rounded weights in bf16.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)
"""Largest finite ``float8_e4m3fn`` value (448)."""
MIN_SCALE = 1.0 / (FP8_MAX * 512)
"""Floor on a row's scale, as in vLLM's per-channel FP8: rows with ``amax < 1/512`` share it."""
NOT_LINEAR = ("embed", "lm_head", "norm")
"""Name fragments of 2-D weights that vLLM's FP8 leaves in bf16 (embeddings, LM head, norms)."""


def fp8_roundtrip(weight: Tensor) -> Tensor:
    """Round a weight through per-output-channel FP8 e4m3 and back.

    Args:
        weight: ``(out_features, in_features)``, any float dtype (a leading batch of rows works
            too: the scale is taken over the last dimension).

    Returns:
        Same shape and dtype: ``fp8(w / scale) * scale`` with ``scale = max(amax / 448, MIN_SCALE)``
        per row. Rows of zeros stay zero. Each element moves by at most half an FP8 step:
        ``2^-4 |w|`` in the normal range, ``2^-10 scale`` in the subnormal range.
    """
    wide = weight.to(torch.float64)
    amax = wide.abs().amax(dim=-1, keepdim=True)
    scale = (amax / FP8_MAX).clamp_min(MIN_SCALE)
    quantized = (wide / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return (quantized.to(torch.float64) * scale).to(weight.dtype)


def is_linear_weight(name: str, tensor: Tensor) -> bool:
    """Whether vLLM's FP8 quantizes this tensor: a 2-D ``*.weight`` outside embeddings, LM head and norms.

    vLLM's FP8 methods replace ``Linear`` layers only, so the token embedding and the LM head stay
    bf16; with tied embeddings (``lm_head.weight`` is ``embed_tokens.weight``) both names are
    excluded, so the shared matrix is never rounded.

    >>> is_linear_weight("model.layers.0.mlp.up_proj.weight", torch.zeros(4, 2))
    True
    >>> is_linear_weight("model.embed_tokens.weight", torch.zeros(4, 2))
    False
    """
    return tensor.dim() == 2 and name.endswith(".weight") and not any(part in name for part in NOT_LINEAR)


def fp8_state_dict(
    state_dict: Mapping[str, Tensor],
    is_linear: Callable[[str, Tensor], bool] | None = None,
    rounder: Callable[[Tensor], Tensor] = fp8_roundtrip,
) -> dict[str, Tensor]:
    """A copy of ``state_dict`` whose linear weights went through :func:`fp8_roundtrip` (or ``rounder``:
    :func:`rounded_state_dict` passes :func:`int_roundtrip` for the integer precisions).

    Args:
        state_dict: parameter name -> tensor.
        is_linear: which tensors to round; :func:`is_linear_weight` by default.

    Returns:
        A new dict with the same keys and dtypes; tensors that are not rounded are the same
        objects as in ``state_dict`` (not copied).
    """
    pick = is_linear or is_linear_weight
    return {name: rounder(t) if pick(name, t) else t for name, t in state_dict.items()}


INT_BITS = {"int8": 8, "int6": 6, "int4": 4, "int3": 3, "int2": 2}
"""Integer rollout precisions and their bits (weights only, per-output-channel symmetric)."""


def int_roundtrip(weight: Tensor, bits: int) -> Tensor:
    """Round a weight to a symmetric ``bits``-bit integer grid, one scale per output channel, and back.

    ``scale = amax(|row|) / (2^(bits-1) - 1)``; each element becomes ``round(w / scale) * scale``, so it
    moves by at most half a step, ``scale / 2``, and each row's largest magnitude is kept exactly. Rows of
    zeros stay zero. Same shape and dtype as ``weight``.
    """
    if bits < 2:
        raise ValueError(f"bits must be >= 2, got {bits}")
    top = 2 ** (bits - 1) - 1
    wide = weight.to(torch.float64)
    amax = wide.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    return ((wide / scale).round().clamp(-top, top) * scale).to(weight.dtype)


def rounded_state_dict(state_dict: Mapping[str, Tensor], precision: str,
                       is_linear: Callable[[str, Tensor], bool] | None = None) -> dict[str, Tensor]:
    """``state_dict`` with its linear weights rounded to ``precision``: ``fp8`` (:func:`fp8_roundtrip`),
    one of :data:`INT_BITS` (:func:`int_roundtrip`), or ``bf16`` (nothing rounded here)."""
    if precision == "bf16":
        return dict(state_dict)
    if precision == "fp8":
        return fp8_state_dict(state_dict, is_linear)
    if precision not in INT_BITS:
        raise ValueError(f"precision must be bf16, fp8 or one of {', '.join(INT_BITS)}; got {precision!r}")
    return fp8_state_dict(state_dict, is_linear, rounder=lambda t: int_roundtrip(t, INT_BITS[precision]))
