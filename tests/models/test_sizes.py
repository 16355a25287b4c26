"""The size table without torch: its parameter counts are what the Hugging Face model has."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2ForCausalLM

from isosweep.models.family import qwen2_config
from isosweep.models.sizes import CHAR_VOCAB, FAMILY, LADDER, SIZES, param_count
from isosweep.models.tokenizer import char_tokenizer


@pytest.mark.parametrize("size", list(SIZES))
def test_param_count_is_the_models(size):
    tok = char_tokenizer()
    assert len(tok) == CHAR_VOCAB
    with torch.device("meta"):
        model = Qwen2ForCausalLM(qwen2_config(size, len(tok), tok.pad_token_id, tok.eos_token_id))
    assert param_count(size) == sum(p.numel() for p in model.parameters())


def test_the_readme_figures():
    assert [param_count(s) for s in ("tiny-0.3m", "tiny-1m", "tiny-5m")] == [322_880, 955_776, 4_830_464]


def test_the_ladder_doubles_the_width_at_a_fixed_depth():
    shapes = list(LADDER.values())
    assert [s.hidden for s in shapes] == [64, 128, 256] and {s.layers for s in shapes} == {4}
    assert {s.intermediate / s.hidden for s in shapes} == {3.5}
    assert set(LADDER) | set(FAMILY) == set(SIZES) and not set(LADDER) & set(FAMILY)
