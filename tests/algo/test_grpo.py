"""Tests for isosweep.algo.grpo: loop references, properties over seeds, exact hand cases.

Every torch test runs in float32 and float64.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from isosweep.algo.grpo import (
    broadcast_advantages,
    chunked_token_stats,
    entropy_from_logits,
    group_advantages,
    grpo_loss,
    k3_kl,
    ppo_clip_loss,
    token_logprobs,
    token_mean,
)

DTYPES = [torch.float32, torch.float64]
SEEDS = range(40)


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}


def random_batch(seed: int, dtype: torch.dtype, per_token_adv: bool = False) -> dict[str, torch.Tensor]:
    """A random (batch, tokens) policy-gradient batch; some rows may be fully masked."""
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 7, (1,), generator=gen))
    tokens = int(torch.randint(1, 9, (1,), generator=gen))
    old_logp = -3.0 * torch.rand(batch, tokens, generator=gen, dtype=dtype)
    logp = old_logp + 0.4 * torch.randn(batch, tokens, generator=gen, dtype=dtype)
    mask = torch.rand(batch, tokens, generator=gen) < 0.7
    adv_shape = (batch, tokens) if per_token_adv else (batch,)
    advantages = torch.randn(*adv_shape, generator=gen, dtype=dtype)
    weights = 2.0 * torch.rand(batch, tokens, generator=gen, dtype=dtype)
    ref_logp = old_logp + 0.3 * torch.randn(batch, tokens, generator=gen, dtype=dtype)
    return {
        "logp": logp,
        "old_logp": old_logp,
        "mask": mask,
        "advantages": advantages,
        "weights": weights,
        "ref_logp": ref_logp,
    }


# ---------------------------------------------------------------------------------------------
# group_advantages


def loop_group_advantages(rewards: torch.Tensor, scale_by_std: bool, eps: float) -> list[list[float]]:
    out = []
    for row in rewards.tolist():
        n = len(row)
        mean = sum(row) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in row) / n)
        if all(r == row[0] for r in row):
            out.append([0.0] * n)
        elif scale_by_std:
            out.append([(r - mean) / (std + eps) for r in row])
        else:
            out.append([r - mean for r in row])
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale_by_std", [True, False])
def test_group_advantages_matches_loop(dtype: torch.dtype, scale_by_std: bool) -> None:
    for seed in SEEDS:
        gen = torch.Generator().manual_seed(seed)
        groups = int(torch.randint(1, 9, (1,), generator=gen))
        n = int(torch.randint(1, 11, (1,), generator=gen))
        if seed % 2:
            rewards = torch.randint(0, 2, (groups, n), generator=gen).to(dtype)
        else:
            rewards = torch.randn(groups, n, generator=gen, dtype=dtype)
        adv, _ = group_advantages(rewards, scale_by_std=scale_by_std)
        expected = torch.tensor(loop_group_advantages(rewards, scale_by_std, 1e-6), dtype=dtype)
        assert adv.shape == (groups, n) and adv.dtype == dtype
        torch.testing.assert_close(adv, expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_advantages_hand_case(dtype: torch.dtype) -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]], dtype=dtype)
    adv, metrics = group_advantages(rewards, eps=0.0)
    # Population std of [1, 0, 0, 0] is sqrt(3)/4.
    expected_first = torch.tensor([3.0, -1.0, -1.0, -1.0], dtype=dtype) / 4.0 / (math.sqrt(3.0) / 4.0)
    torch.testing.assert_close(adv[0], expected_first, **tol(dtype))
    assert torch.equal(adv[1:], torch.zeros(2, 4, dtype=dtype))
    torch.testing.assert_close(metrics["frac_zero_std"], torch.tensor(2.0 / 3.0, dtype=dtype))
    torch.testing.assert_close(metrics["reward_mean"], torch.tensor(5.0 / 12.0, dtype=dtype))
    assert metrics["frac_zero_std"].dim() == 0 and not metrics["frac_zero_std"].requires_grad


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_equal_groups_get_exact_zero_even_for_awkward_floats(dtype: torch.dtype) -> None:
    # mean([0.1] * 3) is not exactly 0.1 in floating point; the advantage must still be 0.
    rewards = torch.full((2, 3), 0.1, dtype=dtype)
    for scale in (True, False):
        adv, metrics = group_advantages(rewards, scale_by_std=scale, eps=0.0)
        assert torch.equal(adv, torch.zeros_like(adv))
        assert metrics["frac_zero_std"] == 1.0


rewards_strategy = st.tuples(
    st.integers(1, 6), st.integers(2, 8), st.integers(0, 2**31 - 1), st.sampled_from(DTYPES)
)


@settings(max_examples=60, deadline=None)
@given(rewards_strategy, st.floats(-50.0, 50.0), st.floats(0.1, 20.0))
def test_group_advantage_invariances(case, shift: float, scale: float) -> None:
    groups, n, seed, dtype = case
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 3, (groups, n), generator=gen).to(dtype) * 0.5
    close = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-9}
    for scale_by_std in (True, False):
        adv, _ = group_advantages(rewards, scale_by_std=scale_by_std, eps=0.0)
        # Sums to ~0 within each group.
        torch.testing.assert_close(adv.sum(dim=-1), torch.zeros(groups, dtype=dtype), **close)
        # A constant added to every reward changes nothing.
        shifted, _ = group_advantages(rewards + shift, scale_by_std=scale_by_std, eps=0.0)
        torch.testing.assert_close(shifted, adv, **close)
    # A positive scale changes nothing once the std is divided out.
    adv, _ = group_advantages(rewards, eps=0.0)
    scaled, _ = group_advantages(rewards * scale, eps=0.0)
    torch.testing.assert_close(scaled, adv, **close)


def test_group_advantages_rejects_wrong_rank() -> None:
    with pytest.raises(ValueError, match="groups, n"):
        group_advantages(torch.zeros(4))


# ---------------------------------------------------------------------------------------------
# token_mean


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_mean_matches_loop_and_ignores_padding(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        b = random_batch(seed, dtype)
        x, mask = b["logp"].clone(), b["mask"]
        x[~mask] = float("inf")  # padding garbage must not leak in
        total, count = 0.0, 0
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                if mask[i, j]:
                    total += float(x[i, j])
                    count += 1
        expected = total / max(count, 1)
        torch.testing.assert_close(token_mean(x, mask), torch.tensor(expected, dtype=dtype), **tol(dtype))
        torch.testing.assert_close(token_mean(x, mask.to(dtype)), token_mean(x, mask))


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_mean_of_empty_mask_is_zero(dtype: torch.dtype) -> None:
    x = torch.randn(3, 4, dtype=dtype)
    assert torch.equal(token_mean(x, torch.zeros(3, 4, dtype=torch.bool)), torch.tensor(0.0, dtype=dtype))


# ---------------------------------------------------------------------------------------------
# ppo_clip_loss


def loop_ppo(
    b: dict[str, torch.Tensor], clip_low: float, clip_high: float, use_weights: bool
) -> dict[str, float]:
    logp, old, mask, adv = b["logp"], b["old_logp"], b["mask"], b["advantages"]
    objective = clipped = ratio_sum = kl_sum = 0.0
    count = 0
    for i in range(logp.shape[0]):
        for j in range(logp.shape[1]):
            if not mask[i, j]:
                continue
            a = float(adv[i]) if adv.dim() == 1 else float(adv[i, j])
            if use_weights:
                a *= float(b["weights"][i, j])
            ratio = math.exp(float(logp[i, j]) - float(old[i, j]))
            clipped_ratio = min(max(ratio, 1.0 - clip_low), 1.0 + clip_high)
            objective += min(ratio * a, clipped_ratio * a)
            clipped += float(clipped_ratio * a < ratio * a)
            ratio_sum += ratio
            kl_sum += float(old[i, j]) - float(logp[i, j])
            count += 1
    count = max(count, 1)
    return {
        "loss": -objective / count,
        "clip_frac": clipped / count,
        "ratio_mean": ratio_sum / count,
        "approx_kl": kl_sum / count,
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("use_weights", [False, True])
def test_ppo_clip_loss_matches_loop(dtype: torch.dtype, per_token_adv: bool, use_weights: bool) -> None:
    for seed in SEEDS:
        b = random_batch(seed, dtype, per_token_adv)
        clip_low, clip_high = (0.2, 0.28) if seed % 2 else (0.1, 0.1)
        loss, metrics = ppo_clip_loss(
            b["logp"], b["old_logp"], b["advantages"], b["mask"], clip_low, clip_high,
            weights=b["weights"] if use_weights else None,
        )
        expected = loop_ppo(b, clip_low, clip_high, use_weights)
        assert loss.dim() == 0 and loss.dtype == dtype
        torch.testing.assert_close(loss, torch.tensor(expected["loss"], dtype=dtype), **tol(dtype))
        for key in ("clip_frac", "ratio_mean", "approx_kl"):
            assert metrics[key].dim() == 0 and not metrics[key].requires_grad
            torch.testing.assert_close(metrics[key], torch.tensor(expected[key], dtype=dtype), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_weights_multiply_the_advantage(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        b = random_batch(seed, dtype)
        args = (b["logp"], b["old_logp"])
        weighted, _ = ppo_clip_loss(*args, b["advantages"], b["mask"], 0.2, 0.3, b["weights"])
        folded = b["weights"] * b["advantages"].unsqueeze(-1)
        plain, _ = ppo_clip_loss(*args, folded, b["mask"], 0.2, 0.3)
        torch.testing.assert_close(weighted, plain, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_tokens_get_exactly_zero_gradient(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        b = random_batch(seed, dtype, per_token_adv=bool(seed % 2))
        logp = b["logp"].clone()
        logp[~b["mask"]] = [-1e4, -math.inf, math.nan][seed % 3]  # padding holds garbage
        logp.requires_grad_(True)
        loss, _ = grpo_loss(
            logp, b["old_logp"], b["advantages"], b["mask"], 0.2, 0.28,
            kl_coef=0.1, ref_logp=b["ref_logp"], weights=b["weights"],
        )
        loss.backward()
        assert torch.equal(logp.grad[~b["mask"]], torch.zeros_like(logp.grad[~b["mask"]]))
        assert torch.isfinite(logp.grad).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_unclipped_gradient_is_minus_advantage_times_ratio_over_tokens(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        b = random_batch(seed, dtype)
        gen = torch.Generator().manual_seed(seed)
        # |log ratio| < 0.05 keeps every ratio inside a 0.2 clip range.
        logp = (b["old_logp"] + 0.05 * (2 * torch.rand(b["old_logp"].shape, generator=gen, dtype=dtype) - 1))
        logp.requires_grad_(True)
        loss, metrics = ppo_clip_loss(logp, b["old_logp"], b["advantages"], b["mask"], 0.2, 0.2)
        loss.backward()
        n_tokens = max(int(b["mask"].sum()), 1)
        ratio = torch.exp(logp.detach() - b["old_logp"])
        expected = -b["advantages"].unsqueeze(-1) * ratio / n_tokens * b["mask"]
        torch.testing.assert_close(logp.grad, expected, **tol(dtype))
        assert metrics["clip_frac"] == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_asymmetric_clip_ranges(dtype: torch.dtype) -> None:
    # Four tokens: (ratio, advantage) = (1.25, +1), (0.75, -1), (0.5, +1), (1.5, -1).
    ratio = torch.tensor([[1.25, 0.75, 0.5, 1.5]], dtype=dtype)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]], dtype=dtype)
    mask = torch.ones(1, 4, dtype=torch.bool)
    old = torch.zeros(1, 4, dtype=dtype)

    def grad_and_frac(clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
        logp = torch.log(ratio).requires_grad_(True)
        loss, metrics = ppo_clip_loss(logp, old, adv, mask, clip_low, clip_high)
        loss.backward()
        return logp.grad[0], metrics["clip_frac"]

    # clip_high 0.2 clips the positive-advantage token at ratio 1.25; clip_low 0.2 clips the
    # negative-advantage token at ratio 0.75.
    grad, frac = grad_and_frac(0.2, 0.2)
    assert grad[0] == 0.0 and grad[1] == 0.0
    assert frac == 0.5
    # Raising clip_high to 0.28 frees the first token only (DAPO's clip-higher).
    grad, frac = grad_and_frac(0.2, 0.28)
    assert grad[0] != 0.0 and grad[1] == 0.0
    assert frac == 0.25
    # Raising clip_low to 0.3 frees the second token only.
    grad, frac = grad_and_frac(0.3, 0.2)
    assert grad[0] == 0.0 and grad[1] != 0.0
    assert frac == 0.25
    # The pessimistic min never clips a ratio moving against the advantage, whatever the ranges.
    for clip_low, clip_high in ((0.2, 0.2), (0.01, 0.01), (0.3, 0.28)):
        grad, _ = grad_and_frac(clip_low, clip_high)
        torch.testing.assert_close(grad[2:], -adv[0, 2:] * ratio[0, 2:] / 4, **tol(dtype))


def test_broadcast_advantages_shapes() -> None:
    like = torch.zeros(3, 5, dtype=torch.float64)
    per_seq = broadcast_advantages(torch.tensor([1.0, 2.0, 3.0]), like)
    assert per_seq.shape == (3, 5) and per_seq.dtype == torch.float64
    assert torch.equal(per_seq[:, 4], torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    per_tok = torch.randn(3, 5, dtype=torch.float64)
    assert torch.equal(broadcast_advantages(per_tok, like), per_tok)


# ---------------------------------------------------------------------------------------------
# k3_kl, entropy, token log-probs


@pytest.mark.parametrize("dtype", DTYPES)
def test_k3_matches_loop_and_is_non_negative(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        b = random_batch(seed, dtype)
        gen = torch.Generator().manual_seed(seed)
        scale = [1e-6, 1e-3, 0.3, 3.0][seed % 4]
        ref = b["logp"] + scale * torch.randn(b["logp"].shape, generator=gen, dtype=dtype)
        kl = k3_kl(b["logp"], ref, b["mask"])
        values = [
            math.exp(float(ref[i, j] - b["logp"][i, j])) - float(ref[i, j] - b["logp"][i, j]) - 1.0
            for i in range(ref.shape[0])
            for j in range(ref.shape[1])
            if b["mask"][i, j]
        ]
        expected = sum(values) / max(len(values), 1)
        torch.testing.assert_close(kl, torch.tensor(expected, dtype=dtype), rtol=1e-4, atol=1e-6)
        assert kl >= 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_k3_per_token_never_negative_for_tiny_differences(dtype: torch.dtype) -> None:
    logp = torch.linspace(-5.0, 0.0, 1001, dtype=dtype).unsqueeze(0)
    mask = torch.ones_like(logp, dtype=torch.bool)
    for eps in (1e-12, 1e-9, 1e-7, -1e-7, -1e-9):
        ref = logp + eps
        for t in range(0, 1001, 50):
            assert k3_kl(logp[:, t : t + 1], ref[:, t : t + 1], mask[:, t : t + 1]) >= 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_k3_is_exactly_zero_for_equal_policies(dtype: torch.dtype) -> None:
    b = random_batch(3, dtype)
    assert torch.equal(k3_kl(b["logp"], b["logp"].clone(), b["mask"]), torch.tensor(0.0, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_entropy_matches_loop(dtype: torch.dtype) -> None:
    for seed in range(15):
        gen = torch.Generator().manual_seed(seed)
        batch, tokens, vocab = 2, 3, int(torch.randint(2, 12, (1,), generator=gen))
        logits = 3.0 * torch.randn(batch, tokens, vocab, generator=gen, dtype=dtype)
        mask = torch.rand(batch, tokens, generator=gen) < 0.7
        values = []
        for i in range(batch):
            for j in range(tokens):
                if mask[i, j]:
                    row = logits[i, j].tolist()
                    z = sum(math.exp(v) for v in row)
                    values.append(-sum(math.exp(v) / z * (v - math.log(z)) for v in row))
        expected = sum(values) / max(len(values), 1)
        expected_t = torch.tensor(expected, dtype=dtype)
        torch.testing.assert_close(entropy_from_logits(logits, mask), expected_t, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_entropy_of_uniform_is_log_vocab(dtype: torch.dtype) -> None:
    logits = torch.zeros(2, 3, 17, dtype=dtype)
    mask = torch.ones(2, 3, dtype=torch.bool)
    torch.testing.assert_close(entropy_from_logits(logits, mask), torch.tensor(math.log(17), dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_token_logprobs_matches_loop(dtype: torch.dtype) -> None:
    for seed in range(15):
        gen = torch.Generator().manual_seed(seed)
        batch, tokens, vocab = 2, 4, 9
        temperature = [1.0, 0.7, 1.3][seed % 3]
        logits = 4.0 * torch.randn(batch, tokens, vocab, generator=gen, dtype=dtype)
        ids = torch.randint(0, vocab, (batch, tokens), generator=gen)
        out = token_logprobs(logits, ids, temperature)
        assert out.shape == (batch, tokens) and out.dtype == dtype
        for i in range(batch):
            for j in range(tokens):
                row = [v / temperature for v in logits[i, j].tolist()]
                log_z = math.log(sum(math.exp(v) for v in row))
                expected = row[int(ids[i, j])] - log_z
                torch.testing.assert_close(out[i, j], torch.tensor(expected, dtype=dtype), **tol(dtype))


def test_token_logprobs_rejects_non_positive_temperature() -> None:
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long), 0.0)


# ---------------------------------------------------------------------------------------------
# grpo_loss


@pytest.mark.parametrize("dtype", DTYPES)
def test_grpo_loss_combines_terms(dtype: torch.dtype) -> None:
    for seed in range(20):
        b = random_batch(seed, dtype)
        entropy = torch.tensor(1.7, dtype=dtype)
        loss, metrics = grpo_loss(
            b["logp"], b["old_logp"], b["advantages"], b["mask"], 0.2, 0.28,
            kl_coef=0.05, ref_logp=b["ref_logp"], entropy_coef=0.01, entropy=entropy,
        )
        policy, _ = ppo_clip_loss(b["logp"], b["old_logp"], b["advantages"], b["mask"], 0.2, 0.28)
        kl = k3_kl(b["logp"], b["ref_logp"], b["mask"])
        torch.testing.assert_close(loss, policy + 0.05 * kl - 0.01 * entropy, **tol(dtype))
        assert torch.equal(metrics["loss/policy"], policy)
        assert torch.equal(metrics["loss/kl"], kl)
        assert torch.equal(metrics["loss/entropy"], entropy)
        assert torch.equal(metrics["loss/total"], loss.detach())
        assert {"clip_frac", "ratio_mean", "approx_kl"} <= metrics.keys()
        assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


@pytest.mark.parametrize("dtype", DTYPES)
def test_grpo_loss_with_zero_coefficients_is_exactly_the_policy_loss(dtype: torch.dtype) -> None:
    b = random_batch(7, dtype)
    policy, _ = ppo_clip_loss(b["logp"], b["old_logp"], b["advantages"], b["mask"], 0.2, 0.28)
    loss, metrics = grpo_loss(
        b["logp"], b["old_logp"], b["advantages"], b["mask"], 0.2, 0.28,
        ref_logp=b["ref_logp"], entropy=torch.tensor(float("inf"), dtype=dtype),
    )
    assert torch.equal(loss, policy)
    assert "loss/kl" in metrics and "loss/entropy" in metrics
    bare, bare_metrics = grpo_loss(b["logp"], b["old_logp"], b["advantages"], b["mask"], 0.2, 0.28)
    assert torch.equal(bare, policy)
    assert "loss/kl" not in bare_metrics and "loss/entropy" not in bare_metrics


def test_grpo_loss_requires_inputs_for_non_zero_coefficients() -> None:
    b = random_batch(0, torch.float64)
    args = (b["logp"], b["old_logp"], b["advantages"], b["mask"], 0.2, 0.2)
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(*args, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy"):
        grpo_loss(*args, entropy_coef=0.1)


# ---------------------------------------------------------------- chunked log-probs and entropy


def _chunked_case(dtype: torch.dtype, seed: int, batch: int = 3, tokens: int = 7, width: int = 5, vocab: int = 11):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, tokens, width, generator=g, dtype=dtype, requires_grad=True)
    head = torch.nn.Linear(width, vocab, bias=False).to(dtype)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, width, generator=g, dtype=dtype))
    ids = torch.randint(0, vocab, (batch, tokens), generator=g)
    return hidden, head, ids


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunk", [1, 2, 5, 21, 1000])
@pytest.mark.parametrize("seed", range(3))
def test_chunked_token_stats_equal_the_whole_logits_computation(dtype: torch.dtype, chunk: int, seed: int) -> None:
    """Values and gradients (to the hidden states and the head) as from the whole logits, for any chunk."""
    temperature = 0.7
    hidden, head, ids = _chunked_case(dtype, seed)
    logp, entropy = chunked_token_stats(hidden, head, ids, temperature, chunk)
    assert logp.shape == entropy.shape == ids.shape and logp.dtype == entropy.dtype == torch.float32
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(seed + 10))
    (logp * weights).sum().add((entropy * weights.flip(0)).sum()).backward()
    grads = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    logits = head(hidden).float()
    whole_logp = token_logprobs(logits, ids, temperature)
    scaled = logits / temperature
    whole_entropy = torch.logsumexp(scaled, -1) - (torch.softmax(scaled, -1) * scaled).sum(-1)  # per token
    ones = torch.ones_like(ids, dtype=torch.float32)
    assert float(entropy_from_logits(scaled, ones)) == pytest.approx(float(whole_entropy.mean()), rel=1e-5)
    (whole_logp * weights).sum().add((whole_entropy * weights.flip(0)).sum()).backward()
    close = {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(logp, whole_logp, **close)
    torch.testing.assert_close(entropy, whole_entropy, **close)
    torch.testing.assert_close(grads[0], hidden.grad, **close)
    torch.testing.assert_close(grads[1], head.weight.grad, **close)


def test_chunked_token_stats_match_a_slow_loop() -> None:
    hidden, head, ids = _chunked_case(torch.float64, seed=4)
    logp, entropy = chunked_token_stats(hidden.detach(), head, ids, 1.3, chunk=4)
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            row = [float(x) / 1.3 for x in head(hidden[b, t].detach())]
            z = math.log(sum(math.exp(x) for x in row))
            probs = [math.exp(x - z) for x in row]
            assert float(logp[b, t]) == pytest.approx(row[int(ids[b, t])] - z, abs=1e-5)
            assert float(entropy[b, t]) == pytest.approx(-sum(p * math.log(p) for p in probs), abs=1e-5)


def test_chunked_token_stats_call_the_head_once_per_chunk_forward_and_again_per_chunk_in_backward() -> None:
    """Each chunk's logits are recomputed in the backward pass, not kept: the head runs twice per chunk."""
    hidden, head, ids = _chunked_case(torch.float32, seed=1, batch=2, tokens=5)
    calls = []
    head.register_forward_hook(lambda _m, args, _out: calls.append(args[0].shape[0]))
    logp, entropy = chunked_token_stats(hidden, head, ids, 1.0, chunk=4)
    assert calls == [4, 4, 2]
    (logp.sum() + entropy.sum()).backward()
    assert sorted(calls) == sorted([4, 4, 2] * 2)
    with torch.no_grad():
        calls.clear()
        chunked_token_stats(hidden, head, ids, 1.0, chunk=4)
    assert calls == [4, 4, 2]


def test_chunked_token_stats_reject_bad_arguments() -> None:
    hidden, head, ids = _chunked_case(torch.float32, seed=0)
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_stats(hidden, head, ids, 0.0, 4)
    with pytest.raises(ValueError, match="chunk"):
        chunked_token_stats(hidden, head, ids, 1.0, 0)
