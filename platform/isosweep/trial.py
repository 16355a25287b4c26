"""One GRPO trial, top to bottom: sample n completions for each of Bp problems, reward them,
compute group advantages, take one policy-gradient step, publish the weights; repeat M times.

``train_loop(cfg, out)`` is the whole trial and is written as the per-worker function of a
Ray Train job: everything it needs comes from the config and the output directory, problem
order and sampling seeds are pure functions of ``(seed, step)``, and its state lives in
checkpoints, so a restarted worker resumes where the last checkpoint left off.

Outputs in ``out``:
- ``metrics.jsonl``: one JSON object per evaluation, with ``step``, ``rollouts`` (compute
  consumed, the x-axis), ``eval/mean@k``, ``eval/best@k``, ``eval/worst@k``, training
  statistics averaged over the steps since the previous evaluation (``train/...``, null at
  rollouts 0), and ``rollout/...``, ``mismatch/...`` and ``system/...`` figures;
- ``checkpoints/step-NNNNNN/``: the latest and the best (record mean@k) checkpoints, each a
  ``save_pretrained`` directory (safetensors) plus ``trainer_state.pt``; written to a
  temporary name and renamed, so a crash never leaves a half-written checkpoint.

Departures from the textbook loop: one optimizer step per batch, so the PPO ratio is 1 at the
step and the clip only matters when a correction reweights tokens; the KL to the reference and
the entropy are measured every step even when their coefficients are 0, because they are the
health signals of a run.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from isosweep import config as C
from isosweep.config import TrialConfig
from isosweep.correction import mismatch_metrics
from isosweep.estimators import summarize
from isosweep.grpo import entropy_from_logits, group_advantages, grpo_loss, k3_kl, token_logprobs
from isosweep.models import PROBE_FILE, resolve_model
from isosweep.problemsets import probe_pass_rates, select
from isosweep.rollout import HFEngine, RolloutEngine, Rollouts
from isosweep.tasks import Problem, get_task

METRICS_FILE = "metrics.jsonl"
CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.pt"

PROBE_POOL, PROBE_SAMPLES = 1024, 8
"""Pool size and samples per problem when a non-tiny model's problem sets must be probed."""


@dataclass(frozen=True)
class ProblemSets:
    """Train problems and held-out eval problems of one difficulty."""

    train: list[Problem]
    eval: list[Problem]


def problem_sets(cfg: TrialConfig, model_path: str, engine: RolloutEngine) -> ProblemSets:
    """The easy or hard set of ``cfg.task`` for this base model, from its probe (measured now if absent)."""
    probe_file = Path(model_path) / PROBE_FILE
    if probe_file.exists():
        probe = json.loads(probe_file.read_text())
    else:
        probe = probe_pass_rates(engine, get_task(cfg.task.name), cfg.task.levels, PROBE_POOL, PROBE_SAMPLES, cfg.seed)
    band = C.DIFFICULTY_BANDS[cfg.task.difficulty]
    train = select(probe, cfg.task.name, "train", cfg.task.levels, band)
    held_out = select(probe, cfg.task.name, "eval", cfg.task.levels, band)
    if len(train) < cfg.Bp or not held_out:
        raise C.ConfigError(
            f"task.difficulty={cfg.task.difficulty!r} on levels {list(cfg.task.levels)} leaves {len(train)} train and "
            f"{len(held_out)} eval problems for this base model (base pass rate in {band}); "
            f"allowed: at least Bp = {cfg.Bp} train problems and one eval problem -- choose other levels")
    random.Random(cfg.seed).shuffle(held_out)
    return ProblemSets(train, held_out[:cfg.task.eval_problems])


def batch_problems(train: list[Problem], Bp: int, step: int, seed: int) -> list[Problem]:
    """The ``Bp`` problems of ``step``: epochs over a per-epoch shuffle, a pure function of (seed, step)."""
    chosen = []
    for index in range(step * Bp, (step + 1) * Bp):
        epoch, offset = divmod(index, len(train))
        order = list(range(len(train)))
        random.Random(f"{seed}:epoch:{epoch}").shuffle(order)
        chosen.append(train[order[offset]])
    return chosen


def pack(rollouts: Rollouts, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``prompt + completion`` ids and, aligned with next-token targets
    ``ids[:, 1:]``, the completion mask and the rollout engine's log-probs, each ``(batch, tokens - 1)``."""
    rows = [p + c for p, c in zip(rollouts.prompt_ids, rollouts.completion_ids)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(rows), width - 1))
    rollout_logp = torch.zeros((len(rows), width - 1))
    for i, (prompt, completion, logp) in enumerate(zip(rollouts.prompt_ids, rollouts.completion_ids, rollouts.logprobs)):
        ids[i, :len(prompt) + len(completion)] = torch.tensor(prompt + completion)
        attention[i, :len(prompt) + len(completion)] = 1
        span = slice(len(prompt) - 1, len(prompt) - 1 + len(completion))
        mask[i, span] = 1.0
        rollout_logp[i, span] = torch.tensor(logp)
    return {"ids": ids, "attention": attention, "mask": mask, "rollout_logp": rollout_logp}


def eval_correct(engine: RolloutEngine, problems: list[Problem], task_name: str, samples: int, seed: int) -> np.ndarray:
    """0/1 correctness of ``samples`` completions per problem, shape ``(problems, samples)``."""
    task = get_task(task_name)
    rollouts = engine.generate([p.prompt for p in problems], samples, seed=seed)
    correct = [task.reward(problems[i // samples], text) for i, text in enumerate(rollouts.texts)]
    return np.array(correct).reshape(len(problems), samples)


def evaluate(engine: RolloutEngine, problems: list[Problem], cfg: TrialConfig) -> dict[str, float]:
    """``eval/mean@k``, ``eval/best@k``, ``eval/worst@k`` (and the stderr of mean@k) on held-out problems."""
    correct = eval_correct(engine, problems, cfg.task.name, cfg.eval.samples, seed=cfg.seed + 7_919)
    return {f"eval/{key}": value for key, value in summarize(correct, cfg.eval.k).items()}


def make_engine(cfg: TrialConfig, model_path: str, tokenizer) -> RolloutEngine:
    """The rollout engine named by ``cfg.rollout.engine``, holding its own copy of the base weights."""
    engines: dict[str, Callable[[], RolloutEngine]] = {
        "hf": lambda: HFEngine(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32), tokenizer,
                               cfg.rollout.max_new_tokens, cfg.rollout.temperature),
    }
    return engines[cfg.rollout.engine]()


def train_loop(cfg: TrialConfig, out: str | Path, log: Callable[[str], None] = print) -> list[dict]:
    """Run (or resume) one trial into ``out``; returns the eval records, one per evaluation."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model_path = resolve_model(cfg.model.name, cfg.task.name, cfg.model.warmup_seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    policy = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    engine = make_engine(cfg, model_path, tokenizer)
    sets = problem_sets(cfg, model_path, engine)
    task = get_task(cfg.task.name)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=C.learning_rate(cfg), betas=(0.9, 0.99), weight_decay=0.0)
    total_steps, per_step = C.steps(cfg), cfg.Bp * cfg.n
    kl_coef, entropy_coef = C.kl_coef(cfg), C.entropy_coef(cfg)
    params = sum(p.numel() for p in policy.parameters())

    state = resume(out, policy, optimizer)
    step, tokens, wall = state["step"], state["tokens"], state["wall_s"]
    records = read_records(out)
    engine.update_weights(policy.state_dict(), version=step)
    best = max((r[f"eval/mean@{cfg.eval.k}"] for r in records), default=-1.0)
    log(f"[trial] {cfg.task.name}/{cfg.task.difficulty} {cfg.model.name}: {len(sets.train)} train / "
        f"{len(sets.eval)} eval problems, Bp={cfg.Bp} n={cfg.n} M={total_steps} lr={C.learning_rate(cfg):.2e}"
        + (f", resuming at step {step}" if step else ""))

    window: list[dict[str, float]] = []
    started = time.perf_counter() - wall
    while True:
        if step % cfg.eval.every == 0 or step == total_steps:
            if not (records and records[-1]["step"] == step):
                record = {"step": step, "rollouts": step * per_step, "tokens": tokens,
                          "system/trainer_flops": 6 * params * tokens,
                          **evaluate(engine, sets.eval, cfg), **_average(window, step)}
                record["system/wall_s"] = time.perf_counter() - started
                is_best = record[f"eval/mean@{cfg.eval.k}"] > best
                best = max(best, record[f"eval/mean@{cfg.eval.k}"])
                save_checkpoint(out, policy, tokenizer, optimizer, record, is_best)
                append_record(out, record)
                records.append(record)
                log(f"[trial] step {step}/{total_steps} rollouts {record['rollouts']} "
                    f"mean@{cfg.eval.k} {record[f'eval/mean@{cfg.eval.k}']:.3f} "
                    f"best@{cfg.eval.k} {record[f'eval/best@{cfg.eval.k}']:.3f} "
                    f"worst@{cfg.eval.k} {record[f'eval/worst@{cfg.eval.k}']:.3f}")
            window = []
        if step == total_steps:
            return records

        # 1. sample n completions for each of Bp problems with the current policy
        problems = batch_problems(sets.train, cfg.Bp, step, cfg.seed)
        t0 = time.perf_counter()
        rollouts = engine.generate([p.prompt for p in problems], cfg.n, seed=cfg.seed * 1_000_003 + step)
        if rollouts.policy_version != step:
            raise RuntimeError(f"stale rollouts: policy version {rollouts.policy_version}, trainer at {step}")
        t1 = time.perf_counter()
        # 2. reward and group advantages
        rewards = torch.tensor([task.reward(problems[i // cfg.n], text) for i, text in enumerate(rollouts.texts)])
        advantages, adv_stats = group_advantages(rewards.view(cfg.Bp, cfg.n), cfg.algorithm.scale_adv_by_std)
        # 3. one policy-gradient step on the trainer's own log-probs
        batch = pack(rollouts, tokenizer.pad_token_id)
        t2 = time.perf_counter()
        policy.train()
        logits = policy(input_ids=batch["ids"], attention_mask=batch["attention"]).logits[:, :-1].float()
        logp = token_logprobs(logits, batch["ids"][:, 1:], cfg.rollout.temperature)
        with torch.no_grad():
            ref_logits = reference(input_ids=batch["ids"], attention_mask=batch["attention"]).logits[:, :-1].float()
            ref_logp = token_logprobs(ref_logits, batch["ids"][:, 1:], cfg.rollout.temperature)
        entropy = entropy_from_logits(logits / cfg.rollout.temperature, batch["mask"])
        loss, loss_stats = grpo_loss(
            logp, logp.detach(), advantages.reshape(-1), batch["mask"], cfg.algorithm.clip_low, cfg.algorithm.clip_high,
            kl_coef=kl_coef, ref_logp=ref_logp, entropy_coef=entropy_coef, entropy=entropy)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.algorithm.grad_clip)
        optimizer.step()
        t3 = time.perf_counter()
        # 4. publish the new weights to the rollout engine before the next rollout
        step += 1
        engine.update_weights(policy.state_dict(), version=step)
        t4 = time.perf_counter()

        tokens += rollouts.num_tokens
        mismatch = mismatch_metrics(logp.detach(), batch["rollout_logp"], batch["mask"])
        window.append({
            "train/reward": float(rewards.mean()),
            "train/kl": float(k3_kl(logp.detach(), ref_logp, batch["mask"])),
            "train/entropy": float(entropy.detach()),
            "train/loss": float(loss.detach()),
            "train/grad_norm": float(grad_norm),
            "train/frac_zero_std": float(adv_stats["frac_zero_std"]),
            "train/clip_frac": float(loss_stats["clip_frac"]),
            "rollout/length": rollouts.num_tokens / len(rollouts.texts),
            **{f"mismatch/{key}": float(value) for key, value in mismatch.items()},
            "time/generate_s": t1 - t0, "time/reward_s": t2 - t1, "time/train_s": t3 - t2, "time/sync_s": t4 - t3,
        })


def _average(window: list[dict[str, float]], step: int) -> dict[str, float | None]:
    """Mean of each training statistic over the steps since the last evaluation (null before any step)."""
    keys = ("train/reward", "train/kl", "train/entropy")
    if not window:
        return {key: None for key in keys} if step == 0 else {}
    return {key: sum(row[key] for row in window) / len(window) for key in window[0]}


# ---------------------------------------------------------------- checkpoints and records


def _checkpoint_dirs(out: Path) -> list[Path]:
    root = out / CHECKPOINTS
    return sorted(p for p in root.glob("step-*") if (p / STATE_FILE).exists()) if root.exists() else []


def save_checkpoint(out: Path, policy, tokenizer, optimizer, record: dict, is_best: bool) -> Path:
    """Write ``checkpoints/step-NNNNNN`` atomically; keep only the latest and the best."""
    root = out / CHECKPOINTS
    root.mkdir(exist_ok=True)
    final = root / f"step-{record['step']:06d}"
    tmp = root / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    torch.save({"optimizer": optimizer.state_dict(), "record": record, "best": is_best}, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    best_file = root / "best"
    if is_best:
        _atomic_write(best_file, final.name)
    keep = {final.name, best_file.read_text().strip() if best_file.exists() else ""}
    for old in _checkpoint_dirs(out):
        if old.name not in keep:
            shutil.rmtree(old)
    return final


def resume(out: Path, policy, optimizer) -> dict:
    """Load the latest checkpoint into ``policy`` and ``optimizer``; its step, tokens and wall time.

    Eval records newer than the checkpoint are dropped (they will be recomputed), and a record
    the checkpoint holds but the file lacks (a crash between the two writes) is restored, so no
    eval point is duplicated or lost.
    """
    found = _checkpoint_dirs(out)
    if not found:
        return {"step": 0, "tokens": 0, "wall_s": 0.0}
    latest = found[-1]
    weights = AutoModelForCausalLM.from_pretrained(latest, dtype=torch.float32).state_dict()
    policy.load_state_dict(weights)
    state = torch.load(latest / STATE_FILE, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    record = state["record"]
    kept = [r for r in read_records(out) if r["step"] < record["step"]] + [record]
    _atomic_write(out / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in kept))
    return {"step": record["step"], "tokens": record["tokens"], "wall_s": record["system/wall_s"]}


def read_records(out: Path) -> list[dict]:
    """The eval records of ``out/metrics.jsonl`` (empty if none)."""
    path = out / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def append_record(out: Path, record: dict) -> None:
    with open(out / METRICS_FILE, "a") as f:
        f.write(json.dumps(record) + "\n")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
