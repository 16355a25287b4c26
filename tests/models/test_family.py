"""The tiny family: roughly 0.3M / 1M / 5M parameters, head_dim >= 32, loads with from_pretrained."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

from isosweep.models.family import qwen2_config
from isosweep.models.sizes import SIZES
from isosweep.models.tokenizer import char_tokenizer

EXPECTED = {"tiny-0.3m": 0.3e6, "tiny-1m": 1e6, "tiny-5m": 5e6, "tiny-w64": 0.25e6, "tiny-w128": 1e6, "tiny-w256": 4e6}


@pytest.mark.parametrize("size", sorted(SIZES))
def test_sizes_have_their_nominal_parameter_count(size):
    tok = char_tokenizer()
    cfg = qwen2_config(size, len(tok), tok.pad_token_id, tok.eos_token_id)
    model = Qwen2ForCausalLM(cfg)
    count = sum(p.numel() for p in model.parameters())
    assert 0.75 * EXPECTED[size] < count < 1.25 * EXPECTED[size]
    assert cfg.head_dim >= 32  # vLLM's CPU attention backend rejects smaller heads
    assert cfg.hidden_size == cfg.num_attention_heads * cfg.head_dim


def test_sizes_are_ordered():
    tok = char_tokenizer()
    counts = [sum(p.numel() for p in Qwen2ForCausalLM(qwen2_config(s, len(tok), 0, 1)).parameters())
              for s in ("tiny-0.3m", "tiny-1m", "tiny-5m")]
    assert counts == sorted(counts)


def test_save_and_from_pretrained_give_the_same_logits(tmp_path):
    tok = char_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config("tiny-0.3m", len(tok), tok.pad_token_id, tok.eos_token_id)).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert (tmp_path / "model.safetensors").exists()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([tok("12+34=", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
