"""The tabular control: a softmax policy that is one table of logits per (family, position) of the codes task.

No transformer: at completion position k of a problem of family f the policy's logits over the three code digits
are ``theta[f, k] + phi[k]`` -- a table of its own per family and a row shared by every family (what carries
drift: learning anchor codes, which start with one digit, raises that digit for the needles too) -- with every
other token impossible; position 3 is the end of the completion, where only ``<eos>`` is possible. Its base
policy is *planted*, not warmed up: ``theta[f, k]`` puts ``a_f = log(q (9) / (1 - q))``, ``q = epsilon ** (1/3)``,
on the code's digit and 0 on the other nine, so the base pass rate of family f is exactly its ``epsilon``.

It is a Hugging Face model, so the same trial loop, GRPO loss, DeepSpeed optimizer and learning-rate rule train
it as a transformer (on the in-process rollout engine: vLLM cannot serve it), and its answer is known: the
frontier an independent simulation of the same algorithm finds (``isosweep.experiments.tabular_truth``).

The table is a linear head over one-hot features: the "decoder" (``TabularFeatures``) maps each position to a
one-hot of (family, k) and of k, and the head (``TabularHead``) is a bias-free linear map plus a fixed mask
(``-1e9`` on impossible tokens, so they have probability 0 and their weights never get a gradient). A position
that is no completion position (the prompt, or past ``<eos>``) has no features: uniform logits, never used.

Importing this module registers the model with ``AutoModelForCausalLM`` (model type ``isosweep-tabular``); its
base model is built and probed by :func:`isosweep.models.warmup.ensure_tabular_model`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast


MODEL_TYPE = "isosweep-tabular"
DIGIT_POSITIONS = 3
IMPOSSIBLE = -1e9
"""The logit of a token the policy cannot produce: its probability is 0 in float32."""
TABULAR_VERSION = "1"
"""Bump when what a built tabular base model is changes: its cache key carries it."""


class TabularConfig(PretrainedConfig):
    """The tabular policy's shape: ``families`` tables of ``DIGIT_POSITIONS`` rows, the token ids it needs."""

    model_type = MODEL_TYPE

    def __init__(self, families: int = 48, vocab_size: int = 22, digit_ids: list[int] | None = None,
                 marker_id: int = 20, eos_token_id: int = 1, pad_token_id: int = 0, **kwargs):
        self.families = families
        self.vocab_size = vocab_size
        self.digit_ids = list(digit_ids if digit_ids is not None else range(2, 12))
        self.marker_id = marker_id
        kwargs["tie_word_embeddings"] = False
        super().__init__(eos_token_id=eos_token_id, pad_token_id=pad_token_id, **kwargs)

    @property
    def width(self) -> int:
        """Features per position: one per (family, digit position), then one per position 0..3."""
        return self.families * DIGIT_POSITIONS + DIGIT_POSITIONS + 1


class TabularCache:
    """What generation carries from one token to the next: each row's family and its next completion position.
    ``batch_select_indices`` keeps the rows at ``indices`` (the rollout engine's cache contract)."""

    def __init__(self, family: Tensor, position: Tensor):
        self.family = family
        self.position = position

    def batch_select_indices(self, indices: Tensor) -> None:
        self.family = self.family[indices]
        self.position = self.position[indices]


class TabularFeatures(nn.Module):
    """The "decoder": one-hot features of (family, completion position) for every position of a batch."""

    def __init__(self, config: TabularConfig):
        super().__init__()
        self.config = config

    def features(self, family: Tensor, position: Tensor) -> Tensor:
        """``(..., width)`` float features of completion positions ``position`` (``-1``: none) of ``family``."""
        config = self.config
        out = torch.zeros((*position.shape, config.width), dtype=torch.float32, device=position.device)
        digit = (position >= 0) & (position < DIGIT_POSITIONS)
        table = (family.clamp(min=0) * DIGIT_POSITIONS + position.clamp(min=0, max=DIGIT_POSITIONS - 1))
        out.scatter_(-1, table.unsqueeze(-1), digit.unsqueeze(-1).float())
        shared = (position >= 0) & (position <= DIGIT_POSITIONS)
        index = config.families * DIGIT_POSITIONS + position.clamp(min=0, max=DIGIT_POSITIONS)
        out.scatter_add_(-1, index.unsqueeze(-1), shared.unsqueeze(-1).float())
        return out

    def parse(self, input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """Each row's family (its first two digits) and the index of its prompt's end marker (``>``)."""
        config = self.config
        if attention_mask is None:
            attention_mask = (input_ids != config.pad_token_id).long()
        start = attention_mask.long().argmax(dim=-1)
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        width = input_ids.shape[1]
        digit_of = torch.full((config.vocab_size,), -1, dtype=torch.long, device=input_ids.device)
        digit_of[torch.tensor(config.digit_ids, device=input_ids.device)] = torch.arange(10, device=input_ids.device)
        tens = digit_of[input_ids[rows, start]]
        ones = digit_of[input_ids[rows, (start + 1).clamp(max=width - 1)]]
        family = tens * 10 + ones
        columns = torch.arange(width, device=input_ids.device)
        is_marker = (input_ids == config.marker_id) & (columns >= start.unsqueeze(-1))
        marker = torch.where(is_marker, columns, width).min(dim=-1).values
        bad = (tens < 0) | (ones < 0) | (family >= config.families) | (marker >= width)
        if bool(bad.any()):
            row = int(bad.nonzero()[0, 0])
            raise ValueError(f"the tabular policy reads codes prompts ('07:412>', families < {config.families}); "
                             f"row {row} is not one (token ids {input_ids[row].tolist()})")
        return family, marker

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, past_key_values=None,
                use_cache: bool | None = None, **_) -> BaseModelOutputWithPast:
        if isinstance(past_key_values, TabularCache):  # one new token per row, at the cached position
            position = past_key_values.position.unsqueeze(-1) + torch.arange(input_ids.shape[1], device=input_ids.device)
            hidden = self.features(past_key_values.family.unsqueeze(-1).expand_as(position), position)
            cache = TabularCache(past_key_values.family, position[:, -1] + 1)
        else:
            family, marker = self.parse(input_ids, attention_mask)
            columns = torch.arange(input_ids.shape[1], device=input_ids.device)
            position = columns.unsqueeze(0) - marker.unsqueeze(-1)
            position = torch.where(position <= DIGIT_POSITIONS, position, torch.full_like(position, -1))
            hidden = self.features(family.unsqueeze(-1).expand_as(position), position)
            cache = TabularCache(family, columns[-1] - marker + 1) if use_cache else None
        return BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=cache)


class TabularHead(nn.Module):
    """The table: a bias-free linear map of the features, plus the fixed mask of impossible tokens."""

    def __init__(self, config: TabularConfig):
        super().__init__()
        self.config = config
        self.weight = nn.Parameter(torch.zeros(config.vocab_size, config.width))

    def mask(self, device: torch.device) -> Tensor:
        """``(width, vocab)``: what each feature adds to the logits of the tokens its position cannot produce.
        Made from the config at every call, not kept as a buffer: ``from_pretrained`` leaves a buffer that is not
        in the weights file uninitialised."""
        config = self.config
        mask = torch.zeros((config.width, config.vocab_size), device=device)
        first_shared = config.families * DIGIT_POSITIONS
        digits = torch.tensor(config.digit_ids, device=device)
        for k in range(DIGIT_POSITIONS):
            mask[first_shared + k] = IMPOSSIBLE
            mask[first_shared + k, digits] = 0.0
        mask[first_shared + DIGIT_POSITIONS] = IMPOSSIBLE
        mask[first_shared + DIGIT_POSITIONS, config.eos_token_id] = 0.0
        return mask

    def forward(self, hidden: Tensor) -> Tensor:
        return hidden @ self.weight.t() + hidden @ self.mask(hidden.device)


class TabularPolicy(PreTrainedModel):
    """The tabular softmax policy as a causal LM (see the module docstring)."""

    config_class = TabularConfig
    base_model_prefix = "decoder"
    _no_split_modules: list[str] = []

    def __init__(self, config: TabularConfig):
        super().__init__(config)
        self.decoder = TabularFeatures(config)
        self.lm_head = TabularHead(config)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:  # the table starts at 0 (then planted); nothing random
        pass

    def get_decoder(self) -> nn.Module:
        return self.decoder

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def get_input_embeddings(self) -> nn.Module | None:
        return None

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                past_key_values=None, use_cache: bool | None = None, logits_to_keep: int | Tensor = 0,
                **kwargs) -> CausalLMOutputWithPast:
        out = self.decoder(input_ids, attention_mask=attention_mask, past_key_values=past_key_values,
                           use_cache=use_cache)
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(out.last_hidden_state[:, keep])
        return CausalLMOutputWithPast(logits=logits, past_key_values=out.past_key_values)

    def plant(self, codes: list[str], epsilons: list[float]) -> None:
        """Set the table to the planted base policy: family f passes with probability ``epsilons[f]``."""
        config = self.config
        weight = torch.zeros(config.vocab_size, config.width)
        for family, (code, epsilon) in enumerate(zip(codes, epsilons)):
            q = epsilon ** (1 / DIGIT_POSITIONS)
            logit = math.log(q * 9 / (1 - q))
            for k, digit in enumerate(code):
                weight[config.digit_ids[int(digit)], family * DIGIT_POSITIONS + k] = logit
        with torch.no_grad():
            self.lm_head.weight.copy_(weight)

    def pass_rates(self, codes: list[str]) -> Tensor:
        """Each family's exact pass rate: the product over positions of its code digit's probability."""
        config = self.config
        first_shared = config.families * DIGIT_POSITIONS
        weight = self.lm_head.weight.detach()[torch.tensor(config.digit_ids)]  # (10, width)
        rates = []
        for family, code in enumerate(codes):
            rate = 1.0
            for k, digit in enumerate(code):
                logits = weight[:, family * DIGIT_POSITIONS + k] + weight[:, first_shared + k]
                rate *= float(torch.softmax(logits.double(), dim=0)[int(digit)])
            rates.append(rate)
        return torch.tensor(rates, dtype=torch.float64)


AutoConfig.register(MODEL_TYPE, TabularConfig)
AutoModelForCausalLM.register(TabularConfig, TabularPolicy)
