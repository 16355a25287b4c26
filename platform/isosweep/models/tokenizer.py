"""A character-level tokenizer for the tiny model family, saved as a Hugging Face fast tokenizer,
and `chat_prompt`, how a prompt is wrapped for a model whose tokenizer has a chat template.

One token per character of the synthetic tasks' alphabet, plus ``<pad>`` and ``<eos>``.
Because it is a ``PreTrainedTokenizerFast``, it is saved with ``save_pretrained`` and loaded by
``AutoTokenizer.from_pretrained(path)`` -- the same call that loads a real model's tokenizer --
and vLLM can serve models that use it. It has no chat template, so the tiny models' prompts stay raw.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from isosweep.tasks import ALPHABET

PAD, EOS = "<pad>", "<eos>"
SPECIAL_TOKENS = (PAD, EOS)


def char_tokenizer(alphabet: str = ALPHABET) -> PreTrainedTokenizerFast:
    """Build the character-level tokenizer: ids 0 and 1 are ``<pad>`` and ``<eos>``, then one id per character.

    >>> tok = char_tokenizer()
    >>> tok.decode(tok("12+34=")["input_ids"])
    '12+34='
    """
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + tuple(alphabet))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # Every character is its own pre-token; Fuse joins them back without spaces on decode.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        padding_side="left",
        model_max_length=256,
    )


def chat_prompt(tokenizer, prompt: str) -> str:
    """``prompt`` as one user message in ``tokenizer``'s chat template, ending where the assistant's reply starts.

    The result is text (special tokens spelled out); engines tokenize it without adding special tokens,
    so nothing is doubled. Rewards still see the completion alone.

    >>> tok = char_tokenizer()
    >>> tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    >>> chat_prompt(tok, "1+2=")
    '<|user|>1+2=<|assistant|>'
    """
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
