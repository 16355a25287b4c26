"""Tests for isosweep.algo.correction: TIS/AIS weights, alpha, mismatch metrics.

Loop references over seeds and shapes, properties (alpha in [0, 1], alpha = 0 is plain GRPO
bitwise, identical policies switch the correction off), exact hand cases; float32 and float64.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from isosweep.algo.correction import (
    ais_alpha,
    ais_weights,
    mismatch_metrics,
    tis_weights,
)
from isosweep.algo.grpo import grpo_loss

DTYPES = [torch.float32, torch.float64]
SEEDS = range(40)


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-10}


def random_mismatch(seed: int, dtype: torch.dtype, per_token_adv: bool = False) -> dict[str, torch.Tensor]:
    """Trainer/rollout log-probs with a mismatch scale drawn from 1e-4 to 2 nats."""
    gen = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 7, (1,), generator=gen))
    tokens = int(torch.randint(1, 9, (1,), generator=gen))
    scale = [1e-4, 1e-2, 0.2, 2.0][seed % 4]
    logp_rollout = -4.0 * torch.rand(batch, tokens, generator=gen, dtype=dtype)
    logp_train = logp_rollout + scale * torch.randn(batch, tokens, generator=gen, dtype=dtype)
    mask = torch.rand(batch, tokens, generator=gen) < 0.75
    adv_shape = (batch, tokens) if per_token_adv else (batch,)
    return {
        "logp_train": logp_train,
        "logp_rollout": logp_rollout,
        "mask": mask,
        "advantages": torch.randn(*adv_shape, generator=gen, dtype=dtype),
        "old_logp": logp_train + 0.1 * torch.randn(batch, tokens, generator=gen, dtype=dtype),
    }


def valid_tokens(b: dict[str, torch.Tensor]) -> list[tuple[int, int]]:
    mask = b["mask"]
    return [(i, j) for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]]


def pop_std(xs: list[float]) -> float:
    mean = sum(xs) / len(xs)
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))


def loop_ais(
    b: dict[str, torch.Tensor], cap: float, delta: float, beta: float, gamma: float
) -> dict[str, float]:
    """AIS alpha written out from its definition (isosweep.algo.correction), one token at a time."""
    cells = valid_tokens(b)
    if not cells:
        keys = ("alpha", "alpha_ess", "alpha_mis", "alpha_var", "ess", "delta_sigma")
        return dict(zip(keys, (0.0, 1.0, 0.0, 0.0, 0.0, 0.0)))
    diffs = [float(b["logp_train"][c]) - float(b["logp_rollout"][c]) for c in cells]
    w = [min(math.exp(d), cap) for d in diffs]
    adv = b["advantages"]
    a = [float(adv[i]) if adv.dim() == 1 else float(adv[i, j]) for i, j in cells]
    n = len(w)
    mean_w = sum(w) / n
    var_w = sum((x - mean_w) ** 2 for x in w) / n
    alpha_ess = (1.0 + var_w / mean_w**2) ** -0.5
    ess = sum(w) ** 2 / (n * sum(x * x for x in w))
    alpha_mis = min(1.0, sum(abs(d) for d in diffs) / n / delta)
    std_a = pop_std(a)
    if max(a) == min(a) or all(x == 1.0 for x in w):
        delta_sigma = 0.0
    else:
        delta_sigma = pop_std([x * y for x, y in zip(w, a)]) / std_a - 1.0
    alpha_var = max(0.0, (delta_sigma - gamma) / gamma)
    alpha = min(1.0, max(0.0, alpha_ess - beta * alpha_var)) * alpha_mis
    return {
        "alpha": alpha,
        "alpha_ess": alpha_ess,
        "alpha_mis": alpha_mis,
        "alpha_var": alpha_var,
        "ess": ess,
        "delta_sigma": delta_sigma,
    }


# ---------------------------------------------------------------------------------------------
# TIS and mismatch metrics


@pytest.mark.parametrize("dtype", DTYPES)
def test_tis_weights_match_loop_and_are_capped(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        b = random_mismatch(seed, dtype)
        cap = [1.0, 1.5, 2.0, 10.0][seed % 4]
        logp_train = b["logp_train"].clone().requires_grad_(True)
        weights, metrics = tis_weights(logp_train, b["logp_rollout"], b["mask"], cap)
        assert weights.shape == b["mask"].shape and weights.dtype == dtype
        assert not weights.requires_grad
        expected = torch.zeros_like(weights)
        capped = 0
        for i, j in valid_tokens(b):
            rho = math.exp(float(b["logp_train"][i, j]) - float(b["logp_rollout"][i, j]))
            expected[i, j] = min(rho, cap)
            capped += rho > cap
        torch.testing.assert_close(weights, expected, **tol(dtype))
        assert (weights <= cap).all()
        assert torch.equal(weights[~b["mask"]], torch.zeros_like(weights[~b["mask"]]))
        n = max(len(valid_tokens(b)), 1)
        expected_frac = torch.tensor(capped / n, dtype=dtype)
        torch.testing.assert_close(metrics["capped_frac"], expected_frac, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_tis_weights_survive_extreme_ratios_and_padding(dtype: torch.dtype) -> None:
    logp_train = torch.tensor([[0.0, -800.0, 50.0, math.nan]], dtype=dtype)
    logp_rollout = torch.tensor([[-500.0, 0.0, 0.0, -math.inf]], dtype=dtype)
    mask = torch.tensor([[True, True, True, False]])
    weights, _ = tis_weights(logp_train, logp_rollout, mask, cap=2.0)
    assert torch.equal(weights, torch.tensor([[2.0, 0.0, 2.0, 0.0]], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mismatch_metrics_match_loop(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        b = random_mismatch(seed, dtype)
        metrics = mismatch_metrics(b["logp_train"], b["logp_rollout"], b["mask"])
        diffs = [float(b["logp_train"][c]) - float(b["logp_rollout"][c]) for c in valid_tokens(b)]
        n = max(len(diffs), 1)
        expected = {
            "logp_abs_diff_mean": sum(abs(d) for d in diffs) / n,
            "ratio_max": max((math.exp(d) for d in diffs), default=0.0),
            # k3 of KL(rollout || train) from rollout samples: rho - 1 - log rho.
            "kl": sum(math.exp(d) - 1.0 - d for d in diffs) / n,
        }
        for key, value in expected.items():
            assert metrics[key].dim() == 0 and not metrics[key].requires_grad
            torch.testing.assert_close(metrics[key], torch.tensor(value, dtype=dtype), rtol=1e-4, atol=1e-6)
        assert metrics["kl"] >= 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_mismatch_metrics_of_identical_policies(dtype: torch.dtype) -> None:
    b = random_mismatch(2, dtype)
    metrics = mismatch_metrics(b["logp_rollout"], b["logp_rollout"].clone(), b["mask"])
    assert metrics["logp_abs_diff_mean"] == 0.0 and metrics["kl"] == 0.0
    assert metrics["ratio_max"] == (1.0 if b["mask"].any() else 0.0)


# ---------------------------------------------------------------------------------------------
# AIS alpha


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_ais_alpha_matches_loop(dtype: torch.dtype, per_token_adv: bool) -> None:
    for seed in SEEDS:
        b = random_mismatch(seed, dtype, per_token_adv)
        settings_ = [(2.0, 0.05, 1.0, 0.1), (5.0, 0.5, 0.5, 0.3), (1.5, 0.01, 2.0, 0.05)]
        cap, delta, beta, gamma = settings_[seed % 3]
        alpha, metrics = ais_alpha(
            b["logp_train"], b["logp_rollout"], b["advantages"], b["mask"], cap, delta, beta, gamma
        )
        expected = loop_ais(b, cap, delta, beta, gamma)
        assert alpha.dim() == 0 and alpha.dtype == dtype and torch.equal(alpha, metrics["alpha"])
        for key, value in expected.items():
            assert not metrics[key].requires_grad
            torch.testing.assert_close(metrics[key], torch.tensor(value, dtype=dtype), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ais_alpha_hand_case(dtype: torch.dtype) -> None:
    # Two tokens with rho = (2, 1), advantages (+1, -1): mean w 1.5, var 0.25, CV^2 = 1/9;
    # std(w A) = std(2, -1) = 1.5 against std(A) = 1, so delta_sigma = 0.5.
    logp_train = torch.tensor([[math.log(2.0), 0.0]], dtype=dtype)
    logp_rollout = torch.zeros(1, 2, dtype=dtype)
    advantages = torch.tensor([[1.0, -1.0]], dtype=dtype)
    mask = torch.ones(1, 2, dtype=torch.bool)
    _, m = ais_alpha(
        logp_train, logp_rollout, advantages, mask, cap=4.0, delta=1.0, beta=0.1, gamma=0.25
    )
    alpha_ess = (10.0 / 9.0) ** -0.5
    alpha_mis = math.log(2.0) / 2.0
    alpha_var = (0.5 - 0.25) / 0.25
    for key, value in {
        "alpha_ess": alpha_ess,
        "ess": 0.9,
        "alpha_mis": alpha_mis,
        "delta_sigma": 0.5,
        "alpha_var": alpha_var,
        "alpha": (alpha_ess - 0.1 * alpha_var) * alpha_mis,
    }.items():
        torch.testing.assert_close(m[key], torch.tensor(value, dtype=dtype), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_identical_policies_switch_ais_off_exactly(dtype: torch.dtype) -> None:
    for seed in range(10):
        b = random_mismatch(seed, dtype)
        b["mask"][0, 0] = True  # at least one token
        alpha, m = ais_alpha(
            b["logp_rollout"], b["logp_rollout"].clone(), b["advantages"], b["mask"], 2.0, 0.1, 1.0, 0.1
        )
        assert alpha == 0.0 and m["alpha_mis"] == 0.0 and m["delta_sigma"] == 0.0
        assert m["alpha_ess"] == 1.0 and m["ess"] == 1.0 and m["alpha_var"] == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_delta_sigma_is_exactly_zero_when_every_weight_is_one(dtype: torch.dtype) -> None:
    # The log-probs differ (so alpha_mis > 0) but by far less than exp can resolve.
    logp_rollout = torch.zeros(3, 4, dtype=dtype)
    logp_train = torch.full((3, 4), 1e-30, dtype=dtype)
    advantages = torch.tensor([1.0, -0.5, 2.0], dtype=dtype)
    mask = torch.ones(3, 4, dtype=torch.bool)
    alpha, m = ais_alpha(logp_train, logp_rollout, advantages, mask, 2.0, 0.1, 1.0, 0.1)
    assert m["alpha_mis"] > 0.0
    assert m["delta_sigma"] == 0.0 and m["alpha_var"] == 0.0 and m["alpha_ess"] == 1.0
    torch.testing.assert_close(alpha, m["alpha_mis"])


@pytest.mark.parametrize("dtype", DTYPES)
def test_delta_sigma_is_zero_for_constant_advantages(dtype: torch.dtype) -> None:
    b = random_mismatch(1, dtype)
    for value in (0.0, 1.5):
        advantages = torch.full_like(b["advantages"], value)
        alpha, m = ais_alpha(b["logp_train"], b["logp_rollout"], advantages, b["mask"], 2.0, 0.1, 1.0, 0.1)
        assert m["delta_sigma"] == 0.0
        assert torch.isfinite(alpha)
    # Equal advantages whose computed std is a rounding error away from 0 (the mean of seven
    # 0.1s is not 0.1): delta_sigma must not become 1e16.
    logp_rollout = torch.zeros(1, 7, dtype=dtype)
    logp_train = torch.linspace(-0.5, 0.5, 7, dtype=dtype).unsqueeze(0)
    advantages = torch.full((1, 7), 0.1, dtype=dtype)
    mask = torch.ones(1, 7, dtype=torch.bool)
    _, m = ais_alpha(logp_train, logp_rollout, advantages, mask, 2.0, 0.1, 1.0, 0.1)
    assert m["delta_sigma"] == 0.0 and m["alpha_var"] == 0.0


@pytest.mark.parametrize("dtype", DTYPES)
def test_ais_alpha_of_an_empty_mask_is_zero(dtype: torch.dtype) -> None:
    b = random_mismatch(5, dtype)
    alpha, m = ais_alpha(
        b["logp_train"], b["logp_rollout"], b["advantages"], torch.zeros_like(b["mask"]), 2.0, 0.1, 1.0, 0.1
    )
    assert alpha == 0.0
    assert all(torch.isfinite(v) for v in m.values())


@settings(max_examples=80, deadline=None)
@given(
    st.integers(0, 2**31 - 1),
    st.sampled_from(DTYPES),
    st.floats(1e-6, 5.0),  # mismatch scale in nats
    st.floats(1.0, 20.0),  # cap
    st.floats(1e-3, 2.0),  # delta
    st.floats(0.0, 5.0),  # beta
    st.floats(1e-3, 2.0),  # gamma
)
def test_alpha_lies_in_unit_interval(seed, dtype, scale, cap, delta, beta, gamma) -> None:
    gen = torch.Generator().manual_seed(seed)
    logp_rollout = -5.0 * torch.rand(4, 6, generator=gen, dtype=dtype)
    logp_train = logp_rollout + scale * torch.randn(4, 6, generator=gen, dtype=dtype)
    advantages = torch.randn(4, generator=gen, dtype=dtype)
    mask = torch.rand(4, 6, generator=gen) < 0.8
    alpha, m = ais_alpha(logp_train, logp_rollout, advantages, mask, cap, delta, beta, gamma)
    assert 0.0 <= alpha <= 1.0
    assert 0.0 < m["alpha_ess"] <= 1.0 and 0.0 <= m["alpha_mis"] <= 1.0 and m["alpha_var"] >= 0.0
    assert 0.0 <= m["ess"] <= 1.0 + 1e-6
    if mask.any():
        # The normalised ESS is alpha_ess squared: (sum w)^2 / (N sum w^2) = 1 / (1 + CV^2).
        torch.testing.assert_close(m["ess"], m["alpha_ess"] ** 2, **tol(dtype))


def test_ais_alpha_validates_scalars() -> None:
    b = random_mismatch(0, torch.float64)
    args = (b["logp_train"], b["logp_rollout"], b["advantages"], b["mask"])
    with pytest.raises(ValueError, match="cap"):
        ais_alpha(*args, 0.5, 0.1, 1.0, 0.1)
    with pytest.raises(ValueError, match="delta"):
        ais_alpha(*args, 2.0, 0.0, 1.0, 0.1)
    with pytest.raises(ValueError, match="gamma"):
        ais_alpha(*args, 2.0, 0.1, 1.0, 0.0)
    with pytest.raises(ValueError, match="beta"):
        ais_alpha(*args, 2.0, 0.1, -1.0, 0.1)
    with pytest.raises(ValueError, match="cap"):
        tis_weights(b["logp_train"], b["logp_rollout"], b["mask"], 0.9)


# ---------------------------------------------------------------------------------------------
# AIS weights


@pytest.mark.parametrize("dtype", DTYPES)
def test_ais_weights_match_loop(dtype: torch.dtype) -> None:
    for seed in SEEDS:
        b = random_mismatch(seed, dtype)
        alpha, cap = [0.0, 0.3, 1.0, 0.77][seed % 4], 3.0
        logp_train = b["logp_train"].clone().requires_grad_(True)
        weights = ais_weights(logp_train, b["logp_rollout"], b["mask"], alpha, cap)
        assert not weights.requires_grad
        expected = torch.zeros_like(weights)
        for i, j in valid_tokens(b):
            rho = math.exp(float(b["logp_train"][i, j]) - float(b["logp_rollout"][i, j]))
            expected[i, j] = 1.0 + alpha * (min(rho, cap) - 1.0)
        torch.testing.assert_close(weights, expected, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_alpha_one_gives_tis(dtype: torch.dtype) -> None:
    for seed in range(10):
        b = random_mismatch(seed, dtype)
        tis, _ = tis_weights(b["logp_train"], b["logp_rollout"], b["mask"], 2.0)
        ais = ais_weights(b["logp_train"], b["logp_rollout"], b["mask"], torch.tensor(1.0, dtype=dtype), 2.0)
        torch.testing.assert_close(ais, tis, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_alpha_zero_is_exactly_plain_grpo(dtype: torch.dtype, per_token_adv: bool) -> None:
    for seed in SEEDS:
        b = random_mismatch(seed, dtype, per_token_adv)
        alpha = torch.tensor(0.0, dtype=dtype)
        weights = ais_weights(b["logp_train"], b["logp_rollout"], b["mask"], alpha, 2.0)
        assert torch.equal(weights, b["mask"].to(dtype))

        def loss_and_grad(w: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, dict]:
            logp = b["logp_train"].clone().requires_grad_(True)
            loss, metrics = grpo_loss(
                logp, b["old_logp"], b["advantages"], b["mask"], 0.2, 0.28,
                kl_coef=0.01, ref_logp=b["logp_rollout"], weights=w,
            )
            loss.backward()
            return loss, logp.grad, metrics

        loss_w, grad_w, metrics_w = loss_and_grad(weights)
        loss_0, grad_0, metrics_0 = loss_and_grad(None)
        assert torch.equal(loss_w, loss_0)
        assert torch.equal(grad_w, grad_0)
        assert all(torch.equal(metrics_w[k], metrics_0[k]) for k in metrics_0)
