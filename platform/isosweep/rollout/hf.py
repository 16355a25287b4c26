"""The in-process rollout engine: a Hugging Face causal LM with a plain KV-cached sampling loop
(not ``generate``, whose default top-k would silently change the sampling distribution).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from isosweep.rollout.base import Rollouts, round_weights


@torch.no_grad()
def sample_tokens(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    temperature: float,
    eos_id: int,
    pad_id: int,
    generator: torch.Generator,
    compact_below: float = 0.75,
) -> tuple[Tensor, Tensor, Tensor]:
    """Ancestral sampling with a KV cache from left-padded prompts.

    Returns ``tokens (batch, max_new_tokens)``, ``logprobs (batch, max_new_tokens)`` (post-temperature
    log-prob of each sampled token) and ``lengths (batch,)``: the number of valid tokens of each
    row, ``<eos>`` included. Positions past a row's length hold ``pad_id`` and log-prob 0.

    Two savings that leave the samples as they were (the same tokens for a given ``generator`` state):
    a run of identical prompts (the ``n`` samples of one problem) is read once and its KV cache copied
    to every row of the run, and once fewer than ``compact_below`` of the rows still being computed are
    live, the finished rows are dropped from the batch. Every step still draws one token for every row
    (a finished row's draw is discarded), so the generator advances as it would without them.
    """
    batch = len(prompt_ids)
    device = next(model.parameters()).device
    starts = [row == 0 or prompt_ids[row] != prompt_ids[row - 1] for row in range(batch)]
    unique = [ids for ids, start in zip(prompt_ids, starts) if start]
    to_unique = torch.tensor(starts, dtype=torch.long).cumsum(0) - 1  # row -> its prompt's row in ``unique``
    width = max(len(p) for p in unique)
    input_ids = torch.full((len(unique), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(unique), width), dtype=torch.long)
    for row, ids in enumerate(unique):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids):] = 1
    input_ids, attention, to_unique = input_ids.to(device), attention.to(device), to_unique.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)

    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
    cache, last_logits = out.past_key_values, out.logits[:, -1, :]
    if len(unique) < batch:
        cache.batch_select_indices(to_unique)
        last_logits = last_logits[to_unique]
    attention, next_pos = attention[to_unique], positions[to_unique, -1:] + 1
    rows = torch.arange(batch, device=device)  # the batch rows the model computes, in its order
    for t in range(max_new_tokens):
        rows_logp = torch.log_softmax(last_logits.float() / temperature, dim=-1)
        probs = torch.zeros((batch, rows_logp.shape[-1]), device=device)
        probs[:, 0] = 1.0  # a dropped (finished) row: a placeholder draw, discarded
        probs[rows] = rows_logp.exp()
        token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        step_logp = torch.zeros(batch, device=device)
        step_logp[rows] = rows_logp.gather(-1, token[rows, None]).squeeze(-1)
        live = ~done
        tokens[live, t] = token[live]
        logprobs[live, t] = step_logp[live]
        lengths += live.long()
        done |= token == eos_id
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        computed_live = ~done[rows]
        if int(computed_live.sum()) < compact_below * len(rows):
            keep = computed_live.nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            rows, attention, next_pos, computed_live = rows[keep], attention[keep], next_pos[keep], computed_live[keep]
        attention = torch.cat([attention, computed_live.long()[:, None]], dim=-1)
        feed = torch.where(computed_live, token[rows], torch.full_like(rows, pad_id))[:, None]
        out = model(input_ids=feed, attention_mask=attention, position_ids=next_pos, past_key_values=cache,
                    use_cache=True)
        cache, last_logits = out.past_key_values, out.logits[:, -1, :]
        next_pos = next_pos + 1
    return tokens.cpu(), logprobs.cpu(), lengths.cpu()


class HFEngine:
    """In-process rollout engine on a Hugging Face causal LM (its own copy of the weights).

    With ``precision`` set, every weight update is rounded like the rollout weights of a bf16 or
    FP8 serving engine (``round_weights``), which reproduces the weight part of the mismatch.
    """

    def __init__(self, model: torch.nn.Module, tokenizer, max_new_tokens: int, temperature: float,
                 batch_size: int = 512, precision: str | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.batch_size = batch_size
        self.precision = precision
        self.policy_version = 0
        if precision is not None:
            self.update_weights(self.model.state_dict(), version=0)

    def update_weights(self, state_dict: Mapping[str, Tensor], version: int, at_precision: bool = True) -> None:
        """Copy the trainer's weights in place (rounded to ``precision``, or only to bf16 with
        ``at_precision=False``) and record their version."""
        if self.precision is not None:
            state_dict = round_weights(state_dict, self.precision if at_precision else "bf16")
        self.model.load_state_dict(state_dict, strict=True)
        self.policy_version = version

    def generate(self, prompts: Sequence[str], n: int, seed: int, temperature: float | None = None) -> Rollouts:
        """Sample ``n`` completions for each prompt at ``temperature`` (None: the engine's); deterministic for a
        given ``seed`` and weights."""
        encoded = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        prompt_ids = [ids for ids in encoded for _ in range(n)]
        generator = torch.Generator(device=next(self.model.parameters()).device).manual_seed(seed)
        completion_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        for start in range(0, len(prompt_ids), self.batch_size):
            chunk = prompt_ids[start:start + self.batch_size]
            tokens, logp, lengths = sample_tokens(
                self.model, chunk, self.max_new_tokens, self.temperature if temperature is None else temperature,
                self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, generator,
            )
            for row, length in enumerate(lengths.tolist()):
                completion_ids.append(tokens[row, :length].tolist())
                logprobs.append(logp[row, :length].tolist())
        eos = self.tokenizer.eos_token_id
        texts = self.tokenizer.batch_decode(
            [ids[:-1] if ids and ids[-1] == eos else ids for ids in completion_ids],
            skip_special_tokens=True,
        )
        return Rollouts(prompt_ids, completion_ids, logprobs, texts, self.policy_version)
