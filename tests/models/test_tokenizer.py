"""The character tokenizer round-trips every task string and reloads through AutoTokenizer."""

from __future__ import annotations

from transformers import AutoTokenizer

from isosweep.models.tokenizer import EOS, PAD, char_tokenizer, chat_prompt
from isosweep.tasks import ALPHABET, get_task


def test_one_token_per_character_and_roundtrip():
    tok = char_tokenizer()
    assert len(tok) == len(ALPHABET) + 2
    assert (tok.pad_token, tok.eos_token) == (PAD, EOS)
    for name in ("arithmetic", "countdown"):
        task = get_task(name)
        for level in task.levels[:3]:
            for problem in task.problems("train", level, 20, seed=3):
                text = problem.prompt + problem.answer
                ids = tok(text, add_special_tokens=False)["input_ids"]
                assert len(ids) == len(text)
                assert tok.decode(ids) == text


def test_spaces_are_tokens_not_separators():
    tok = char_tokenizer()
    ids = tok(" 1 2", add_special_tokens=False)["input_ids"]
    assert len(ids) == 4
    assert tok.decode(ids) == " 1 2"


def test_saves_and_loads_with_auto_tokenizer(tmp_path):
    tok = char_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "12+34=46"
    assert loaded(text, add_special_tokens=False)["input_ids"] == tok(text, add_special_tokens=False)["input_ids"]
    assert loaded.eos_token_id == tok.eos_token_id and loaded.pad_token_id == tok.pad_token_id
    assert loaded.decode(loaded(text, add_special_tokens=False)["input_ids"]) == text


def test_the_tiny_tokenizer_has_no_chat_template_so_tiny_prompts_stay_raw(tmp_path):
    char_tokenizer().save_pretrained(tmp_path)
    assert not AutoTokenizer.from_pretrained(tmp_path).chat_template


def test_chat_prompt_wraps_one_user_message_and_opens_the_reply(tmp_path):
    """With a template saved beside it, a character tokenizer over printable ASCII spells the wrapped prompt
    out character by character (the setup of the end-to-end chat trial)."""
    tok = char_tokenizer("".join(map(chr, range(32, 127))) + "\n")
    tok.chat_template = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = chat_prompt(loaded, "Ava has 3 apples. How many?")
    assert text == "<|user|>\nAva has 3 apples. How many?\n<|assistant|>\n"
    assert loaded.decode(loaded(text, add_special_tokens=False)["input_ids"]) == text
