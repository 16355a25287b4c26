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
  rollouts 0), ``rollout/...``, ``mismatch/...`` and ``system/...`` figures, and
  ``prompt_format`` (``raw``, or ``chat``: every prompt wrapped by the tokenizer's chat template);
- ``checkpoints/step-NNNNNN/``: the two latest and the best (record mean@k) checkpoints, each a
  ``save_pretrained`` directory (safetensors) plus ``trainer_state.json``; written to a
  temporary name and renamed, so a crash never leaves a half-written checkpoint.

A file ``STOP`` in ``out`` ends the trial before its next step (an HPO study stopping it early); the
trial answers with ``STOPPED``. :mod:`isosweep.trial.files` owns the layout of ``out``.

Departures from the textbook loop: one optimizer step per batch, so the PPO ratio is 1 at the
step and the clip only matters when a correction reweights tokens; the entropy is measured every
step and the KL to the reference every ``algorithm.kl_every`` steps even when their coefficients
are 0, because they are the health signals of a run (with a non-zero KL weight, every step).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import random
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

from isosweep.algo.correction import ais_alpha, ais_weights, mismatch_metrics, tis_weights
from isosweep.algo.estimators import summarize
from isosweep.algo.grpo import entropy_from_logits, group_advantages, grpo_loss, k3_kl, token_logprobs
from isosweep.models.problemsets import probe_pass_rates, select
from isosweep.models.tokenizer import chat_prompt
from isosweep.models.warmup import PROBE_FILE, resolve_model
from isosweep.rollout.base import RolloutEngine, Rollouts, TemplatedEngine
from isosweep.rollout.fp8 import INT_BITS
from isosweep.rollout.hf import HFEngine
from isosweep.rollout.pool import RolloutPool, actor_names
from isosweep.rollout.vllm import VLLMEngine
from isosweep.spec.profiles import get_profile, vllm_engine_args
from isosweep.spec.trial import (
    DIFFICULTY_BANDS,
    TrialConfig,
    engine_choice,
    entropy_coef,
    eval_steps,
    kl_coef,
    learning_rate,
    resolve_prompt_format,
    rollout_engine,
    steps,
    task_of,
)
from isosweep.spec.yamlio import ConfigError
from isosweep.tasks import Problem, Task
from isosweep.track.curves import COUNTS_KEY, EVAL_SET_KEY, SAMPLES_KEY
from isosweep.trial.files import TrialDir, disk_full, kill_point, out_of_space
from isosweep.trial.learner import (
    gathered_state_dict,
    init_distributed,
    load_state,
    make_learner,
    save_state,
    schedule_rate,
)

PROBE_POOL, PROBE_SAMPLES = 1024, 8
"""Pool size and samples per problem when a non-tiny model's problem sets must be probed."""

PROMPT_FORMAT_KEY = "prompt_format"
"""Eval-record key of the prompt format the trial sampled with (``raw`` or ``chat``)."""


@dataclass(frozen=True)
class ProblemSets:
    """Train problems and held-out eval problems of one difficulty."""

    train: list[Problem]
    eval: list[Problem]


EVAL_ORDER_SEED = "eval-set"
"""Seed of the shuffle that picks the eval subset from the held-out problems (not the training seed)."""


def problem_sets(cfg: TrialConfig, model_path: str, engine: RolloutEngine) -> ProblemSets:
    """The easy or hard set of ``cfg.task`` for this base model, from its probe (measured now if absent)."""
    probe_file = Path(model_path) / PROBE_FILE
    if probe_file.exists():
        probe = json.loads(probe_file.read_text())
    else:
        probe = probe_pass_rates(engine, task_of(cfg.task), cfg.task.levels, PROBE_POOL, PROBE_SAMPLES, cfg.seed)
    band = DIFFICULTY_BANDS[cfg.task.difficulty]
    train = select(probe, cfg.task.name, "train", cfg.task.levels, band)
    held_out = select(probe, cfg.task.name, "eval", cfg.task.levels, band)
    if len(train) < cfg.Bp or not held_out:
        raise ConfigError(
            f"task.difficulty={cfg.task.difficulty!r} on levels {list(cfg.task.levels)} leaves {len(train)} train and "
            f"{len(held_out)} eval problems for this base model (base pass rate in {band}); "
            f"allowed: at least Bp = {cfg.Bp} train problems and one eval problem -- choose other levels")
    # The eval subset depends on the task, its levels and band and the base model (through the probe),
    # never on the training seed: every trial of a study is scored on the same problems, so configs and
    # seeds can be compared problem by problem (paired), and a second seed adds information, not noise.
    random.Random(EVAL_ORDER_SEED).shuffle(held_out)
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


def eval_correct(engine: RolloutEngine, problems: list[Problem], task: Task, samples: int, seed: int,
                 temperature: float | None = None) -> np.ndarray:
    """0/1 correctness of ``samples`` completions per problem at ``temperature`` (None: the engine's), shape
    ``(problems, samples)``."""
    rollouts = engine.generate([p.prompt for p in problems], samples, seed=seed, temperature=temperature)
    correct = [task.reward(problems[i // samples], text) for i, text in enumerate(rollouts.texts)]
    return np.array(correct).reshape(len(problems), samples)


def eval_set_id(problems: list[Problem]) -> str:
    """A short hash of the eval problems, in order: trials with the same id were scored on the same problems."""
    return hashlib.sha1("\n".join(f"{p.prompt}\t{p.answer}" for p in problems).encode()).hexdigest()[:12]


def refuse_other_eval_set(trial: TrialDir, problems: list[Problem]) -> None:
    """Raise :class:`ConfigError` if ``trial`` holds records scored on other eval problems than ``problems``: they
    ran on another base model (a tiny one built by another isosweep version, or on another CPU before version 2 of
    the warm-up) or other task settings, and resuming would splice two experiments into one curve."""
    earlier = sorted({r[EVAL_SET_KEY] for r in trial.records() if r.get(EVAL_SET_KEY)})
    now = eval_set_id(problems)
    if earlier and earlier != [now]:
        raise ConfigError(
            f"{trial.path}: its records were scored on eval set {', '.join(earlier)}, but this base model and task "
            f"give eval set {now}: the trial ran on another build of the base model (or other task settings), so it "
            "cannot be resumed here; give the trial another output folder, or remove this one to start it again")


def evaluate(engine: RolloutEngine, problems: list[Problem], cfg: TrialConfig) -> dict:
    """``eval/mean@k``, ``eval/best@k``, ``eval/worst@k`` (and the stderr of mean@k) on held-out problems,
    plus the per-problem correct counts (``eval_correct``, out of ``eval_samples``; problem order of
    ``eval_set``) from which every statistic can be recomputed, and paired across trials."""
    correct = eval_correct(engine, problems, task_of(cfg.task), cfg.eval.samples, seed=cfg.seed + 7_919,
                           temperature=cfg.eval.temperature)
    return {**{f"eval/{key}": value for key, value in summarize(correct, cfg.eval.k).items()},
            COUNTS_KEY: [int(c) for c in correct.sum(axis=1)], SAMPLES_KEY: cfg.eval.samples,
            EVAL_SET_KEY: eval_set_id(problems)}


def load_policy(model_path: str | Path) -> torch.nn.Module:
    """The fp32 model at ``model_path`` (a folder or hub name), from safetensors only: a pickled
    ``pytorch_model.bin`` could run code when loaded, so a model without safetensors weights is an error."""
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, use_safetensors=True)


def make_engine(cfg: TrialConfig, model_path: str, tokenizer, rank: int, run_id: str) -> tuple[RolloutEngine, bool]:
    """The rollout engine of ``cfg.rollout.engine`` and whether it is shared by all trainer workers.

    ``hf``: an in-process model per worker. ``vllm``: inside a Ray job, ``cfg.rollout.actors``
    vLLM actors that rank 0 starts and every rank shares (rank 0 alone publishes weights);
    outside Ray, one in-process vLLM engine.
    """
    if rollout_engine(cfg) == "hf":
        model = load_policy(model_path)
        model.to("cuda" if torch.cuda.is_available() else "cpu")
        return HFEngine(model, tokenizer, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                        precision=cfg.rollout.precision), False
    import ray

    if not ray.is_initialized():
        return VLLMEngine(model_path, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                          precision=cfg.rollout.precision, seed=cfg.seed), False
    profile = get_profile(cfg.profile)
    # A name per launch of the worker group: after a worker dies, Ray Train restarts the group in the same run,
    # and the dead group's actors may still hold their names while Ray reclaims them.
    launch = [uuid.uuid4().hex[:8] if rank == 0 else None]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(launch, src=0)
    names = actor_names(run_id, launch[0], cfg.rollout.actors)
    pool = None
    if rank == 0:
        pool = RolloutPool.spawn(names, model_path, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                                 cfg.rollout.precision, cfg.seed, profile.rollout.CPU, profile.rollout.GPU,
                                 weight_sync=profile.weight_sync,
                                 engine_kwargs=vllm_engine_args(profile, cfg.rollout.precision))
    if dist.get_world_size() > 1:
        dist.barrier()
    return pool or RolloutPool.attach(names), True


def train_loop(cfg: TrialConfig, out: str | Path, log: Callable[[str], None] = print,
               report: Callable[[dict], None] | None = None, run_id: str = "local",
               launch: dict[str, float] | None = None) -> list[dict]:
    """Run (or resume) one trial into ``out``; returns the eval records, one per evaluation.

    The first eval record of each launch holds where its fixed cost went, ``time/start_<phase>_s``: the
    phases of ``launch`` (what the caller spent before this call: a Ray Train job's start-up), then this
    function's own (distributed group, model, engine, problem sets, learner, resume).

    Runs on every trainer worker (``report`` is ``ray.train.report`` inside a Ray Train job):
    each worker takes its share of the step's problems, DeepSpeed averages the gradients, rank 0
    evaluates, checkpoints, writes the metrics and publishes the weights to shared rollout actors.
    """
    trial = TrialDir(out)
    gpu = torch.cuda.is_available()
    clock = [time.perf_counter()]
    startup: dict[str, float] = dict(launch or {})  # where this launch's fixed cost went, in its first eval record

    def lap(name: str) -> None:
        clock.append(time.perf_counter())
        startup[f"time/start_{name}_s"] = clock[-1] - clock[-2]

    rank, world = init_distributed("nccl" if gpu else "gloo")
    torch.manual_seed(cfg.seed)
    lap("distributed")
    model_path = resolve_model(cfg.model.name, cfg.task.name, cfg.model.warmup_seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    prompt_format, prompt_why = resolve_prompt_format(tokenizer, cfg.task.prompt_format)
    policy = load_policy(model_path)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    lap("model")
    engine, shared_engine = make_engine(cfg, model_path, tokenizer, rank, run_id)
    if prompt_format == "chat":  # from here on every prompt sampled -- probe, training, eval -- is wrapped
        engine = TemplatedEngine(engine, functools.partial(chat_prompt, tokenizer))
    lap("engine")
    sets = problem_sets(cfg, model_path, engine)
    if rank == 0:
        refuse_other_eval_set(trial, sets.eval)
    task = task_of(cfg.task)
    lap("problems")
    learner = make_learner(policy, cfg, gpu)
    lap("learner")
    device = learner.device
    reference.to(device)
    total_steps, per_step = steps(cfg), cfg.Bp * cfg.n
    evals = set(eval_steps(cfg))
    kl_weight, entropy_weight = kl_coef(cfg), entropy_coef(cfg)
    params = sum(p.numel() for p in policy.parameters())
    publisher = rank == 0 or not shared_engine
    rounded_copy = cfg.rollout.precision in INT_BITS or (
        cfg.rollout.precision == "fp8" and not (gpu and rollout_engine(cfg) == "vllm"))

    state = resume(trial, learner, rank, world, log)
    step, tokens, wall = state["step"], state["tokens"], state["wall_s"]
    records = trial.records() if rank == 0 else []
    if publisher:
        engine.update_weights(gathered_state_dict(learner), version=step)
    if world > 1:
        dist.barrier()
    lap("resume")
    best = max((r[f"eval/mean@{cfg.eval.k}"] for r in records), default=-1.0)
    if rank == 0:
        engine_name, why = engine_choice(cfg)
        log(f"[trial] {cfg.task.name}/{cfg.task.difficulty} {cfg.model.name}: {len(sets.train)} train / "
            f"{len(sets.eval)} eval problems, Bp={cfg.Bp} n={cfg.n} M={total_steps} lr={learning_rate(cfg):.2e} "
            f"rollouts={engine_name}/{cfg.rollout.precision} ({why}) correction={cfg.algorithm.correction} "
            f"workers={world} threads={torch.get_num_threads()}"
            + (f" eval_temperature={cfg.eval.temperature:g}" if cfg.eval.temperature is not None else "")
            + (f", resuming at step {step}" if step else ""))
        log(f"[trial] prompts: {prompt_format} ({prompt_why})")

    window: list[dict[str, float]] = state["window"]  # steps since the last eval record (resumed between two)
    started = time.perf_counter() - wall
    while True:
        if step in evals:
            record = None  # rank 0 evaluates unless this step's record exists (a resumed run)
            # a rollout copy rounded below bf16 is not the model being trained: evaluate its bf16 weights (where the
            # engine rounds them itself; vLLM's own FP8 on a GPU quantizes whatever it is sent)
            exact = gathered_state_dict(learner) if rounded_copy else None  # all ranks (ZeRO-3)
            if rank == 0 and not (records and records[-1]["step"] == step):
                t_eval = time.perf_counter()
                if exact is not None:
                    engine.update_weights(exact, version=step, at_precision=False)
                scores = evaluate(engine, sets.eval, cfg)
                if exact is not None:
                    engine.update_weights(exact, version=step)
                record = {"step": step, "rollouts": step * per_step, "tokens": tokens,
                          "system/trainer_flops": 6 * params * tokens, PROMPT_FORMAT_KEY: prompt_format,
                          **scores, **_average(window, step)}
                record["time/eval_s"] = time.perf_counter() - t_eval
                record["system/wall_s"] = time.perf_counter() - started
                record.update(startup)
                startup = {}
            record = _broadcast(record, world)
            if record is not None:
                is_best = record[f"eval/mean@{cfg.eval.k}"] > best
                best = max(best, record[f"eval/mean@{cfg.eval.k}"])
                save_checkpoint(trial, learner, tokenizer, record, is_best, rank, world)
                if rank == 0:
                    kill_point("checkpoint-committed")
                    trial.append_record(record)
                    kill_point("record-appended")
                    records.append(record)
                    log(f"[trial] step {step}/{total_steps} rollouts {record['rollouts']} "
                        f"mean@{cfg.eval.k} {record[f'eval/mean@{cfg.eval.k}']:.3f} "
                        f"best@{cfg.eval.k} {record[f'eval/best@{cfg.eval.k}']:.3f} "
                        f"worst@{cfg.eval.k} {record[f'eval/worst@{cfg.eval.k}']:.3f}")
                if report is not None:
                    report(record)
            window = []
        if step == total_steps:
            return records
        if _broadcast(trial.stop_requested() if rank == 0 else None, world):
            if rank == 0:
                log(f"[trial] stopped at step {step}/{total_steps}: {trial.stop_reason()}")
                trial.acknowledge_stop(step)
            return records

        # 1. sample n completions for each of this worker's Bp / world problems
        t_step = time.perf_counter()
        problems = batch_problems(sets.train, cfg.Bp, step, cfg.seed)[rank::world]
        t0 = time.perf_counter()
        rollouts = engine.generate([p.prompt for p in problems], cfg.n, seed=(cfg.seed * 1_000_003 + step) * 64 + rank)
        if rollouts.policy_version != step:
            raise RuntimeError(f"stale rollouts: policy version {rollouts.policy_version}, trainer at {step}")
        t1 = time.perf_counter()
        # 2. reward and group advantages
        rewards = torch.tensor([task.reward(problems[i // cfg.n], text) for i, text in enumerate(rollouts.texts)])
        advantages, adv_stats = group_advantages(rewards.view(len(problems), cfg.n), cfg.algorithm.scale_adv_by_std)
        advantages = advantages.reshape(-1).to(device)
        batch = {k: v.to(device) for k, v in pack(rollouts, tokenizer.pad_token_id).items()}
        mask = batch["mask"]
        t2 = time.perf_counter()
        # 3. the trainer recomputes log-probs of the sampled tokens (and the reference's)
        learner.train()
        logits = learner(input_ids=batch["ids"], attention_mask=batch["attention"]).logits[:, :-1].float()
        logp = token_logprobs(logits, batch["ids"][:, 1:], cfg.rollout.temperature)
        ref_logp = None  # the reference's forward: for the loss when the KL weight is non-zero, else a health sample
        if kl_weight > 0 or step % cfg.algorithm.kl_every == 0 or step + 1 in evals:  # every eval record has one
            with torch.no_grad():
                ref_logits = reference(input_ids=batch["ids"], attention_mask=batch["attention"]).logits[:, :-1]
                ref_logp = token_logprobs(ref_logits.float(), batch["ids"][:, 1:], cfg.rollout.temperature)
        old_logp = logp.detach()
        mismatch = mismatch_metrics(old_logp, batch["rollout_logp"], mask)
        alpha, ais_stats = ais_alpha(old_logp, batch["rollout_logp"], advantages, mask, cfg.algorithm.is_cap,
                                     cfg.algorithm.ais_delta, cfg.algorithm.ais_beta, cfg.algorithm.ais_gamma)
        weights = {
            "none": lambda: None,
            "tis": lambda: tis_weights(old_logp, batch["rollout_logp"], mask, cfg.algorithm.is_cap)[0],
            "ais": lambda: ais_weights(old_logp, batch["rollout_logp"], mask, alpha, cfg.algorithm.is_cap),
        }[cfg.algorithm.correction]()
        t3 = time.perf_counter()
        # 4. one GRPO step (DeepSpeed averages gradients across workers and clips them)
        entropy = entropy_from_logits(logits / cfg.rollout.temperature, mask)
        loss, loss_stats = grpo_loss(
            logp, old_logp, advantages, mask, cfg.algorithm.clip_low, cfg.algorithm.clip_high,
            kl_coef=kl_weight, ref_logp=ref_logp, entropy_coef=entropy_weight, entropy=entropy, weights=weights)
        learner.backward(loss)
        rate = schedule_rate(learner, cfg, step)
        learner.step()
        grad_norm = learner.get_global_grad_norm()
        t4 = time.perf_counter()
        # 5. publish the new weights before the next rollout
        step += 1
        if publisher:
            engine.update_weights(gathered_state_dict(learner), version=step)
        if shared_engine and world > 1:
            dist.barrier()  # no worker samples before rank 0 has published version `step`
        t5 = time.perf_counter()

        stats = _all_mean({
            "train/reward": float(rewards.mean()),
            **({"train/kl": float(k3_kl(old_logp, ref_logp, mask))} if ref_logp is not None else {}),
            "train/entropy": float(entropy.detach()),
            "train/loss": float(loss.detach()),
            "train/frac_zero_std": float(adv_stats["frac_zero_std"]),
            "train/clip_frac": float(loss_stats["clip_frac"]),
            "rollout/length": rollouts.num_tokens / len(rollouts.texts),
            "rollout/tokens": float(rollouts.num_tokens),
            **{f"mismatch/{key}": float(value) for key, value in mismatch.items()},
            **{f"ais/{key}": float(value) for key, value in ais_stats.items()},
        }, world)
        stats.update({"train/grad_norm": float(grad_norm or 0.0), "train/lr": rate, "rollout/policy_version": rollouts.policy_version,
                      "time/generate_s": t1 - t0, "time/reward_s": t2 - t1, "time/logprob_s": t3 - t2,
                      "time/train_s": t4 - t3, "time/sync_s": t5 - t4, "time/step_s": time.perf_counter() - t_step})
        tokens += int(round(stats["rollout/tokens"] * world))
        window.append(stats)
        if rank == 0:
            trial.append_step({"step": step, "rollouts": step * per_step, **stats})
        every = cfg.eval.checkpoint_every
        if every and step % every == 0 and step not in evals:  # bounds what a crash loses between far-apart evals
            at = {"step": step, "tokens": tokens, "system/wall_s": time.perf_counter() - started}
            save_checkpoint(trial, learner, tokenizer, records[-1] if records else None, False, rank, world, at)


def _average(window: list[dict[str, float]], step: int) -> dict[str, float | None]:
    """Mean of each training statistic over the steps since the last evaluation (null before any step).

    A statistic measured on some steps only (``train/kl`` with a zero KL weight) is the mean over those.
    """
    keys = ("train/reward", "train/kl", "train/entropy")
    if not window:
        return {key: None for key in keys} if step == 0 else {}
    keys_seen = dict.fromkeys(key for row in window for key in row)  # in order, each once
    measured = {key: [row[key] for row in window if key in row] for key in keys_seen}
    return {key: sum(values) / len(values) for key, values in measured.items()}


def _all_mean(stats: dict[str, float], world: int) -> dict[str, float]:
    """Average scalar statistics over trainer workers (the identity for one worker)."""
    if world == 1:
        return stats
    values = torch.tensor(list(stats.values()), dtype=torch.float64)
    dist.all_reduce(values)
    return dict(zip(stats, (values / world).tolist()))


def _broadcast(obj, world: int):
    """Rank 0's ``obj`` on every rank."""
    if world == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---------------------------------------------------------------- checkpoints


def save_checkpoint(trial: TrialDir, learner, tokenizer, record: dict | None, is_best: bool, rank: int, world: int,
                    at: dict | None = None) -> Path:
    """Write the checkpoint of ``record["step"]`` -- or, between evaluations, of ``at["step"]`` (``at``: the
    step, tokens and wall time; ``record`` then the last eval record) -- atomically (temporary name, then
    rename); keep the two latest and the best.

    Every rank writes its DeepSpeed partition; rank 0 writes the model (safetensors), the
    tokenizer and the eval record, then renames the directory once all ranks are done.
    """
    step = at["step"] if at else record["step"]
    tmp = trial.checkpoint_tmp(step)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if world > 1:
        dist.barrier()
    weights = gathered_state_dict(learner)
    try:
        save_state(learner, tmp / "deepspeed")
        if rank == 0:
            learner.module.save_pretrained(tmp, state_dict=weights, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            trial.write_checkpoint_state(tmp, record, is_best, at)
    except (OSError, RuntimeError) as e:  # torch reports a failed write as a RuntimeError
        if not out_of_space(e, trial.path):
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # give the space of the half-written checkpoint back
        raise disk_full(trial.path, f"the checkpoint of step {step} ({tmp})") from e
    if world > 1:
        dist.barrier()
    final = trial.checkpoint_at(step)
    if rank == 0:
        kill_point("checkpoint-written")
        trial.commit_checkpoint(step, is_best)
    if world > 1:
        dist.barrier()
    return final


def resume(trial: TrialDir, learner, rank: int, world: int = 1, log: Callable[[str], None] = print) -> dict:
    """Load the latest good checkpoint into the learner (weights and optimizer state); its step, tokens and wall time.

    Records newer than the checkpoint are dropped (they will be recomputed), and a record the
    checkpoint holds but the file lacks (a crash between the two writes) is restored, so no eval
    point is duplicated or lost. Per-step statistics are truncated the same way.

    A damaged checkpoint (a file cut short or unreadable: :meth:`TrialDir.checkpoint_problem`, or an
    optimizer state DeepSpeed cannot load) is set aside as ``damaged-step-N`` and the one before it
    used; training is deterministic, so the steps redone give the values they gave before. Rank 0
    decides, so every worker resumes from the same checkpoint. If no checkpoint is usable, a
    ``RuntimeError`` names the damaged files and what to do.
    """
    damaged: list[str] = []
    for checkpoint in reversed(trial.checkpoints()):
        problem = trial.checkpoint_problem(checkpoint) if rank == 0 else None
        problem = _broadcast(problem, world)
        if problem is None:
            try:
                load_state(learner, checkpoint / "deepspeed")
            except Exception as e:  # a truncated or unreadable optimizer state
                problem = f"{checkpoint / 'deepspeed'}: DeepSpeed could not load it ({type(e).__name__}: {e})"
            problem = next((p for p in _gather(problem, world) if p is not None), None)  # any rank's failure
        if problem is None:
            record, at = trial.checkpoint_record(checkpoint), trial.checkpoint_position(checkpoint)
            # the steps since the record, for the next record's averages (a checkpoint between evaluations)
            since = trial.truncate_to(record, at["step"]) if rank == 0 else []
            window = [{k: v for k, v in row.items() if k not in ("step", "rollouts")} for row in since]
            return {"step": at["step"], "tokens": at["tokens"], "wall_s": at["system/wall_s"], "window": window}
        damaged.append(problem)
        if world > 1:
            dist.barrier()
        if rank == 0:
            moved = trial.set_aside(checkpoint)
            log(f"[trial] checkpoint {checkpoint.name} is damaged ({problem}); set aside as {moved.name}, "
                "resuming from the one before it")
    if damaged:
        raise RuntimeError(f"no usable checkpoint in {trial.checkpoint_root}: " + "; ".join(damaged)
                           + f". Restore the files, or remove {trial.path} to run the trial again from the start")
    if rank == 0:
        trial.reset()
    return {"step": 0, "tokens": 0, "wall_s": 0.0, "window": []}


def _gather(obj, world: int) -> list:
    """Every rank's ``obj``, in rank order (``[obj]`` for one worker)."""
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out
