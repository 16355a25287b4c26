"""A trial on real-format data with a chat model: the GSM8K-format sample, read by ``datasets``, runs end to end.

The tiny family cannot spell GSM8K's text (its alphabet is the synthetic tasks'), and nothing may be downloaded,
so the model is a small random Qwen2 over a character tokenizer of printable ASCII that carries a chat template.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from isosweep.models.tokenizer import char_tokenizer
from isosweep.spec.trial import load_trial
from isosweep.track.curves import COUNTS_KEY
from isosweep.trial.files import TrialDir
from isosweep.trial.loop import PROMPT_FORMAT_KEY, train_loop

ROOT = Path(__file__).resolve().parents[2]
GSM8K_SAMPLE_TRIAL = ROOT / "sweeps" / "trials" / "gsm8k-sample.yaml"
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def chat_model(folder: Path) -> Path:
    """Save a random 2-layer Qwen2 (hidden 64, head_dim 32) and its templated character tokenizer in ``folder``."""
    tokenizer = char_tokenizer("".join(map(chr, range(32, 127))) + "\n")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.model_max_length = 1024
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id))
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_a_chat_model_trains_on_the_gsm8k_format_sample(tmp_path, monkeypatch):
    """The committed trial file with a local model: problems from the parquet folder's own splits, prompts
    wrapped by the tokenizer's template (said in the log and in every eval record), records and checkpoints
    written. A random model solves nothing, so the problems are its hard set."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))  # not the user's cache
    model = chat_model(tmp_path / "model")
    cfg = load_trial(GSM8K_SAMPLE_TRIAL, [f"model.name={model}", "task.difficulty=hard", "budget=16", "Bp=4", "n=2",
                                          "rollout.max_new_tokens=4", "eval.every=2", "eval.samples=2", "eval.k=2"])
    lines: list[str] = []
    records = train_loop(cfg, tmp_path / "trial", log=lines.append)

    assert "[trial] prompts: chat (auto: the tokenizer has a chat template)" in lines
    assert any("hf:sweeps/data/gsm8k-sample/hard" in line and "32 train / 8 eval problems" in line for line in lines)
    assert [r["step"] for r in records] == [0, 2] and TrialDir(tmp_path / "trial").records() == records
    for record in records:
        assert record[PROMPT_FORMAT_KEY] == "chat" and len(record[COUNTS_KEY]) == 8
        assert 0 <= record["eval/mean@2"] <= 1
    assert records[-1]["train/reward"] is not None and records[-1]["tokens"] > 0
