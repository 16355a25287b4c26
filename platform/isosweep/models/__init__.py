"""The tiny Qwen2 model family and the base models built from it.

- ``sizes``       the size table and parameter counts (no torch: a config loads without it)
- ``family``      a size -> its Hugging Face ``Qwen2Config``
- ``tokenizer``   the character-level tokenizer, a Hugging Face fast tokenizer (no chat template), and
                  ``chat_prompt``, a prompt wrapped by a real model's chat template
- ``problemsets`` easy and hard problem sets from a base model's measured pass rates
- ``warmup``      the supervised warm-up that makes a base model, cached on disk;
                  ``ensure_base_model(size, task, seed)`` returns a directory that loads with
                  ``from_pretrained``, and ``resolve_model`` maps a trial's ``model.name`` to it

The package imports nothing itself, so importing ``isosweep.models.sizes`` stays light.
"""
