"""Corrections for the rollout/trainer mismatch (FP8 rollouts, bf16 trainer).

Rollouts are sampled from ``pi_hat`` (e.g. vLLM in FP8) while the trainer computes ``pi``;
per token, ``rho = pi(y) / pi_hat(y) = exp(logp_train - logp_rollout)``. Both log-probs must be
post-temperature. Three corrections, chosen by the caller:

- ``none``: plain GRPO (no weights);
- ``tis``: the advantage is multiplied by ``min(rho, cap)`` (:func:`tis_weights`);
- ``ais``: per batch, an ``alpha`` in ``[0, 1]`` (:func:`ais_alpha`) interpolates between no
  correction and TIS, ``w = 1 + alpha * (min(rho, cap) - 1)`` (:func:`ais_weights`).

The weights enter :func:`isosweep.algo.grpo.ppo_clip_loss` as ``weights``. They carry no
gradient: they rescale the advantage, they are not part of the objective being
differentiated. Every statistic here is taken over the masked (completion) tokens only, with
population moments; masked-out positions never reach an ``exp``, so padding may hold any
value.
"""

from __future__ import annotations

import torch
from torch import Tensor

from isosweep.algo.grpo import broadcast_advantages, k3_kl, token_mean


def _log_ratio(logp_train: Tensor, logp_rollout: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(valid, log_rho)``, both ``(batch, tokens)``; ``log_rho`` is 0 where masked out."""
    valid = mask.bool()
    diff = logp_train.detach() - logp_rollout.detach().to(logp_train.dtype)
    return valid, torch.where(valid, diff, torch.zeros_like(diff))


def _check_cap(cap: float) -> None:
    # A cap below 1 would shrink every weight, including those of tokens with no mismatch.
    if cap < 1.0:
        raise ValueError(f"cap must be >= 1, got {cap}")


def tis_weights(
    logp_train: Tensor, logp_rollout: Tensor, mask: Tensor, cap: float
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance weights ``min(rho, cap)``.

    Args:
        logp_train: ``(batch, tokens)``, trainer log-probs ``log pi``.
        logp_rollout: ``(batch, tokens)``, rollout log-probs ``log pi_hat``.
        mask: ``(batch, tokens)``, 0/1.
        cap: truncation ``C >= 1``.

    Returns:
        weights ``(batch, tokens)``, detached, 0 on masked-out tokens. Metrics:
        ``capped_frac`` (fraction of tokens with ``rho > cap``), ``weight_mean``.
    """
    _check_cap(cap)
    with torch.no_grad():
        valid, log_rho = _log_ratio(logp_train, logp_rollout, mask)
        rho = torch.exp(log_rho)
        weights = torch.where(valid, rho.clamp(max=cap), torch.zeros_like(rho))
        metrics = {
            "capped_frac": token_mean((rho > cap).to(rho.dtype), mask),
            "weight_mean": token_mean(weights, mask),
        }
    return weights, metrics


def mismatch_metrics(logp_train: Tensor, logp_rollout: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the rollout policy is from the trainer's, over the masked tokens.

    Args:
        logp_train: ``(batch, tokens)``, trainer log-probs ``log pi``.
        logp_rollout: ``(batch, tokens)``, rollout log-probs ``log pi_hat``.
        mask: ``(batch, tokens)``, 0/1.

    Returns:
        Detached 0-dim tensors: ``logp_abs_diff_mean`` (token mean of
        ``|log pi - log pi_hat|``), ``ratio_max`` (max of ``rho``; 0 for an empty mask) and
        ``kl``: the k3 estimate of ``KL(pi_hat || pi)`` from the rollout tokens (which are
        sampled from ``pi_hat``), per token ``rho - 1 - log rho``; non-negative and unbiased.
    """
    with torch.no_grad():
        valid, log_rho = _log_ratio(logp_train, logp_rollout, mask)
        rho = torch.exp(log_rho)
        return {
            "logp_abs_diff_mean": token_mean(log_rho.abs(), mask),
            "ratio_max": torch.where(valid, rho, torch.zeros_like(rho)).max(),
            "kl": k3_kl(logp_rollout.detach(), logp_train.detach(), mask),
        }


def ais_alpha(
    logp_train: Tensor,
    logp_rollout: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cap: float,
    delta: float,
    beta: float,
    gamma: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Adaptive importance-sampling strength ``alpha`` for one batch.

    With truncated weights ``w = min(rho, cap)`` over the masked tokens (population moments):

    - ``alpha_ess = (1 + CV^2(w))^(-1/2)``, ``CV^2 = var(w) / mean(w)^2``;
    - ``alpha_mis = min(1, d / delta)``, ``d`` the token mean of ``|log pi - log pi_hat|``;
    - ``delta_sigma = std(w * A) / std(A) - 1`` (``A`` broadcast per token), defined as 0
      when every ``A`` is equal (``std(A) == 0``) or when every weight is exactly 1;
    - ``alpha_var = max(0, (delta_sigma - gamma) / gamma)``;
    - ``alpha = clip(alpha_ess - beta * alpha_var, 0, 1) * alpha_mis``.

    Identical log-probs give ``alpha_mis = 0``, hence ``alpha = 0`` (plain GRPO).

    Args:
        logp_train: ``(batch, tokens)``, trainer log-probs.
        logp_rollout: ``(batch, tokens)``, rollout log-probs.
        advantages: ``(batch,)`` or ``(batch, tokens)``.
        mask: ``(batch, tokens)``, 0/1.
        cap: truncation ``C >= 1``.
        delta: mismatch scale ``> 0``; a mean ``|log-ratio|`` of ``delta`` or more switches
            the correction fully on.
        beta: ``>= 0``, how much variance amplification pulls ``alpha`` down.
        gamma: ``> 0``, the tolerated relative variance amplification.

    Returns:
        ``alpha``, a detached 0-dim tensor in ``[0, 1]`` of ``logp_train``'s dtype. Metrics:
        ``alpha``, ``alpha_ess``, ``alpha_mis``, ``alpha_var``, ``ess`` (normalised effective
        sample size ``(sum w)^2 / (N sum w^2)``, 0 for an empty mask) and ``delta_sigma``.
    """
    _check_cap(cap)
    if delta <= 0.0:
        raise ValueError(f"delta must be > 0, got {delta}")
    if gamma <= 0.0:
        raise ValueError(f"gamma must be > 0, got {gamma}")
    if beta < 0.0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    with torch.no_grad():
        valid, log_rho = _log_ratio(logp_train, logp_rollout, mask)
        zero = torch.zeros_like(log_rho)
        w = torch.where(valid, torch.exp(log_rho).clamp(max=cap), zero)
        count = valid.sum().to(w.dtype).clamp(min=1)

        sum_w = w.sum()
        sum_w2 = (w * w).sum()
        mean_w = sum_w / count
        var_w = token_mean((w - mean_w) ** 2, mask)
        # torch.where, not an `if`, to stay free of host syncs; the unused branch may be nan.
        cv2 = torch.where(mean_w > 0, var_w / mean_w**2, torch.zeros_like(var_w))
        alpha_ess = torch.rsqrt(1.0 + cv2)
        ess = torch.where(sum_w2 > 0, sum_w**2 / (count * sum_w2), torch.zeros_like(sum_w))

        alpha_mis = (token_mean(log_rho.abs(), mask) / delta).clamp(max=1.0)

        adv = broadcast_advantages(advantages.detach(), w)
        std_a = _masked_std(adv, mask)
        std_wa = _masked_std(w * adv, mask)
        all_one = torch.where(valid, w == 1.0, torch.ones_like(valid)).all()
        # "std(A) == 0" is decided by comparing values, not by the computed std: the std of
        # equal floats can come out as a rounding error, which would blow delta_sigma up.
        a_max = torch.where(valid, adv, torch.full_like(adv, -torch.inf)).max()
        a_min = torch.where(valid, adv, torch.full_like(adv, torch.inf)).min()
        flat = ~(a_max > a_min)
        delta_sigma = torch.where(
            flat | all_one, torch.zeros_like(std_a), std_wa / std_a - 1.0
        )
        alpha_var = ((delta_sigma - gamma) / gamma).clamp(min=0.0)

        alpha = (alpha_ess - beta * alpha_var).clamp(0.0, 1.0) * alpha_mis
        metrics = {
            "alpha": alpha,
            "alpha_ess": alpha_ess,
            "alpha_mis": alpha_mis,
            "alpha_var": alpha_var,
            "ess": ess,
            "delta_sigma": delta_sigma,
        }
    return alpha, metrics


def _masked_std(x: Tensor, mask: Tensor) -> Tensor:
    """Population std of ``x`` ``(batch, tokens)`` over the masked tokens; 0-dim."""
    mean = token_mean(x, mask)
    return token_mean((x - mean) ** 2, mask).sqrt()


def ais_weights(
    logp_train: Tensor, logp_rollout: Tensor, mask: Tensor, alpha: Tensor | float, cap: float
) -> Tensor:
    """AIS advantage weights ``w = 1 + alpha * (min(rho, cap) - 1)``.

    Args:
        logp_train: ``(batch, tokens)``, trainer log-probs.
        logp_rollout: ``(batch, tokens)``, rollout log-probs.
        mask: ``(batch, tokens)``, 0/1.
        alpha: 0-dim tensor or float in ``[0, 1]``, from :func:`ais_alpha`.
        cap: truncation ``C >= 1``.

    Returns:
        ``(batch, tokens)``, detached, 0 on masked-out tokens. ``alpha = 0`` gives exactly 1
        on every masked token, so the loss is bitwise that of plain GRPO; ``alpha = 1`` gives
        the TIS weights.
    """
    _check_cap(cap)
    with torch.no_grad():
        valid, log_rho = _log_ratio(logp_train, logp_rollout, mask)
        truncated = torch.exp(log_rho).clamp(max=cap)
        alpha_t = torch.as_tensor(alpha, dtype=truncated.dtype, device=truncated.device)
        weights = 1.0 + alpha_t * (truncated - 1.0)
        return torch.where(valid, weights, torch.zeros_like(weights))
