"""One GRPO optimizer step of one trainer worker, in micro-batches.

A worker's share of a step is ``Bp * n / num_workers`` sequences. At real scale that is too much
for one forward pass (Qwen2.5 at Bp = 128, n = 8 on 4 workers: 256 sequences of ~600 tokens), so
:func:`policy_update` splits it into micro-batches of ``trainer.micro_batch`` sequences whose
gradients accumulate into one optimizer step (DeepSpeed's gradient accumulation: the learner
steps its optimizer on the last micro-batch, :func:`isosweep.trial.learner.micro_batches`).

The step is the same whatever the micro-batch size, up to float rounding: every term of the loss
is a token mean over the worker's whole batch, so each micro-batch's loss is weighted by its share
of the batch's completion tokens; the AIS coefficient is computed from the whole batch's log-probs
(a gradient-free pass first, when there are several micro-batches); statistics are over the whole
batch. Log-probs and entropies come from the final hidden states in chunks of
``trainer.logprob_chunk`` positions (:func:`isosweep.algo.grpo.chunked_token_stats`), so no
``(sequences, tokens, vocab)`` float32 tensor exists.

Each micro-batch is cut to its longest row (rows are right-padded prompt + completion), which
changes nothing a causal model computes for the kept positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from isosweep.algo.correction import ais_alpha, ais_weights, mismatch_metrics, tis_weights
from isosweep.algo.grpo import chunked_token_stats, grpo_loss, k3_kl, token_mean
from isosweep.spec.trial import TrialConfig, entropy_coef, kl_coef


@dataclass(frozen=True)
class UpdateStats:
    """What one optimizer step measured, over the worker's whole batch (floats, for the logs)."""

    loss: float
    """The GRPO loss of the step (token mean over the worker's batch)."""
    entropy: float
    """Token-mean entropy of the tempered policy on the sampled completions, nats."""
    kl: float | None
    """Token-mean k3 KL to the reference model, or None where the reference was not run this step."""
    clip_frac: float
    """Fraction of completion tokens whose PPO ratio was clipped."""
    grad_norm: float
    """Global gradient norm before clipping (DeepSpeed's, over all workers)."""
    micro_batches: int
    """Forward/backward passes the step took."""
    mismatch: dict[str, float]
    """Trainer/rollout log-prob mismatch statistics (:func:`isosweep.algo.correction.mismatch_metrics`)."""
    ais: dict[str, float]
    """The AIS coefficient and its parts (:func:`isosweep.algo.correction.ais_alpha`)."""

    def metrics(self) -> dict[str, float]:
        """The prefixed metric names of a step record (``train/``, ``mismatch/``, ``ais/``)."""
        return {"train/loss": self.loss, "train/entropy": self.entropy,
                **({"train/kl": self.kl} if self.kl is not None else {}),
                "train/clip_frac": self.clip_frac,
                **{f"mismatch/{key}": value for key, value in self.mismatch.items()},
                **{f"ais/{key}": value for key, value in self.ais.items()}}


def micro_slices(rows: int, micro_batch: int | None) -> list[slice]:
    """The row ranges of each micro-batch of a ``rows``-sequence batch (one range when ``micro_batch`` is None).

    >>> micro_slices(5, 2)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 5, None)]
    """
    size = rows if micro_batch is None else micro_batch
    return [slice(start, min(start + size, rows)) for start in range(0, rows, max(size, 1))]


def token_stats(model, ids: Tensor, attention: Tensor, temperature: float, chunk: int) -> tuple[Tensor, Tensor]:
    """``(logp, entropy)`` of every next token, each ``(batch, tokens - 1)`` float32, under ``model``.

    ``model`` is a DeepSpeed engine or a Hugging Face causal LM. Its forward runs with no logits
    (``logits_to_keep`` empty); the decoder's last hidden state is taken by a forward hook and turned
    into log-probs chunk by chunk by the model's own output head (so a ZeRO-3 head gathers its weight).
    """
    hf = getattr(model, "module", model)
    seen: list[Tensor] = []
    hook = hf.get_decoder().register_forward_hook(lambda _m, _args, out: seen.append(out.last_hidden_state))
    try:
        model(input_ids=ids, attention_mask=attention, use_cache=False,
              logits_to_keep=torch.empty(0, dtype=torch.long, device=ids.device))
    finally:
        hook.remove()
    return chunked_token_stats(seen[-1][:, :-1], hf.get_output_embeddings(), ids[:, 1:], temperature, chunk)


def widened(batch: dict[str, Tensor], width: int) -> dict[str, Tensor]:
    """``batch`` with at least ``width`` columns: right-padded with masked-out positions (attention 0)."""
    extra = width - batch["ids"].shape[1]
    if extra <= 0:
        return batch
    return {key: torch.nn.functional.pad(value, (0, extra)) for key, value in batch.items()}


def _log_probs_of(model, batch: dict[str, Tensor], parts: list[slice], widths: list[int],
                  cfg: TrialConfig) -> Tensor:
    """``(batch, tokens - 1)`` next-token log-probs under ``model``, micro-batch by micro-batch, no gradient."""
    out = torch.zeros_like(batch["mask"])
    with torch.no_grad():
        for rows, width in zip(parts, widths):
            logp, _ = token_stats(model, batch["ids"][rows, :width], batch["attention"][rows, :width],
                                  cfg.rollout.temperature, cfg.trainer.logprob_chunk)
            out[rows, :width - 1] = logp
    return out


def policy_update(learner, reference, batch: dict[str, Tensor], advantages: Tensor, cfg: TrialConfig,
                  *, with_reference: bool = True, widths: list[int] | None = None) -> UpdateStats:
    """One optimizer step of ``learner`` on a worker's batch, in micro-batches of ``cfg.trainer.micro_batch``.

    Args:
        learner: the DeepSpeed engine (:func:`isosweep.trial.learner.make_learner`), whose gradient
            accumulation steps equal the number of micro-batches; ``backward`` and ``step`` are called once
            per micro-batch and the optimizer steps on the last.
        reference: the reference model (:func:`isosweep.trial.learner.make_reference`).
        batch: :func:`isosweep.trial.loop.pack`'s tensors on the learner's device: ``ids`` and
            ``attention`` ``(batch, tokens)``, ``mask`` and ``rollout_logp`` ``(batch, tokens - 1)``.
        advantages: ``(batch,)``, one per completion.
        cfg: the trial (temperature, clip ranges, correction, KL and entropy weights, micro-batch, chunk).
        with_reference: run the reference model (for the KL term, or as a health sample of the KL).
        widths: columns of each micro-batch (default: its longest row). Under ZeRO-3 every worker must run
            micro-batches of the same shapes (their forwards gather parameters: collectives), so workers pass
            the largest over all of them (:func:`isosweep.trial.loop.agreed_widths`).

    Returns:
        :class:`UpdateStats` over the whole batch.
    """
    algo, temperature = cfg.algorithm, cfg.rollout.temperature
    parts = micro_slices(len(batch["mask"]), cfg.trainer.micro_batch)
    widths = widths or [int(batch["attention"][rows].sum(dim=1).max()) for rows in parts]
    batch = widened(batch, max(widths))
    mask, rollout_logp = batch["mask"], batch["rollout_logp"]
    tokens = mask.sum().clamp(min=1)
    ref_logp = _log_probs_of(reference, batch, parts, widths, cfg) if with_reference else None
    learner.train()
    # AIS weighs every token by a coefficient of the whole batch, needed before the first backward: with several
    # micro-batches the batch's log-probs come from a gradient-free pass (with one, from the pass itself)
    old_logp = _log_probs_of(learner, batch, parts, widths, cfg) if algo.correction == "ais" and len(parts) > 1 \
        else None
    alpha, ais_stats = (None, None) if old_logp is None else \
        ais_alpha(old_logp, rollout_logp, advantages, mask, algo.is_cap, algo.ais_delta, algo.ais_beta, algo.ais_gamma)
    seen_logp = torch.zeros_like(mask)
    loss_sum, entropy_sum, clip_sum = (torch.zeros((), device=mask.device) for _ in range(3))
    for rows, width in zip(parts, widths):
        cut = slice(0, width - 1)
        m, r_logp = mask[rows, cut], rollout_logp[rows, cut]
        logp, entropy = token_stats(learner, batch["ids"][rows, :width], batch["attention"][rows, :width],
                                    temperature, cfg.trainer.logprob_chunk)
        old = logp.detach() if old_logp is None else old_logp[rows, cut]
        seen_logp[rows, cut] = old
        if alpha is None and algo.correction == "ais":  # one micro-batch: the whole batch
            alpha, ais_stats = ais_alpha(old, r_logp, advantages[rows], m, algo.is_cap, algo.ais_delta,
                                         algo.ais_beta, algo.ais_gamma)
        weights = {
            "none": lambda: None,
            "tis": lambda: tis_weights(old, r_logp, m, algo.is_cap)[0],
            "ais": lambda: ais_weights(old, r_logp, m, alpha, algo.is_cap),
        }[algo.correction]()
        mean_entropy = token_mean(entropy, m)
        loss, stats = grpo_loss(logp, old, advantages[rows], m, algo.clip_low, algo.clip_high, kl_coef=kl_coef(cfg),
                                ref_logp=None if ref_logp is None else ref_logp[rows, cut],
                                entropy_coef=entropy_coef(cfg), entropy=mean_entropy, weights=weights)
        share = m.sum() / tokens  # every term is a token mean over the whole batch
        learner.backward(loss * share, scale_wrt_gas=False)
        learner.step()
        loss_sum += loss.detach() * share
        entropy_sum += mean_entropy.detach() * share
        clip_sum += stats["clip_frac"] * share
    if ais_stats is None:  # measured as a health signal whatever the correction: once, over the whole batch
        _, ais_stats = ais_alpha(seen_logp, rollout_logp, advantages, mask, algo.is_cap, algo.ais_delta,
                                 algo.ais_beta, algo.ais_gamma)
    return UpdateStats(
        loss=float(loss_sum), entropy=float(entropy_sum),
        kl=None if ref_logp is None else float(k3_kl(seen_logp, ref_logp, mask)),
        clip_frac=float(clip_sum), grad_norm=float(learner.get_global_grad_norm() or 0.0), micro_batches=len(parts),
        mismatch={key: float(value) for key, value in mismatch_metrics(seen_logp, rollout_logp, mask).items()},
        ais={key: float(value) for key, value in ais_stats.items()},
    )
