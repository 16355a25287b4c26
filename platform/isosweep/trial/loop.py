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
trial answers with ``STOPPED``. A file ``PAUSE`` naming a number of rollouts ends it at its first evaluation
at or past them (an adaptive sweep's rung), checkpointed there, to be started again or not. :mod:`isosweep.trial.files` owns the layout of ``out``.

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
from torch import Tensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from isosweep.algo.estimators import summarize
from isosweep.algo.grpo import group_advantages
from isosweep.models.problemsets import probe_pass_rates, rate_prior, rated, select, zero_signal
from isosweep.models.tokenizer import chat_prompt
from isosweep.models.sizes import SIZES
from isosweep.models.warmup import PROBE_FILE, recipe_for, resolve_model
from isosweep.rollout.base import RolloutEngine, Rollouts, TemplatedEngine
from isosweep.rollout.fp8 import INT_BITS
from isosweep.rollout.hf import HFEngine
from isosweep.rollout.placement import actor_names, release
from isosweep.rollout.pool import RolloutPool
from isosweep.rollout.vllm import VLLMEngine
from isosweep.spec.profiles import get_profile, placement_bundles, vllm_engine_args
from isosweep.spec.trial import (
    TrialConfig,
    difficulty_band,
    engine_choice,
    eval_steps,
    kl_coef,
    learning_rate,
    resolve_prompt_format,
    rollout_engine,
    rollout_precision,
    steps,
    task_of,
)
from isosweep.spec.yamlio import ConfigError
from isosweep.tasks import Problem, Task
from isosweep.track.curves import COUNTS_KEY, EVAL_SET_KEY, SAMPLES_KEY
from isosweep.trial.files import TrialDir, disk_full, kill_point, out_of_space
from isosweep.trial.learner import (
    GatheredWeights,
    gathered_state_dict,
    init_distributed,
    load_state,
    make_learner,
    make_reference,
    parameter_count,
    save_state,
    schedule_rate,
)
from isosweep.trial.step import micro_slices, policy_update

PROBE_POOL, PROBE_SAMPLES = 1024, 8
"""Pool size and samples per problem when a non-tiny model's problem sets must be probed."""

PROMPT_FORMAT_KEY = "prompt_format"
"""Eval-record key of the prompt format the trial sampled with (``raw`` or ``chat``)."""


@dataclass(frozen=True)
class ProblemSets:
    """Train problems and held-out eval problems of one difficulty, and what the probe says about them."""

    train: list[Problem]
    eval: list[Problem]
    counts: dict[str, tuple[int, int]]
    """Each train problem's probe, by prompt: ``(successes, samples)``."""
    prior: tuple[float, float]
    """The empirical-Bayes prior of pass rates over the probed train pool (:func:`rate_prior`)."""
    watch: dict[str, list[Problem]]
    """Held-out problems of each difficulty in ``eval.watch``, evaluated beside the eval set."""


EVAL_ORDER_SEED = "eval-set"
"""Seed of the shuffle that picks the eval subset from the held-out problems (not the training seed)."""


def probe_samples(cfg: TrialConfig) -> int:
    """Samples per problem behind the probe of ``cfg``'s base model, where its rows do not say: a tiny model's
    warm-up recipe's, else :data:`PROBE_SAMPLES`."""
    if cfg.model.name in SIZES:
        return recipe_for(cfg.model.name, cfg.task.name).probe_samples
    return PROBE_SAMPLES


def problem_sets(cfg: TrialConfig, model_path: str, engine: RolloutEngine | None) -> ProblemSets:
    """The easy or hard set of ``cfg.task`` for this base model, from its probe (measured now with ``engine`` if
    absent; ``engine`` None: the model must carry its probe, as the tiny and tabular base models do)."""
    probe_file = Path(model_path) / PROBE_FILE
    if probe_file.exists():
        probe = json.loads(probe_file.read_text())
    elif engine is None:
        raise ValueError(f"{model_path} has no {PROBE_FILE}, and no engine was given to measure one")
    else:
        probe = probe_pass_rates(engine, task_of(cfg.task), cfg.task.levels, PROBE_POOL, PROBE_SAMPLES, cfg.seed)
    task = task_of(cfg.task)
    band = difficulty_band(task, cfg.task.difficulty)
    default = probe_samples(cfg)
    train = rated(probe, cfg.task.name, "train", cfg.task.levels, band, default)
    held_out = select(probe, cfg.task.name, "eval", cfg.task.levels, band)
    if len(train) < cfg.Bp or not held_out:
        raise ConfigError(
            f"task.difficulty={cfg.task.difficulty!r} on levels {list(cfg.task.levels)} leaves {len(train)} train and "
            f"{len(held_out)} eval problems for this base model (base pass rate in {band}); "
            f"allowed: at least Bp = {cfg.Bp} train problems and one eval problem -- choose other levels")
    # The eval subset depends on the task, its levels and band and the base model (through the probe),
    # never on the training seed: every trial of a study is scored on the same problems, so configs and
    # seeds can be compared problem by problem (paired), and a second seed adds information, not noise.
    watch = {}
    for difficulty in cfg.eval.watch:
        watched = select(probe, cfg.task.name, "eval", cfg.task.levels, difficulty_band(task, difficulty))
        random.Random(EVAL_ORDER_SEED).shuffle(watched)
        watch[difficulty] = watched[:cfg.task.eval_problems]
    random.Random(EVAL_ORDER_SEED).shuffle(held_out)
    pool = [row for level in cfg.task.levels for row in probe["train"].get(str(level), [])]
    return ProblemSets([p for p, _ in train], held_out[:cfg.task.eval_problems], dict((p.prompt, c) for p, c in train),
                       rate_prior([row["rate"] for row in pool], pool[0].get("samples", default)), watch)


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


def watched(engine: RolloutEngine, problems: list[Problem], difficulty: str, cfg: TrialConfig) -> dict[str, float]:
    """``watch/<difficulty>/mean@k``, ``best@k``, ``worst@k`` and ``stderr_mean@k`` of held-out problems of another
    difficulty than the trial trains on (``eval.watch``), sampled as the eval set is; no counts are kept."""
    if not problems:
        return {}
    scores = evaluate(engine, problems, cfg)
    keys = [f"{name}@{cfg.eval.k}" for name in ("mean", "best", "worst", "stderr_mean")]
    return {f"watch/{difficulty}/{key}": scores[f"eval/{key}"] for key in keys}


def load_policy(model_path: str | Path) -> torch.nn.Module:
    """The fp32 model at ``model_path`` (a folder or hub name), from safetensors only: a pickled
    ``pytorch_model.bin`` could run code when loaded, so a model without safetensors weights is an error."""
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, use_safetensors=True)


def make_engine(cfg: TrialConfig, model_path: str, tokenizer, rank: int, run_id: str) -> tuple[RolloutEngine, bool]:
    """The rollout engine of ``cfg.rollout.engine`` and whether it is shared by all trainer workers.

    ``hf``: an in-process model per worker. ``vllm``: inside a Ray job, ``cfg.rollout.actors``
    vLLM actors that rank 0 starts in a placement group of the profile's packing, samples from and
    publishes to for every worker; outside Ray, one in-process vLLM engine.
    """
    precision = rollout_precision(cfg)
    if rollout_engine(cfg) == "hf":
        model = load_policy(model_path)
        model.to("cuda" if torch.cuda.is_available() else "cpu")
        return HFEngine(model, tokenizer, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                        precision=None if precision == "fp32" else precision), False
    import ray

    if not ray.is_initialized():
        return VLLMEngine(model_path, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                          precision=precision, seed=cfg.seed), False
    profile = get_profile(cfg.profile)
    # A name per launch of the worker group: after a worker dies, Ray Train restarts the group in the same run,
    # and the dead group's actors may still hold their names while Ray reclaims them.
    launch = [uuid.uuid4().hex[:8] if rank == 0 else None]
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(launch, src=0)
    names = actor_names(run_id, launch[0], cfg.rollout.actors)
    pool = None
    if rank == 0:
        release(run_id)  # an earlier launch's actors and placement group (a restarted worker group)
        strategy = placement_bundles(profile, cfg.trainer.num_workers, cfg.rollout.actors)[1]
        pool = RolloutPool.spawn(names, model_path, cfg.rollout.max_new_tokens, cfg.rollout.temperature,
                                 precision, cfg.seed, profile.rollout.CPU, profile.rollout.GPU,
                                 weight_sync=profile.weight_sync, engine_kwargs=vllm_engine_args(profile, precision),
                                 strategy=strategy)
    if dist.get_world_size() > 1:
        dist.barrier()
    return pool or RolloutPool.attach(names), True


@dataclass(frozen=True)
class Worker:
    """This trainer worker among the others of its trial."""

    rank: int
    world: int
    device: torch.device
    shared_engine: bool
    """Whether every worker uses the same rollout engines (rank 0's vLLM actors) or has its own."""

    @property
    def drives_engine(self) -> bool:
        """Whether this worker samples from and publishes to its engine (with shared engines, rank 0 alone)."""
        return self.rank == 0 or not self.shared_engine


def decide_once(decide: Callable[[], object], rank: int, world: int):
    """``decide()`` run on rank 0 alone and its result on every rank; if it raised, every rank raises (rank 0 its
    own error, the others a ``RuntimeError`` naming it), so no rank waits for a decision that never comes.

    For what must agree across workers and may differ if each computed it (a probe of problem difficulty through
    shared engines: GPU sampling is not batch-invariant)."""
    result, error = None, None
    if rank == 0:
        try:
            result = decide()
        except Exception as e:
            error = e
    if world > 1:
        box = [(result, None if error is None else f"{type(error).__name__}: {error}")]
        dist.broadcast_object_list(box, src=0)
        result, message = box[0]
        if rank != 0 and message is not None:
            raise RuntimeError(f"rank 0 failed to decide: {message}")
    if error is not None:
        raise error
    return result


def publish(engine: RolloutEngine, learner, worker: Worker, version: int, at_precision: bool = True) -> None:
    """Serve the learner's weights as policy ``version``. Call it on every worker: under ZeRO-3 each weight is
    gathered from its partitions (a collective, :class:`GatheredWeights`) one at a time; the workers that drive
    an engine send each as it comes, the others only join the gathers; with shared engines no worker goes on
    before rank 0 has published."""
    weights = GatheredWeights(learner)
    if worker.drives_engine:
        engine.update_weights(weights, version=version, at_precision=at_precision)
    else:
        weights.drain()
    if worker.shared_engine and worker.world > 1:
        dist.barrier()


def sample(engine: RolloutEngine, problems: list[Problem], n: int, seed: int, worker: Worker) -> Rollouts:
    """This worker's share of the step's rollouts: ``n`` completions of each of ``problems[rank::world]``.

    With shared engines rank 0 asks for the whole step in one call (an engine serves one call at a time: a call
    per worker would run the engines' batches one after another) and hands each worker its share."""
    if not worker.shared_engine:
        mine = problems[worker.rank::worker.world]
        return engine.generate([p.prompt for p in mine], n, seed=seed * 64 + worker.rank)
    shares = None
    if worker.rank == 0:
        rollouts = engine.generate([p.prompt for p in problems], n, seed=seed * 64)
        shares = [rollouts.select(range(r, len(problems), worker.world), n) for r in range(worker.world)]
    if worker.world == 1:
        return shares[0]
    box = [None]
    dist.scatter_object_list(box, shares, src=0)
    return box[0]


def agreed_widths(attention: Tensor, parts: list[slice], worker: Worker) -> list[int]:
    """Columns of each micro-batch, the largest over the workers: under ZeRO-3 every forward gathers
    parameters layer by layer and the output head chunk by chunk (:mod:`isosweep.trial.step`), so every worker
    must run micro-batches of the same shape."""
    widths = torch.tensor([int(attention[rows].sum(dim=1).max()) for rows in parts], device=worker.device)
    if dist.is_initialized():  # on the device, as every collective here (see mean_over_workers)
        dist.all_reduce(widths, op=dist.ReduceOp.MAX)
    return [int(w) for w in widths.tolist()]


def evaluate_step(engine: RolloutEngine, learner, sets: ProblemSets, cfg: TrialConfig, worker: Worker, step: int,
                  records: list[dict], exact_weights: bool) -> dict | None:
    """Rank 0's evaluation of the weights after ``step`` steps (None where its record exists: a resumed run), on
    every rank. ``exact_weights``: the rollout copy is rounded below bf16, so the bf16 weights are evaluated and
    the rounded copy restored after (every rank joins the gathers)."""
    exact = gathered_state_dict(learner, keep=worker.rank == 0) if exact_weights else None
    scores = None
    if worker.rank == 0 and not (records and records[-1]["step"] == step):
        t_eval = time.perf_counter()
        if exact is not None:
            engine.update_weights(exact, version=step, at_precision=False)
        scores = evaluate(engine, sets.eval, cfg)
        for difficulty, problems in sets.watch.items():
            scores.update(watched(engine, problems, difficulty, cfg))
        if exact is not None:
            engine.update_weights(exact, version=step)
        scores["time/eval_s"] = time.perf_counter() - t_eval
    return _broadcast(scores, worker.world)


def train_step(cfg: TrialConfig, engine: RolloutEngine, learner, reference, sets: ProblemSets, task: Task,
               worker: Worker, step: int, pad_id: int, with_reference: bool) -> dict[str, float]:
    """One GRPO step on every worker: sample, reward, group advantages, one micro-batched optimizer step
    (:func:`isosweep.trial.step.policy_update`), publish the new weights as version ``step + 1``; returns the
    step's statistics averaged over the workers, with its timings."""
    t_step = time.perf_counter()
    problems = batch_problems(sets.train, cfg.Bp, step, cfg.seed)
    rollouts = sample(engine, problems, cfg.n, cfg.seed * 1_000_003 + step, worker)
    if rollouts.policy_version != step:
        raise RuntimeError(f"stale rollouts: policy version {rollouts.policy_version}, trainer at {step}")
    mine = problems[worker.rank::worker.world]
    t1 = time.perf_counter()
    rewards = torch.tensor([task.reward(mine[i // cfg.n], text) for i, text in enumerate(rollouts.texts)])
    advantages, adv_stats = group_advantages(rewards.view(len(mine), cfg.n), cfg.algorithm.scale_adv_by_std)
    batch = {k: v.to(worker.device) for k, v in pack(rollouts, pad_id).items()}
    parts = micro_slices(len(rollouts.texts), cfg.trainer.micro_batch)
    t2 = time.perf_counter()
    rate = schedule_rate(learner, cfg, step)
    update = policy_update(learner, reference, batch, advantages.reshape(-1).to(worker.device), cfg,
                           with_reference=with_reference, widths=agreed_widths(batch["attention"], parts, worker))
    t3 = time.perf_counter()
    publish(engine, learner, worker, step + 1)  # before the next rollout
    t4 = time.perf_counter()
    stats = mean_over_workers({
        "train/reward": float(rewards.mean()),
        **update.metrics(),
        "train/frac_zero_std": float(adv_stats["frac_zero_std"]),
        "rollout/length": rollouts.num_tokens / len(rollouts.texts),
        "rollout/tokens": float(rollouts.num_tokens),
    }, worker)
    if step == 0:
        stats.update(zero_signal_check(sets, problems, cfg.n, stats["train/frac_zero_std"]))
    return {**stats, "train/grad_norm": update.grad_norm, "train/lr": rate, "train/micro_batches": update.micro_batches,
            "rollout/policy_version": rollouts.policy_version, "time/generate_s": t1 - t_step,
            "time/reward_s": t2 - t1, "time/train_s": t3 - t2, "time/sync_s": t4 - t3,
            "time/step_s": time.perf_counter() - t_step}


def zero_signal_check(sets: ProblemSets, problems: list[Problem], n: int, observed: float) -> dict[str, float]:
    """The first step's fraction of groups without signal (all rewards equal), ``check/zero_signal_observed``,
    beside what the probe predicts for its problems, ``check/zero_signal_expected`` with its standard deviation
    ``check/zero_signal_sd`` (:func:`isosweep.models.problemsets.zero_signal`): a wrong reward, sampler or
    grouping shows here before anything is trained. Every worker computes the same (it sees every problem)."""
    expected, sd = zero_signal([sets.counts[p.prompt] for p in problems], n, sets.prior)
    return {"check/zero_signal_observed": observed, "check/zero_signal_expected": expected,
            "check/zero_signal_sd": sd}


def train_loop(cfg: TrialConfig, out: str | Path, log: Callable[[str], None] = print,
               report: Callable[[dict], None] | None = None, run_id: str = "local",
               launch: dict[str, float] | None = None) -> list[dict]:
    """Run (or resume) one trial into ``out``; returns the eval records, one per evaluation.

    The first eval record of each launch holds where its fixed cost went, ``time/start_<phase>_s``: the
    phases of ``launch`` (what the caller spent before this call: a Ray Train job's start-up), then this
    function's own (distributed group, model, engine, problem sets, learner, resume).

    Runs on every trainer worker (``report`` is ``ray.train.report`` inside a Ray Train job):
    each worker takes its share of the step's problems, DeepSpeed averages the gradients, rank 0
    evaluates, checkpoints, writes the metrics and, with shared rollout engines, samples for every
    worker and publishes the weights.
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
    params = parameter_count(policy)  # before ZeRO-3 partitions it
    reference = copy.deepcopy(policy)  # before DeepSpeed wraps the policy
    lap("model")
    engine, shared_engine = make_engine(cfg, model_path, tokenizer, rank, run_id)
    if prompt_format == "chat":  # from here on every prompt sampled -- probe, training, eval -- is wrapped
        engine = TemplatedEngine(engine, functools.partial(chat_prompt, tokenizer))
    lap("engine")
    sets = decide_once(lambda: problem_sets(cfg, model_path, engine), rank, world)
    if rank == 0:
        refuse_other_eval_set(trial, sets.eval)
    task = task_of(cfg.task)
    lap("problems")
    learner = make_learner(policy, cfg, gpu)
    reference = make_reference(reference, cfg, gpu, learner.device)
    worker = Worker(rank, world, learner.device, shared_engine)
    lap("learner")
    total_steps, per_step = steps(cfg), cfg.Bp * cfg.n
    evals = set(eval_steps(cfg))
    precision = rollout_precision(cfg)
    exact_weights = precision in INT_BITS or (precision == "fp8" and not (gpu and rollout_engine(cfg) == "vllm"))

    state = resume(trial, learner, rank, world, log)
    step, tokens, wall = state["step"], state["tokens"], state["wall_s"]
    records = trial.records() if rank == 0 else []
    publish(engine, learner, worker, step)
    lap("resume")
    best = max((r[f"eval/mean@{cfg.eval.k}"] for r in records), default=-1.0)
    if rank == 0:
        engine_name, why = engine_choice(cfg)
        log(f"[trial] {cfg.task.name}/{cfg.task.difficulty} {cfg.model.name}: {len(sets.train)} train / "
            f"{len(sets.eval)} eval problems, Bp={cfg.Bp} n={cfg.n} M={total_steps} lr={learning_rate(cfg):.2e} "
            f"rollouts={engine_name}/{precision} ({why}) correction={cfg.algorithm.correction} "
            f"workers={world} threads={torch.get_num_threads()}"
            + (f" micro_batch={cfg.trainer.micro_batch}" if cfg.trainer.micro_batch else "")
            + (f" eval_temperature={cfg.eval.temperature:g}" if cfg.eval.temperature is not None else "")
            + (f", resuming at step {step}" if step else ""))
        log(f"[trial] prompts: {prompt_format} ({prompt_why})")

    window: list[dict[str, float]] = state["window"]  # steps since the last eval record (resumed between two)
    started = time.perf_counter() - wall
    while True:
        if step in evals:
            scores = evaluate_step(engine, learner, sets, cfg, worker, step, records, exact_weights)
            if scores is not None:
                record = {"step": step, "rollouts": step * per_step, "tokens": tokens,
                          "system/trainer_flops": 6 * params * tokens, PROMPT_FORMAT_KEY: prompt_format,
                          **scores, **_average(window, step), "system/wall_s": time.perf_counter() - started,
                          **startup}
                startup = {}
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
        if step in evals and _broadcast(_pause_due(trial, step * per_step) if rank == 0 else None, world):
            if rank == 0:
                log(f"[trial] paused at step {step}/{total_steps} ({step * per_step:,} rollouts, rung "
                    f"{trial.pause_at():,}): the adaptive sweep decides whether it goes on")
            return records
        if _broadcast(trial.stop_requested() if rank == 0 else None, world):
            if rank == 0:
                log(f"[trial] stopped at step {step}/{total_steps}: {trial.stop_reason()}")
                trial.acknowledge_stop(step)
            return records
        # the reference's forward: for the loss when the KL weight is non-zero, else a health sample (every eval
        # record has one); the same decision on every worker (under ZeRO-3 its forward is collective)
        with_reference = kl_coef(cfg) > 0 or step % cfg.algorithm.kl_every == 0 or step + 1 in evals
        stats = train_step(cfg, engine, learner, reference, sets, task, worker, step, tokenizer.pad_token_id,
                           with_reference)
        step += 1
        tokens += int(round(stats["rollout/tokens"] * world))
        window.append(stats)
        if rank == 0 and "check/zero_signal_expected" in stats:
            log(f"[trial] zero-signal check: {stats['check/zero_signal_observed']:.3f} of step 0's groups without "
                f"signal; the probe predicts {stats['check/zero_signal_expected']:.3f} +- {stats['check/zero_signal_sd']:.3f}")
        if rank == 0:
            trial.append_step({"step": step, "rollouts": step * per_step, **stats})
        every = cfg.eval.checkpoint_every
        if every and step % every == 0 and step not in evals:  # bounds what a crash loses between far-apart evals
            at = {"step": step, "tokens": tokens, "system/wall_s": time.perf_counter() - started}
            save_checkpoint(trial, learner, tokenizer, records[-1] if records else None, False, rank, world, at)


def _pause_due(trial: TrialDir, rollouts: int) -> bool:
    """Whether the trial, just evaluated at ``rollouts``, is at or past the rung its ``PAUSE`` file names."""
    pause = trial.pause_at()
    return pause is not None and rollouts >= pause


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


def mean_over_workers(stats: dict[str, float], worker: Worker) -> dict[str, float]:
    """Average scalar statistics over trainer workers, reduced on the worker's device (NCCL reduces GPU tensors
    only, so a CPU tensor fails there: the reduction runs in a world of one too, where a GPU can show it). Every
    worker must hold the same keys."""
    if not dist.is_initialized():
        return stats
    values = torch.tensor(list(stats.values()), dtype=torch.float64, device=worker.device)
    dist.all_reduce(values)
    return dict(zip(stats, (values / worker.world).tolist()))


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
    weights = gathered_state_dict(learner, keep=rank == 0)  # every rank joins the gathers; rank 0 writes them
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
