"""The numpy truth of the planted tabular control, against slow references and torch."""

from __future__ import annotations

import ast
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from isosweep.experiments import tabular_truth as tt

MODULE = Path(tt.__file__)


@pytest.fixture(autouse=True)
def one_thread():
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def small_setup(**settings) -> tt.TabularSetup:
    codes = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 0, 1]])
    return tt.TabularSetup(codes=codes, eps=[0.3, 0.5, 0.1, 0.05], train=[0, 0, 1, 2, 3, 1, 2],
                           eval_weights=[1, 1, 2, 0], **settings)


def random_params(setup: tt.TabularSetup, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    theta, phi = tt.planted_params(setup)
    return theta + 0.5 * rng.standard_normal(theta.shape), phi + 0.5 * rng.standard_normal(phi.shape)


def softmax_slow(x) -> list[float]:
    e = [math.exp(v - max(x)) for v in x]
    return [v / sum(e) for v in e]


def step_case(setup, rng, Bp=3, n=5, p_code=0.5):
    """A step's fixed samples: families, digits (about half of them right), rewards, advantages."""
    fams = rng.integers(0, setup.families, size=Bp)
    right = rng.random((Bp, n, tt.K)) < p_code
    digits = np.where(right, setup.codes[fams][:, None, :], rng.integers(0, tt.D, size=(Bp, n, tt.K)))
    rewards = (digits == setup.codes[fams][:, None, :]).all(-1).astype(float)
    return fams, digits, rewards, tt.group_advantages(rewards, True)


def test_module_imports_only_numpy_and_stdlib():
    tree = ast.parse(MODULE.read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports (they would reach isosweep)"
            roots.add(node.module.split(".")[0])
    assert "isosweep" not in roots and "torch" not in roots
    assert roots <= set(sys.stdlib_module_names) | {"numpy"}, roots


def test_planted_start_has_pass_rate_eps():
    setup = small_setup()
    theta, phi = tt.planted_params(setup)
    np.testing.assert_allclose(tt.pass_rates(setup, theta, phi), setup.eps, rtol=1e-12)
    # a slow check of one family: the product of the code digits' softmax probabilities
    f = 2
    slow = math.prod(softmax_slow(theta[f, k])[setup.codes[f, k]] for k in range(3))
    assert slow == pytest.approx(setup.eps[f], rel=1e-12)
    assert tt.eval_value(setup, theta, phi) == pytest.approx((0.3 + 0.5 + 2 * 0.1) / 4)
    needles = tt.needle_setup()
    assert len({tuple(c) for c in needles.codes}) == 24
    np.testing.assert_allclose(tt.pass_rates(needles, *tt.planted_params(needles)), needles.eps, rtol=1e-12)


def test_advantages():
    r = np.array([[1.0, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    np.testing.assert_array_equal(tt.group_advantages(r, False),
                                  [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0], [0, 0, 0, 0], [0.75, -0.25, -0.25, -0.25]])
    scaled = tt.group_advantages(r, True)
    std = math.sqrt(3 / 16)
    np.testing.assert_allclose(scaled[3], np.array([0.75, -0.25, -0.25, -0.25]) / (std + 1e-6))
    np.testing.assert_allclose(scaled[0], np.array([0.5, -0.5, -0.5, 0.5]) / (0.5 + 1e-6))
    assert np.all(scaled[1:3] == 0)


def test_gradient_matches_slow_loop_and_finite_differences():
    setup = small_setup()
    rng = np.random.default_rng(1)
    theta, phi = random_params(setup, rng)
    Bp, n = 3, 5
    fams, digits, rewards, adv = step_case(setup, rng, Bp, n)
    assert 0 < rewards.sum() < rewards.size and np.any(adv != 0)
    probs = np.exp(tt.log_softmax(theta[fams] + phi))
    g_theta, g_phi = tt.policy_gradient(probs[None], fams[None], digits[None], adv[None], setup.families)
    g_theta, g_phi = g_theta[0], g_phi[0]

    # slow: per sample, per position, per digit
    slow_theta = [[[0.0] * 10 for _ in range(3)] for _ in range(setup.families)]
    slow_phi = [[0.0] * 10 for _ in range(3)]
    for j in range(Bp):
        f = int(fams[j])
        for i in range(n):
            for k in range(3):
                pi = softmax_slow([theta[f, k, d] + phi[k, d] for d in range(10)])
                for d in range(10):
                    g = -adv[j, i] * ((d == digits[j, i, k]) - pi[d]) / (4 * Bp * n)
                    slow_theta[f][k][d] += g
                    slow_phi[k][d] += g
    np.testing.assert_allclose(g_theta, slow_theta, atol=1e-15, rtol=1e-10)
    np.testing.assert_allclose(g_phi, slow_phi, atol=1e-15, rtol=1e-10)

    # central finite differences of the loss with the samples fixed
    h = 1e-6
    for which, grad in (("theta", g_theta), ("phi", g_phi)):
        fd = np.zeros_like(grad)
        for idx in np.ndindex(grad.shape):
            tp, pp, tm, pm = theta.copy(), phi.copy(), theta.copy(), phi.copy()
            (tp if which == "theta" else pp)[idx] += h
            (tm if which == "theta" else pm)[idx] -= h
            fd[idx] = (tt.loss(tp, pp, fams, digits, adv) - tt.loss(tm, pm, fams, digits, adv)) / (2 * h)
        np.testing.assert_allclose(grad, fd, atol=1e-9)
    assert np.abs(g_theta).max() > 1e-3


def test_adamw_matches_torch():
    rng = np.random.default_rng(2)
    p0 = rng.standard_normal((4, 3, 10))
    grads = [rng.standard_normal(p0.shape), np.zeros(p0.shape), rng.standard_normal(p0.shape) * 1e-3]
    lr = 0.03
    p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    tp = torch.nn.Parameter(torch.tensor(p0))
    opt = torch.optim.AdamW([tp], lr=lr, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    for t, g in enumerate(grads, start=1):
        tt.adamw_step(p, g, m, v, t, lr)
        tp.grad = torch.tensor(g)
        opt.step()
        np.testing.assert_allclose(p, tp.detach().numpy(), rtol=1e-12, atol=1e-14)
    assert not np.allclose(p, p0)


@pytest.mark.parametrize("scale", [0.01, 1.0, 50.0])
def test_clipping_matches_torch(scale):
    rng = np.random.default_rng(3)
    g_theta, g_phi = scale * rng.standard_normal((4, 3, 10)), scale * rng.standard_normal((3, 10))
    (c_theta, c_phi), norm = tt.clip_by_global_norm([g_theta, g_phi], 1.0)
    params = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64)) for g in (g_theta, g_phi)]
    for prm, g in zip(params, (g_theta, g_phi)):
        prm.grad = torch.tensor(g)
    total = torch.nn.utils.clip_grad_norm_(params, 1.0)
    assert float(norm) == pytest.approx(float(total), rel=1e-12)
    np.testing.assert_allclose(c_theta, params[0].grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(c_phi, params[1].grad.numpy(), rtol=1e-12)
    # batched over seeds: each seed clipped on its own
    (b_theta, b_phi), b_norm = tt.clip_by_global_norm([np.stack([g_theta, 100 * g_theta]),
                                                       np.stack([g_phi, 100 * g_phi])], 1.0, batch_dims=1)
    np.testing.assert_allclose(b_theta[0], c_theta, rtol=1e-12)
    np.testing.assert_allclose(b_norm, [float(norm), 100 * float(norm)], rtol=1e-12)


def slow_step(setup, theta, phi, m, v, t, fams, uniforms, lr):
    """A plain-loop reference of one step for one seed (parameters and moments as nested copies)."""
    Bp, n = uniforms.shape[:2]
    g_theta, g_phi = np.zeros_like(theta), np.zeros_like(phi)
    for j in range(Bp):
        f = int(fams[j])
        pis = [softmax_slow(list(theta[f, k] + phi[k])) for k in range(3)]
        digits, rewards = [], []
        for i in range(n):
            ds = []
            for k in range(3):
                acc, d = 0.0, 9
                for dd in range(10):
                    acc += pis[k][dd]
                    if uniforms[j, i, k] < acc:
                        d = dd
                        break
                ds.append(d)
            digits.append(ds)
            rewards.append(float(ds == list(setup.codes[f])))
        mean = sum(rewards) / n
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
        for i in range(n):
            a = (rewards[i] - mean) / (std + 1e-6) if setup.scale_adv_by_std else rewards[i] - mean
            a = 0.0 if std == 0 else a
            for k in range(3):
                for d in range(10):
                    g = -a * ((d == digits[i][k]) - pis[k][d]) / (4 * Bp * n)
                    g_theta[f, k, d] += g
                    g_phi[k, d] += g
    norm = math.sqrt((g_theta**2).sum() + (g_phi**2).sum())
    c = min(1.0, setup.grad_clip / (norm + 1e-6))
    out = []
    for p, g, mm, vv in ((theta, g_theta * c, m[0], v[0]), (phi, g_phi * c, m[1], v[1])):
        mm[:] = 0.9 * mm + 0.1 * g
        vv[:] = 0.99 * vv + 0.01 * g * g
        out.append(p - lr * (mm / (1 - 0.9**t)) / (np.sqrt(vv / (1 - 0.99**t)) + 1e-8))
    return out


@pytest.mark.parametrize("scale_adv_by_std", [True, False])
def test_train_steps_match_slow_reference(scale_adv_by_std):
    setup = small_setup(lr_ref=0.3, scale_adv_by_std=scale_adv_by_std, grad_clip=0.05)
    rng = np.random.default_rng(4)
    Bp, n, S = 3, 6, 2
    state = tt.initial_state(setup, S)
    lr = tt.learning_rate(setup, Bp, n)
    assert lr == pytest.approx(0.3 * math.sqrt(18 / 128))
    ref = [[*tt.planted_params(setup)] for _ in range(S)]
    moments = [([np.zeros((4, 3, 10)), np.zeros((3, 10))], [np.zeros((4, 3, 10)), np.zeros((3, 10))]) for _ in range(S)]
    rewarded = 0.0
    for t in range(1, 5):
        fams = rng.integers(0, setup.families, size=(S, Bp))
        u = rng.random((S, Bp, n, 3))
        info = tt.train_step(setup, state, fams, u, lr)
        rewarded += info["rewards"].sum()
        for s in range(S):
            ref[s] = slow_step(setup, *ref[s], *moments[s], t, fams[s], u[s], lr)
            # atol: entries that are 0 in exact arithmetic get fp noise (sum of A), which Adam damps by eps
            np.testing.assert_allclose(state.theta[s], ref[s][0], rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(state.phi[s], ref[s][1], rtol=1e-10, atol=1e-10)
    assert rewarded > 0 and state.t == 4


def test_problem_order_is_epochs_of_permutations():
    train = np.array([0, 0, 1, 2, 3, 1, 2])
    order = tt.problem_order(train, 3 * len(train) + 2, np.random.default_rng(0))
    assert len(order) == 3 * len(train) + 2
    for e in range(3):
        assert sorted(order[e * 7:(e + 1) * 7]) == sorted(train)
    assert not np.array_equal(order[:7], order[7:14])


def test_tiny_lr_stays_at_start_and_results_are_deterministic():
    setup = small_setup(lr_ref=1e-12)
    curve = tt.simulate(setup, 2, 4, 30, [0, 1])
    start = tt.eval_value(setup, *tt.planted_params(setup))
    assert curve.shape == (2, 31)
    np.testing.assert_allclose(curve, start, atol=1e-9)

    setup = small_setup(lr_ref=0.05)
    a = tt.simulate(setup, 2, 4, 40, [5, 7, 9])
    b = tt.simulate(setup, 2, 4, 40, [5, 7, 9])
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(tt.simulate(setup, 2, 4, 40, [7]), a[1:2])  # a seed alone == beside others
    assert not np.array_equal(a[0], a[1])


def test_learning_and_truth_table():
    setup = small_setup(lr_ref=0.05)
    configs = [(2, 2), (2, 8)]
    rows = tt.truth(setup, configs, 800, [0, 100, 800], 8)
    start = tt.eval_value(setup, *tt.planted_params(setup))
    assert rows[0].means == pytest.approx((start, start)) and rows[0].C == 0
    last = rows[-1]
    assert min(last.means) > start + 0.1  # it learns
    b = last.configs.index(last.best)
    assert last.means[b] == max(last.means) and last.n_star == last.best[1]
    assert last.gap == pytest.approx(max(last.means) - sorted(last.means)[-2])
    assert last.margin == pytest.approx(last.gap / last.se_gap)
    # the same numbers from curves, and a running best that never falls
    curves = {c: tt.simulate(setup, *c, 800 // (c[0] * c[1]), 8) for c in configs}
    again = tt.truth_from_curves(curves, [0, 100, 800])
    assert again[-1].means == last.means
    assert [r.means[0] for r in again] == sorted(r.means[0] for r in again)
    table = tt.format_table(rows, start)
    assert "2x8" in table and "margin" in table
