"""GRPO math: group advantages, the PPO-clip policy loss, the k3 KL and entropy terms.

Pure functions of tensors and scalars, in the spirit of verl's ``core_algos.py``. Every
function returns tensors (no ``.item()``); metric dicts hold detached 0-dim tensors, named
without a prefix so the caller can put them under ``train/``.

Conventions
- ``mask`` is a 0/1 tensor (bool or float) of shape ``(batch, tokens)`` marking completion
  tokens. Masked-out positions are removed with ``torch.where`` rather than multiplied by 0,
  because padding may hold ``-inf``/``nan`` log-probs and ``0 * inf`` is ``nan``.
- Aggregation is the token mean over the whole batch (DAPO/Dr.GRPO style), not a per-sequence
  mean of means.

Departures from the DeepSeekMath paper: the group std is the population std
(``unbiased=False``), and groups whose rewards are all equal get an advantage of exactly 0
(the paper's formula would give ``0 / eps``, which is 0 only up to rounding of the mean).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def group_advantages(
    rewards: Tensor, scale_by_std: bool = True, eps: float = 1e-6
) -> tuple[Tensor, dict[str, Tensor]]:
    """Group-normalised advantages ``A_i = (r_i - mean_group) / (std_group + eps)``.

    Args:
        rewards: ``(groups, n)``, the rewards of the ``n`` completions of each problem.
        scale_by_std: divide by the group std (population std, ``unbiased=False``); when
            False, ``A_i = r_i - mean_group`` (Dr.GRPO).
        eps: added to the std before dividing.

    Returns:
        advantages ``(groups, n)``, same dtype as ``rewards``; groups with all-equal rewards
        get exactly 0. Metrics: ``frac_zero_std`` (fraction of groups whose rewards are all
        equal: they carry no signal) and ``reward_mean`` (mean over all rewards).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (groups, n), got shape {tuple(rewards.shape)}")
    mean = rewards.mean(dim=-1, keepdim=True)
    centred = rewards - mean
    if scale_by_std:
        std = rewards.std(dim=-1, keepdim=True, correction=0)
        centred = centred / (std + eps)
    # Compare with the first element instead of testing std == 0: the computed std of equal
    # floats can be a rounding error away from 0.
    zero_std = (rewards == rewards[:, :1]).all(dim=-1)
    advantages = torch.where(zero_std.unsqueeze(-1), torch.zeros_like(centred), centred)
    metrics = {
        "frac_zero_std": zero_std.to(rewards.dtype).mean().detach(),
        "reward_mean": rewards.mean().detach(),
    }
    return advantages, metrics


def token_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Token mean over the whole batch: ``sum(x * mask) / max(sum(mask), 1)``.

    Args:
        x: ``(batch, tokens)``.
        mask: ``(batch, tokens)``, 0/1 (bool or float).

    Returns:
        0-dim tensor of ``x``'s dtype; 0 when the mask is empty. Masked positions contribute
        exactly 0 to the value and to the gradient, whatever ``x`` holds there.
    """
    keep = mask.bool()
    total = torch.where(keep, x, torch.zeros_like(x)).sum()
    count = keep.sum().to(x.dtype).clamp(min=1)
    return total / count


def broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Per-token advantages: ``(batch,)`` or ``(batch, tokens)`` -> ``(batch, tokens)``.

    A ``(batch,)`` advantage (one per completion) is repeated over the tokens; the result has
    ``like``'s shape ``(batch, tokens)`` and dtype.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    return advantages.to(like.dtype).expand_as(like)


def _masked_diff(a: Tensor, b: Tensor, mask: Tensor) -> Tensor:
    """``a - b`` on masked tokens, 0 elsewhere, ``(batch, tokens)``.

    Zeroing before any ``exp`` keeps padding garbage (``-1e4``, ``-inf``) from producing an
    ``inf`` whose backward ``0 * inf`` would turn masked gradients into ``nan``.
    """
    diff = a - b.to(a.dtype)
    return torch.where(mask.bool(), diff, torch.zeros_like(diff))


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float,
                  weights: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO-clip policy loss with separate low/high clip ranges and token-mean aggregation.

    Per token, ``ratio = exp(logp - old_logp)`` and the objective is
    ``min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``; the loss is minus its
    token mean.

    Args:
        logp: ``(batch, tokens)``, log-probs of the sampled tokens under the current policy
            (carries the gradient).
        old_logp: ``(batch, tokens)``, log-probs under the policy that the ratio is taken
            against (no gradient expected).
        advantages: ``(batch,)`` (one per completion, broadcast over tokens) or
            ``(batch, tokens)``.
        mask: ``(batch, tokens)``, 0/1.
        clip_low: lower clip range, the ratio is clipped at ``1 - clip_low``.
        clip_high: upper clip range, the ratio is clipped at ``1 + clip_high``.
        weights: optional ``(batch, tokens)`` per-token weights multiplying the advantage
            (TIS/AIS importance weights enter here: ``A_tok = weights * A``), detached;
            ``None`` means no weighting.

    Returns:
        0-dim loss. Metrics: ``clip_frac`` (fraction of masked tokens where the clipped term
        is the minimum and differs, so the token gets no gradient), ``ratio_mean`` (token
        mean of the ratio), ``approx_kl`` (token mean of ``old_logp - logp``).
    """
    adv = broadcast_advantages(advantages, logp)
    if weights is not None:
        # Weights rescale the advantage; they are never differentiated.
        adv = weights.detach().to(logp.dtype) * adv
    log_ratio = _masked_diff(logp, old_logp, mask)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    objective = torch.minimum(unclipped, clipped)
    loss = -token_mean(objective, mask)
    with torch.no_grad():
        is_clipped = (clipped < unclipped).to(logp.dtype)
        metrics = {
            "clip_frac": token_mean(is_clipped, mask),
            "ratio_mean": token_mean(ratio, mask),
            "approx_kl": token_mean(-log_ratio, mask),
        }
    return loss, metrics


def k3_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """Token-mean k3 estimate of ``KL(pi || pi_ref)`` from tokens sampled from ``pi``.

    Per token, with ``d = ref_logp - logp``: ``exp(d) - d - 1`` (Schulman's k3; unbiased and
    non-negative).

    Args:
        logp: ``(batch, tokens)``, log-probs under the sampling policy ``pi``.
        ref_logp: ``(batch, tokens)``, log-probs of the same tokens under ``pi_ref``.
        mask: ``(batch, tokens)``, 0/1.

    Returns:
        0-dim tensor, ``>= 0``; exactly 0 when ``logp == ref_logp``.
    """
    d = _masked_diff(ref_logp.to(logp.dtype), logp, mask)
    # expm1 keeps the small-d regime accurate; the clamp makes ">= 0" hold bitwise where
    # rounding would leave a -1e-17.
    per_token = (torch.expm1(d) - d).clamp(min=0.0)
    return token_mean(per_token, mask)


def entropy_from_logits(logits: Tensor, mask: Tensor) -> Tensor:
    """Token-mean entropy of ``softmax(logits)``.

    Args:
        logits: ``(batch, tokens, vocab)``, already divided by the sampling temperature.
        mask: ``(batch, tokens)``, 0/1.

    Returns:
        0-dim tensor, in nats.
    """
    probs = torch.softmax(logits, dim=-1)
    # H = logsumexp(l) - sum(p * l), which avoids log(p) of underflowed probabilities.
    per_token = torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
    return token_mean(per_token, mask)


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
    """Post-temperature log-probs of the sampled tokens.

    Args:
        logits: ``(batch, tokens, vocab)``, raw logits.
        tokens: ``(batch, tokens)``, integer token ids.
        temperature: sampling temperature, ``> 0``.

    Returns:
        ``(batch, tokens)``: ``log_softmax(logits / temperature)`` gathered at ``tokens``,
        the same "processed" log-probs that the rollout engine reports.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = logits / temperature
    picked = scaled.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(scaled, dim=-1)


def _chunk_stats(head: Callable[[Tensor], Tensor], hidden: Tensor, tokens: Tensor,
                 temperature: float) -> tuple[Tensor, Tensor]:
    """Log-probs of ``tokens`` and entropies, ``(chunk,)`` each, float32, from ``hidden`` ``(chunk, width)``."""
    scaled = head(hidden).float() / temperature
    log_z = torch.logsumexp(scaled, dim=-1)
    logp = scaled.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1) - log_z
    entropy = log_z - (torch.softmax(scaled, dim=-1) * scaled).sum(dim=-1)
    return logp, entropy


def chunked_token_stats(hidden: Tensor, head: Callable[[Tensor], Tensor], tokens: Tensor, temperature: float,
                        chunk: int) -> tuple[Tensor, Tensor]:
    """Post-temperature log-probs of the sampled tokens and the entropy at every position, from the
    final hidden states, ``chunk`` positions at a time.

    The same values as :func:`token_logprobs` and the per-token terms of :func:`entropy_from_logits`
    on ``head(hidden)``, without ever holding the whole ``(..., vocab)`` logits: each chunk's logits
    exist (in float32) only while that chunk is computed, and with gradients on, each chunk is
    recomputed in the backward pass (activation checkpointing) instead of being kept for it. At
    Qwen2.5's 151,936-token vocabulary one float32 copy of a 600-token sequence's logits is 365 MB.

    Args:
        hidden: ``(batch, tokens, width)``, the decoder's output before the output head.
        head: the output head, ``(n, width) -> (n, vocab)`` (an ``nn.Linear``; called once per chunk,
            so a ZeRO-3 partitioned head gathers its weight per chunk).
        tokens: ``(batch, tokens)``, the ids whose log-probs are wanted.
        temperature: sampling temperature, ``> 0``.
        chunk: positions per chunk, ``> 0``.

    Returns:
        ``(logp, entropy)``, each ``(batch, tokens)`` float32, entropy in nats.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk <= 0:
        raise ValueError(f"chunk must be > 0, got {chunk}")
    flat_hidden, flat_tokens = hidden.reshape(-1, hidden.shape[-1]), tokens.reshape(-1)
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    parts = []
    for start in range(0, flat_tokens.numel(), chunk):
        args = (head, flat_hidden[start:start + chunk], flat_tokens[start:start + chunk], temperature)
        parts.append(checkpoint(_chunk_stats, *args, use_reentrant=False) if recompute else _chunk_stats(*args))
    if not parts:
        empty = hidden.new_zeros(tokens.shape, dtype=torch.float32)
        return empty, empty.clone()
    logp = torch.cat([p[0] for p in parts]).view(tokens.shape)
    entropy = torch.cat([p[1] for p in parts]).view(tokens.shape)
    return logp, entropy


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    kl_coef: float = 0.0,
    ref_logp: Tensor | None = None,
    entropy_coef: float = 0.0,
    entropy: Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GRPO loss: PPO-clip policy loss ``+ kl_coef * k3_kl - entropy_coef * entropy``.

    Args:
        logp, old_logp, mask: ``(batch, tokens)``, as in :func:`ppo_clip_loss`.
        advantages: ``(batch,)`` or ``(batch, tokens)``.
        clip_low, clip_high: clip ranges, as in :func:`ppo_clip_loss`.
        kl_coef: weight of the k3 KL to the reference; needs ``ref_logp`` when non-zero.
        ref_logp: ``(batch, tokens)``, reference-policy log-probs, or ``None``.
        entropy_coef: weight of the entropy bonus; needs ``entropy`` when non-zero.
        entropy: 0-dim token-mean entropy (see :func:`entropy_from_logits`), or ``None``.
        weights: optional ``(batch, tokens)`` advantage weights (TIS/AIS).

    Returns:
        0-dim loss. A term whose coefficient is 0 is not added at all, so with both
        coefficients 0 the loss is bitwise the policy loss. Metrics: those of
        :func:`ppo_clip_loss` plus ``loss/policy``, ``loss/total``, and ``loss/kl`` /
        ``loss/entropy`` when ``ref_logp`` / ``entropy`` is given (logged even with a zero
        coefficient, so drift can be watched without being penalised).
    """
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef is non-zero but ref_logp is None")
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef is non-zero but entropy is None")
    policy_loss, metrics = ppo_clip_loss(
        logp, old_logp, advantages, mask, clip_low, clip_high, weights=weights
    )
    loss = policy_loss
    metrics["loss/policy"] = policy_loss.detach()
    if ref_logp is not None:
        if kl_coef != 0.0:
            kl = k3_kl(logp, ref_logp, mask)
            loss = loss + kl_coef * kl
        else:
            with torch.no_grad():
                kl = k3_kl(logp, ref_logp, mask)
        metrics["loss/kl"] = kl.detach()
    if entropy is not None:
        metrics["loss/entropy"] = entropy.detach()
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * entropy
    metrics["loss/total"] = loss.detach()
    return loss, metrics
