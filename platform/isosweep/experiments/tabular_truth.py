"""Independent truth for the planted tabular-policy control: GRPO on the "codes" task, in plain numpy.

The planted control trains a tabular softmax policy with the platform's real trial loop and asks
whether the sweep reports the right compute-optimal number of samples per problem ``n*(C)``. This
module is the answer key: a direct simulation of the same algorithm that **imports nothing from
isosweep and nothing from torch** (only numpy and the standard library), so it shares no code with
the platform. Where the platform's ``n*(C)`` disagrees with :func:`truth`, the fault is the platform's.

Contract (what is simulated, exactly):

* Task. ``F`` families, family ``f`` with a secret code ``codes[f] = (c0, c1, c2)``, digits 0..9.
  A problem is an instance of a family; the reward of a completion is 1 iff its three digits equal
  the family's code.
* Policy. ``theta[f, k, d]`` (``F x 3 x 10``) and ``phi[k, d]`` (``3 x 10``, shared by all families);
  at position ``k`` digit ``d`` has probability ``softmax_d(theta[f, k] + phi[k])`` (temperature 1).
  A forced fourth token (end of sequence) has log-prob 0 and no gradient but counts in the loss
  denominator: every completion has 4 tokens.
* Planted start. ``phi = 0``; ``theta[f, k, d] = a_f`` where ``d == codes[f, k]`` else 0, with
  ``q_f = eps_f ** (1/3)`` and ``a_f = log(9 q_f / (1 - q_f))``, so the pass rate starts at ``eps_f``.
* One step. ``Bp`` problems taken in epochs over the train list (each epoch a fresh random
  permutation; problem ``i = step * Bp + j`` is position ``i % len(train)`` of epoch
  ``i // len(train)``); ``n`` samples each; group advantages ``(r - mean) / (std + 1e-6)``
  (population std) or ``r - mean``, exactly 0 for a group of equal rewards; loss
  ``L = -1 / (4 Bp n) * sum_i A_i * sum_k log pi(d_ik)``; the gradient clipped to global norm
  ``grad_clip`` over theta and phi together; AdamW with torch semantics (betas 0.9, 0.99, eps 1e-8,
  no weight decay, every parameter updated every step) at ``lr = lr_ref * sqrt(Bp n / batch_ref)``.
* Clipping. Following DeepSpeed 0.19 (ZeRO 1/2 ``unscale_and_clip_grads``: divide by
  ``max(1, (norm + 1e-6) / clip)``; its ``runtime.utils.clip_grad_norm_`` and
  ``torch.nn.utils.clip_grad_norm_``: multiply by ``min(1, clip / (norm + 1e-6))``, the same
  factor): every gradient is multiplied by ``min(1, grad_clip / (norm + 1e-6))``. This differs
  from "scale only when ``norm > grad_clip``" only for ``norm`` within 1e-6 below ``grad_clip``.
* Evaluation. Noise-free: the exact expected pass rate ``sum_f w_f prod_k pi(codes[f, k] | f, k)``
  with the eval set's family weights ``w``, at step 0 and after every step; a trial at ``(Bp, n)``
  that ran ``t`` steps has used compute ``C = t * Bp * n`` rollouts.
* Truth. On an iso-compute grid every config ``(Bp, n)`` runs ``C_max // (Bp n)`` steps; its value
  at budget ``C`` is the running best of its eval curve over compute ``<= C``, averaged over seeds;
  ``n*(C)`` is the config with the largest mean, and the margin is its lead over the runner-up in
  standard errors of the per-seed difference.

Everything is float64 and vectorised over seeds (and problems and samples). Each seed has its own
random streams (``SeedSequence(seed).spawn(2)``: problem order, then samples), so a seed's curve does
not depend on which other seeds run beside it. Run ``python -m isosweep.experiments.tabular_truth``
for a table.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

K = 3
"""Code digits per completion."""
D = 10
"""Digit vocabulary size."""
TOKENS = K + 1
"""Tokens per completion in the loss denominator: three digits and the forced end of sequence."""
BETAS = (0.9, 0.99)
"""AdamW betas."""
ADAM_EPS = 1e-8
"""AdamW epsilon (added to the bias-corrected root of the second moment, as torch does)."""
STD_EPS = 1e-6
"""Added to the group's std when advantages are scaled by it."""
CLIP_EPS = 1e-6
"""Added to the global norm in the clipping factor (DeepSpeed and torch alike)."""


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class TabularSetup:
    """One planted control: the task, the start, the train and eval sets and the trial settings.

    ``codes`` (``F x 3`` ints 0..9), ``eps`` (``F`` start pass rates in (0, 1)), ``train`` (one
    family id per train problem, duplicates allowed) and ``eval_weights`` (``F`` non-negative
    weights, normalised here to sum to 1) are stored as read-only arrays.
    """

    codes: np.ndarray
    eps: np.ndarray
    train: np.ndarray
    eval_weights: np.ndarray
    lr_ref: float = 1e-2
    batch_ref: int = 128
    scale_adv_by_std: bool = True
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        codes = np.array(self.codes, dtype=np.int64)
        eps = np.array(self.eps, dtype=np.float64)
        train = np.array(self.train, dtype=np.int64).reshape(-1)
        w = np.array(self.eval_weights, dtype=np.float64).reshape(-1)
        if codes.ndim != 2 or codes.shape[1] != K or codes.shape[0] < 1:
            raise ValueError(f"codes must be F x {K}, got shape {codes.shape}")
        F = codes.shape[0]
        if codes.min() < 0 or codes.max() >= D:
            raise ValueError("code digits must be in 0..9")
        if eps.shape != (F,) or not np.all((eps > 0) & (eps < 1)):
            raise ValueError(f"eps must be {F} values in (0, 1)")
        if train.size == 0 or train.min() < 0 or train.max() >= F:
            raise ValueError(f"train must be a non-empty list of family ids in 0..{F - 1}")
        if w.shape != (F,) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"eval_weights must be {F} non-negative weights, not all 0")
        if not (self.lr_ref >= 0 and self.batch_ref > 0 and self.grad_clip > 0):
            raise ValueError("lr_ref >= 0, batch_ref > 0 and grad_clip > 0 are required")
        object.__setattr__(self, "codes", _frozen(codes))
        object.__setattr__(self, "eps", _frozen(eps))
        object.__setattr__(self, "train", _frozen(train))
        object.__setattr__(self, "eval_weights", _frozen(w / w.sum()))

    @property
    def families(self) -> int:
        """Number of families ``F``."""
        return self.codes.shape[0]


def needle_setup(families: int = 24, eps_levels: Sequence[float] = (0.01, 0.02, 0.04), per_family: int = 20,
                 seed: int = 0, **settings) -> TabularSetup:
    """The "needle" control: ``families`` families split evenly over ``eps_levels``, random distinct
    codes (drawn with ``seed``), ``per_family`` train problems per family, uniform eval weights;
    ``settings`` go to :class:`TabularSetup` (``lr_ref``, ``scale_adv_by_std``, ...)."""
    rng = np.random.default_rng(seed)
    flat = rng.choice(D**K, size=families, replace=False)
    codes = np.stack([flat // 100, flat // 10 % 10, flat % 10], axis=1)
    eps = np.array([eps_levels[f * len(eps_levels) // families] for f in range(families)])
    train = np.repeat(np.arange(families), per_family)
    return TabularSetup(codes=codes, eps=eps, train=train, eval_weights=np.ones(families), **settings)


def planted_params(setup: TabularSetup) -> tuple[np.ndarray, np.ndarray]:
    """The planted start ``(theta, phi)``, shapes ``F x 3 x 10`` and ``3 x 10``: pass rate ``eps_f``."""
    q = setup.eps ** (1.0 / K)
    a = np.log(q * (D - 1) / (1.0 - q))
    theta = np.zeros((setup.families, K, D))
    f, k = np.meshgrid(np.arange(setup.families), np.arange(K), indexing="ij")
    theta[f, k, setup.codes] = a[:, None]
    return theta, np.zeros((K, D))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-softmax over the last axis."""
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def pass_rates(setup: TabularSetup, theta: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """Exact pass rate of every family, ``(..., F)``, for ``theta (..., F, 3, 10)`` and ``phi (..., 3, 10)``."""
    logp = log_softmax(theta + phi[..., None, :, :])
    f, k = np.meshgrid(np.arange(setup.families), np.arange(K), indexing="ij")
    return np.exp(logp[..., f, k, setup.codes].sum(axis=-1))


def eval_value(setup: TabularSetup, theta: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """Exact expected eval pass rate ``sum_f w_f p_f``, shape ``theta.shape[:-3]``."""
    return pass_rates(setup, theta, phi) @ setup.eval_weights


def learning_rate(setup: TabularSetup, Bp: int, n: int) -> float:
    """``lr_ref * sqrt(Bp n / batch_ref)``."""
    return setup.lr_ref * math.sqrt(Bp * n / setup.batch_ref)


def group_advantages(rewards: np.ndarray, scale_by_std: bool) -> np.ndarray:
    """GRPO advantages over the last axis (one group): ``(r - mean) / (std + 1e-6)`` with the
    population std, or ``r - mean``; exactly 0 for a group whose rewards are all equal."""
    centred = rewards - rewards.mean(axis=-1, keepdims=True)
    std = rewards.std(axis=-1, keepdims=True)
    adv = centred / (std + STD_EPS) if scale_by_std else centred
    return np.where(std == 0, 0.0, adv)


def sample_digits(probs: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling: ``probs (S, Bp, 3, 10)``, ``uniforms (S, Bp, n, 3)`` in [0, 1) give the
    digits ``(S, Bp, n, 3)``: the smallest ``d`` whose cumulative probability exceeds the uniform."""
    cdf = np.cumsum(probs, axis=-1)
    d = (cdf[:, :, None, :, :] <= uniforms[..., None]).sum(axis=-1)
    return np.minimum(d, D - 1)


def loss(theta: np.ndarray, phi: np.ndarray, fams: np.ndarray, digits: np.ndarray, adv: np.ndarray) -> float:
    """The GRPO loss of one step for one seed: ``theta (F, 3, 10)``, ``phi (3, 10)``, ``fams (Bp,)``,
    ``digits (Bp, n, 3)``, ``adv (Bp, n)``; ``-1 / (4 Bp n) * sum A * sum_k log pi(d_k)``."""
    Bp, n = adv.shape
    logp = log_softmax(theta[fams] + phi)  # (Bp, 3, 10)
    picked = np.take_along_axis(logp[:, None], digits[..., None], axis=-1)[..., 0]  # (Bp, n, 3)
    return float(-(adv * picked.sum(axis=-1)).sum() / (TOKENS * Bp * n))


def policy_gradient(probs: np.ndarray, fams: np.ndarray, digits: np.ndarray, adv: np.ndarray,
                    families: int) -> tuple[np.ndarray, np.ndarray]:
    """Gradient of :func:`loss`, batched over seeds: ``probs (S, Bp, 3, 10)`` (the policy at each
    chosen problem), ``fams (S, Bp)``, ``digits (S, Bp, n, 3)``, ``adv (S, Bp, n)`` give
    ``(g_theta (S, F, 3, 10), g_phi (S, 3, 10))``, where per problem
    ``dL/dlogits[k] = -1 / (4 Bp n) * sum_i A_i (onehot(d_ik) - pi_k)``."""
    S, Bp, n = adv.shape
    onehot = digits[..., None] == np.arange(D)  # (S, Bp, n, 3, 10)
    g = (adv[..., None, None] * onehot).sum(axis=2) - adv.sum(axis=2)[..., None, None] * probs
    g *= -1.0 / (TOKENS * Bp * n)  # (S, Bp, 3, 10)
    member = (fams[..., None] == np.arange(families)).astype(np.float64)  # (S, Bp, F)
    g_theta = np.matmul(member.transpose(0, 2, 1), g.reshape(S, Bp, K * D)).reshape(S, families, K, D)
    return g_theta, g.sum(axis=1)


def clip_factor(norm: np.ndarray, max_norm: float) -> np.ndarray:
    """Clipping multiplier ``min(1, max_norm / (norm + 1e-6))`` (DeepSpeed 0.19, torch)."""
    return np.minimum(1.0, max_norm / (norm + CLIP_EPS))


def clip_by_global_norm(grads: Sequence[np.ndarray], max_norm: float, batch_dims: int = 0
                        ) -> tuple[list[np.ndarray], np.ndarray]:
    """Clip ``grads`` together to global 2-norm ``max_norm``: returns the clipped copies and the
    norm before clipping. The first ``batch_dims`` axes (seeds) are independent problems."""
    sq = sum((g**2).reshape(g.shape[:batch_dims] + (-1,)).sum(axis=-1) for g in grads)
    norm = np.sqrt(sq)
    c = clip_factor(norm, max_norm)
    return [g * c.reshape(c.shape + (1,) * (g.ndim - batch_dims)) for g in grads], norm


def adamw_step(param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, lr: float) -> None:
    """One AdamW step in place, torch semantics without weight decay: ``m, v`` moments updated, then
    ``param -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)`` with ``t`` counted from 1."""
    b1, b2 = BETAS
    m *= b1
    m += (1 - b1) * grad
    v *= b2
    v += (1 - b2) * grad * grad
    denom = np.sqrt(v) / math.sqrt(1 - b2**t)
    denom += ADAM_EPS
    param -= (lr / (1 - b1**t)) * m / denom


def problem_order(train: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """The first ``count`` train problems' family ids: epochs over ``train``, each a fresh permutation."""
    epochs = -(-count // train.size)
    return np.concatenate([rng.permutation(train) for _ in range(max(epochs, 1))])[:count]


@dataclass
class State:
    """Parameters and AdamW moments of ``S`` seeds: ``params (S, F + 1, 3, 10)``, rows ``:F`` theta
    and row ``F`` phi; ``t`` is the number of optimizer steps taken."""

    params: np.ndarray
    m: np.ndarray
    v: np.ndarray
    t: int = 0

    @property
    def theta(self) -> np.ndarray:
        """``(S, F, 3, 10)`` view."""
        return self.params[:, :-1]

    @property
    def phi(self) -> np.ndarray:
        """``(S, 3, 10)`` view."""
        return self.params[:, -1]


def initial_state(setup: TabularSetup, seeds: int) -> State:
    """The planted start for ``seeds`` seeds, zero moments."""
    theta, phi = planted_params(setup)
    one = np.concatenate([theta, phi[None]], axis=0)
    params = np.repeat(one[None], seeds, axis=0)
    return State(params, np.zeros_like(params), np.zeros_like(params))


def train_step(setup: TabularSetup, state: State, fams: np.ndarray, uniforms: np.ndarray, lr: float) -> dict:
    """One GRPO step of every seed in place: ``fams (S, Bp)`` the chosen problems' families,
    ``uniforms (S, Bp, n, 3)`` the sampling noise. Returns the step's digits, rewards, advantages and
    pre-clip gradient norm (for tests and diagnostics)."""
    S, Bp = fams.shape
    logits = state.theta[np.arange(S)[:, None], fams] + state.phi[:, None]  # (S, Bp, 3, 10)
    probs = np.exp(log_softmax(logits))
    digits = sample_digits(probs, uniforms)
    rewards = (digits == setup.codes[fams][:, :, None, :]).all(axis=-1).astype(np.float64)
    adv = group_advantages(rewards, setup.scale_adv_by_std)
    g_theta, g_phi = policy_gradient(probs, fams, digits, adv, setup.families)
    grad = np.concatenate([g_theta, g_phi[:, None]], axis=1)
    (grad,), norm = clip_by_global_norm([grad], setup.grad_clip, batch_dims=1)
    state.t += 1
    adamw_step(state.params, grad, state.m, state.v, state.t, lr)
    return {"digits": digits, "rewards": rewards, "advantages": adv, "grad_norm": norm}


def _streams(seed: int) -> tuple[np.random.Generator, np.random.Generator]:
    order, samples = np.random.SeedSequence(int(seed)).spawn(2)
    return np.random.Generator(np.random.PCG64(order)), np.random.Generator(np.random.PCG64(samples))


def simulate(setup: TabularSetup, Bp: int, n: int, steps: int, seeds: Sequence[int] | int) -> np.ndarray:
    """Exact eval values of ``steps`` GRPO steps at ``(Bp, n)``, ``(len(seeds), steps + 1)``: column
    ``t`` is the expected eval pass rate after ``t`` steps (compute ``t * Bp * n``). ``seeds`` is a
    list of seeds or a count (seeds ``0 .. count - 1``)."""
    seeds = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    S = len(seeds)
    streams = [_streams(s) for s in seeds]
    order = np.stack([problem_order(setup.train, steps * Bp, o) for o, _ in streams])  # (S, steps * Bp)
    state = initial_state(setup, S)
    lr = learning_rate(setup, Bp, n)
    out = np.empty((S, steps + 1))
    out[:, 0] = eval_value(setup, state.theta, state.phi)
    block = max(1, (1 << 15) // (Bp * n * K))  # steps of noise drawn at once per seed (independent of S)
    for start in range(0, steps, block):
        stop = min(steps, start + block)
        noise = np.stack([r.random((stop - start, Bp, n, K)) for _, r in streams], axis=1)
        for t in range(start, stop):
            train_step(setup, state, order[:, t * Bp:(t + 1) * Bp], noise[t - start], lr)
            out[:, t + 1] = eval_value(setup, state.theta, state.phi)
    return out


@dataclass(frozen=True)
class BudgetTruth:
    """The truth at one budget ``C``: every config's mean and standard error (over seeds) of its
    running-best eval value, the best config and runner-up, the gap between them, its paired
    standard error (per-seed differences) and unpaired one (``sqrt(se_best^2 + se_runner^2)``),
    and the margin ``gap / se_gap`` (paired)."""

    C: int
    configs: tuple[tuple[int, int], ...]
    means: tuple[float, ...]
    ses: tuple[float, ...]
    best: tuple[int, int]
    runner_up: tuple[int, int]
    gap: float
    se_gap: float
    se_gap_unpaired: float

    @property
    def n_star(self) -> int:
        """``n`` of the best config."""
        return self.best[1]

    @property
    def margin(self) -> float:
        """``gap / se_gap``: the lead of the best over the runner-up in paired standard errors."""
        return self.gap / self.se_gap if self.se_gap > 0 else math.inf


def truth_from_curves(curves: dict[tuple[int, int], np.ndarray], budgets: Sequence[int]) -> list[BudgetTruth]:
    """:class:`BudgetTruth` per budget from each config's :func:`simulate` curves (same seeds, same
    order): at budget ``C`` a config's value is the running best of its curve up to step ``C // (Bp n)``."""
    configs = tuple(curves)
    best_so_far = {c: np.maximum.accumulate(curves[c], axis=1) for c in configs}
    S = next(iter(curves.values())).shape[0]
    if S < 2 or any(v.shape[0] != S for v in curves.values()):
        raise ValueError("every config needs the same number (>= 2) of seeds")
    rows = []
    for C in budgets:
        vals = np.stack([best_so_far[c][:, min(best_so_far[c].shape[1] - 1, C // (c[0] * c[1]))] for c in configs])
        means, ses = vals.mean(axis=1), vals.std(axis=1, ddof=1) / math.sqrt(S)
        rank = np.argsort(-means, kind="stable")
        b = rank[0]
        r = rank[1] if len(configs) > 1 else rank[0]
        diff = vals[b] - vals[r]
        rows.append(BudgetTruth(C=int(C), configs=configs, means=tuple(means.tolist()), ses=tuple(ses.tolist()),
                                best=configs[b], runner_up=configs[r], gap=float(diff.mean()),
                                se_gap=float(diff.std(ddof=1) / math.sqrt(S)),
                                se_gap_unpaired=float(math.hypot(ses[b], ses[r]))))
    return rows


def truth(setup: TabularSetup, configs: Sequence[tuple[int, int]], C_max: int, budgets: Sequence[int],
          seeds: Sequence[int] | int) -> list[BudgetTruth]:
    """The iso-compute truth: every config ``(Bp, n)`` runs ``C_max // (Bp n)`` steps on ``seeds``;
    one :class:`BudgetTruth` per budget in ``budgets`` (each ``<= C_max``)."""
    curves = {(int(Bp), int(n)): simulate(setup, Bp, n, C_max // (Bp * n), seeds) for Bp, n in configs}
    return truth_from_curves(curves, budgets)


def format_table(rows: Sequence[BudgetTruth], start: float) -> str:
    """A plain-text table: per budget every config's mean (se), the best ``(Bp, n)`` and the margin."""
    configs = rows[0].configs
    names = " ".join(f"{f'{b}x{n}':>16}" for b, n in configs)
    head = f"{'C':>8} {names} {'best':>7} {'margin':>7} {'unpaired':>8}"
    lines = [f"start value {start:.4f}", head]
    for r in rows:
        cells = " ".join(f"{m:.4f} ({s:.4f})".rjust(16) for m, s in zip(r.means, r.ses))
        lines.append(f"{r.C:>8} {cells} {f'{r.best[0]}x{r.best[1]}':>7} {r.margin:7.1f} "
                     f"{r.gap / r.se_gap_unpaired if r.se_gap_unpaired > 0 else math.inf:8.1f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the truth table of the needle control (see ``--help``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lr-ref", type=float, default=1e-2)
    p.add_argument("--no-std", action="store_true", help="advantages r - mean (no std scaling)")
    p.add_argument("--Bp", type=int, default=8)
    p.add_argument("--ns", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    p.add_argument("--C-max", type=int, default=100_000)
    p.add_argument("--budgets", type=int, nargs="+", default=[2000, 5000, 10000, 20000, 50000, 100000])
    p.add_argument("--seeds", type=int, default=64)
    p.add_argument("--families", type=int, default=24)
    p.add_argument("--per-family", type=int, default=20)
    p.add_argument("--grad-clip", type=float, default=1.0)
    a = p.parse_args(argv)
    setup = needle_setup(a.families, per_family=a.per_family, lr_ref=a.lr_ref,
                         scale_adv_by_std=not a.no_std, grad_clip=a.grad_clip)
    theta, phi = planted_params(setup)
    t0 = time.perf_counter()
    rows = truth(setup, [(a.Bp, n) for n in a.ns], a.C_max, a.budgets, a.seeds)
    print(format_table(rows, float(eval_value(setup, theta, phi))))
    print(f"lr_ref {a.lr_ref}, scale_adv_by_std {not a.no_std}, {a.seeds} seeds, {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
