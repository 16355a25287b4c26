"""Tests for isosweep.rollout.fp8: a nearest-grid-point loop reference, error bounds, exact invariances.

Every test runs in float32 and bfloat16 (the trainer's and the rollout engine's dtypes).
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from isosweep.models.family import qwen2_config
from isosweep.models.tokenizer import char_tokenizer
from isosweep.rollout.fp8 import (
    FP8_MAX,
    INT_BITS,
    MIN_SCALE,
    fp8_roundtrip,
    fp8_state_dict,
    int_roundtrip,
    is_linear_weight,
    rounded_state_dict,
)

DTYPES = [torch.float32, torch.bfloat16]
SEEDS = range(12)

# Every finite float8_e4m3fn value, by bit pattern (0x7f and 0xff are NaN).
CODES = [c for c in range(256) if c & 0x7F != 0x7F]
GRID = torch.tensor(CODES, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float64)
EVEN = torch.tensor([c & 1 == 0 for c in CODES])


def random_weight(seed: int, dtype: torch.dtype) -> torch.Tensor:
    """A ``(rows, cols)`` weight whose rows span 2^-14 .. 2^4 in magnitude (some below the scale floor)."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = (int(torch.randint(1, 17, (1,), generator=gen)) for _ in range(2))
    row_scale = 2.0 ** torch.randint(-14, 5, (rows, 1), generator=gen)
    return (torch.randn(rows, cols, generator=gen, dtype=torch.float64) * row_scale).to(dtype)


def row_scales(weight: torch.Tensor) -> torch.Tensor:
    """``(rows, 1)``: each row's FP8 scale, as the reference computes it."""
    return torch.tensor([[max(max(abs(x) for x in row) / FP8_MAX, MIN_SCALE)] for row in weight.double().tolist()],
                        dtype=torch.float64)


def loop_roundtrip(weight: torch.Tensor) -> torch.Tensor:
    """Row by row: divide by the scale, take the nearest e4m3 grid point (ties to even code), multiply back."""
    out = []
    for row, (scale,) in zip(weight.double().tolist(), row_scales(weight).tolist()):
        values = []
        for x in row:
            distance = (GRID - x / scale).abs()
            nearest = distance == distance.min()
            if int(nearest.sum()) > 1:
                nearest &= EVEN
            values.append(float(GRID[nearest][0]) * scale)
        out.append(values)
    return torch.tensor(out, dtype=torch.float64).to(weight.dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_matches_loop_reference(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        weight = random_weight(seed, dtype)
        got = fp8_roundtrip(weight)
        assert got.dtype == dtype and got.shape == weight.shape
        assert torch.equal(got, loop_roundtrip(weight)), seed


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_is_at_most_half_an_fp8_step(dtype: torch.dtype) -> None:
    """e4m3 has 3 mantissa bits: half a step is 2^-4 relative in the normal range and
    2^-10 * scale in the subnormal range; the final cast to ``dtype`` adds half its own ulp."""
    cast = torch.finfo(dtype).eps / 2
    for seed in SEEDS:
        weight = random_weight(seed, dtype)
        got = fp8_roundtrip(weight).double()
        wide = weight.double()
        error = (got - wide).abs()
        bound = 2.0**-4 * wide.abs() + 2.0**-10 * row_scales(weight) + cast * got.abs()
        assert bool((error <= bound).all()), seed
        normal = wide.abs() >= 2.0**-6 * row_scales(weight)
        assert bool((error[normal] <= 2.0**-3 * wide.abs()[normal]).all()), seed


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_is_idempotent(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        once = fp8_roundtrip(random_weight(seed, dtype))
        assert torch.equal(fp8_roundtrip(once), once), seed


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_rows_stay_zero(dtype: torch.dtype) -> None:
    weight = random_weight(3, dtype)
    weight[::2] = 0
    got = fp8_roundtrip(weight)
    assert not got[::2].any()
    assert torch.equal(got[1::2], fp8_roundtrip(weight[1::2]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("power", [-6, -1, 1, 7])
def test_power_of_two_scaling_commutes(dtype: torch.dtype, power: int) -> None:
    """roundtrip(c * w) == c * roundtrip(w) for c = 2^k, while every row's scale stays above the floor."""
    c = 2.0**power
    for seed in SEEDS:
        gen = torch.Generator().manual_seed(seed)
        weight = torch.randn(5, 9, generator=gen).to(dtype)
        assert torch.equal(fp8_roundtrip(c * weight), c * fp8_roundtrip(weight)), seed


@pytest.mark.parametrize("dtype", DTYPES)
def test_state_dict_rounds_linear_weights_only(dtype: torch.dtype) -> None:
    tok = char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config("tiny-0.3m", len(tok), tok.pad_token_id, tok.eos_token_id)).to(dtype)
    state = model.state_dict()
    rounded = fp8_state_dict(state)
    assert rounded.keys() == state.keys()
    linear = {name for name, t in state.items() if is_linear_weight(name, t)}
    assert "model.layers.0.self_attn.q_proj.weight" in linear and "model.layers.5.mlp.down_proj.weight" in linear
    assert not any(("embed" in name or "lm_head" in name or "norm" in name) for name in linear)
    for name, tensor in state.items():
        if name in linear:
            assert torch.equal(rounded[name], fp8_roundtrip(tensor)) and not torch.equal(rounded[name], tensor), name
        else:  # embeddings (tied to the LM head), norms and biases
            assert rounded[name] is tensor, name
    only_q = fp8_state_dict(state, is_linear=lambda name, t: name.endswith("q_proj.weight"))
    assert {n for n in state if only_q[n] is not state[n]} == {n for n in state if n.endswith("q_proj.weight")}


# ------------------------------------------------------------------ integer grids (the rollout-error ladder)


def int_loop_reference(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """Each element snapped, one at a time, to the nearest point of its row's grid {-top..top} * step,
    step = amax / top; a tie (bfloat16 weights land exactly half-way) goes to the even grid index."""
    top = 2 ** (bits - 1) - 1
    out = torch.zeros(weight.shape, dtype=torch.float64)
    for i, row in enumerate(weight.to(torch.float64)):
        amax = float(row.abs().max())
        if amax == 0:
            continue
        step = amax / top
        for j, w in enumerate(row.tolist()):
            distance = {q: abs(w / step - q) for q in range(-top, top + 1)}
            nearest = min(distance.values())
            q = min((q for q, d in distance.items() if d == nearest), key=lambda q: q % 2)
            out[i, j] = q * step
    return out.to(weight.dtype)


@pytest.mark.parametrize("bits", [8, 4, 3, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_int_roundtrip_matches_loop_reference(dtype: torch.dtype, bits: int) -> None:
    for seed in SEEDS:
        weight = (torch.randn(5, 9, generator=torch.Generator().manual_seed(seed)) * 0.1).to(dtype)
        assert torch.equal(int_roundtrip(weight, bits), int_loop_reference(weight, bits))


@pytest.mark.parametrize("bits", [8, 6, 4, 3, 2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_int_roundtrip_error_levels_and_idempotence(dtype: torch.dtype, bits: int) -> None:
    top = 2 ** (bits - 1) - 1
    for seed in SEEDS:
        weight = (torch.randn(6, 40, generator=torch.Generator().manual_seed(seed)) * 0.05).to(dtype)
        rounded = int_roundtrip(weight, bits)
        wide, back = weight.to(torch.float64), rounded.to(torch.float64)
        scale = wide.abs().amax(dim=-1, keepdim=True) / top
        slack = 2.0 ** -8 * wide.abs().amax(dim=-1, keepdim=True) if dtype == torch.bfloat16 else 1e-6 * scale
        assert ((back - wide).abs() <= scale / 2 + slack).all()  # at most half a step (plus the dtype's rounding)
        assert torch.equal(back.abs().amax(dim=-1), wide.abs().amax(dim=-1))  # each row's largest magnitude kept
        assert all(len(set(row.tolist())) <= 2 * top + 1 for row in back)
        assert torch.equal(int_roundtrip(rounded, bits), rounded)


def test_fewer_bits_move_the_weights_further() -> None:
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(0)) * 0.05
    errors = [float((int_roundtrip(weight, INT_BITS[name]) - weight).abs().mean()) for name in ("int8", "int4", "int3", "int2")]
    assert errors == sorted(errors) and errors[0] > 0
    assert float((fp8_roundtrip(weight) - weight).abs().mean()) < errors[1]  # fp8 is milder than int4


def test_rounded_state_dict_picks_the_precision_and_rejects_unknown_ones() -> None:
    state = {"model.layers.0.mlp.up_proj.weight": torch.randn(8, 4), "model.embed_tokens.weight": torch.randn(8, 4)}
    assert all(torch.equal(a, b) for a, b in zip(rounded_state_dict(state, "bf16").values(), state.values()))
    int4 = rounded_state_dict(state, "int4")
    assert torch.equal(int4["model.layers.0.mlp.up_proj.weight"], int_roundtrip(state["model.layers.0.mlp.up_proj.weight"], 4))
    assert int4["model.embed_tokens.weight"] is state["model.embed_tokens.weight"]
    assert torch.equal(rounded_state_dict(state, "fp8")["model.layers.0.mlp.up_proj.weight"],
                       fp8_roundtrip(state["model.layers.0.mlp.up_proj.weight"]))
    with pytest.raises(ValueError, match="int5"):
        rounded_state_dict(state, "int5")

