"""Typed, frozen, validated trial configuration, loaded from YAML with ``--set key=value`` overrides.

One model per concern (task, model, rollout, algorithm, eval) and ``TrialConfig`` on top. Values
that follow from others -- the number of steps M, the learning rate by the square-root rule, the
regularisation by difficulty -- are functions of the config (``steps``, ``learning_rate``,
``kl_coef``, ``entropy_coef``), never fields written back into it.

A bad file stops before any work with a ``ConfigError`` (:mod:`isosweep.spec.yamlio`) naming the
file, the key and what is allowed, e.g. ``sweeps/trials/easy.yaml: key 'Bp': must be greater than 0
(got -4)``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from isosweep.algo import MIN_GROUP
from isosweep.models.sizes import SIZES, TABULAR
from isosweep.rollout import vllm_available
from isosweep.spec.profiles import get_profile, trial_resources
from isosweep.spec.yamlio import ConfigError, Section, merge, parse_overrides, read_yaml, validate
from isosweep.tasks import SYNTHETIC, HFDatasetTask, Task, get_task
from isosweep.tasks.base import Band
from isosweep.tasks.hf_dataset import PREFIX as HF_PREFIX

Difficulty = Literal["easy", "hard", "all"]

DIFFICULTY_BANDS: dict[str, Band] = {"easy": Band(0.3, 1.0, high_closed=True), "hard": Band(0.0, 0.3),
                                     "all": Band(0.0, 1.0, high_closed=True)}
"""Base pass-rate band of the problems in each set, for a task without bands of its own. ``all`` keeps
every probed problem of the levels: the same problems whatever the base model (a width ladder's shared set)."""


def difficulty_band(task: Task, difficulty: str) -> Band:
    """The band of ``difficulty`` for ``task``: the task's own ``bands`` where it has them (``codes``), else
    :data:`DIFFICULTY_BANDS`."""
    return getattr(task, "bands", DIFFICULTY_BANDS)[difficulty]

REGULARISATION: dict[str, tuple[float, float]] = {"easy": (1e-3, 1e-3), "hard": (0.0, 0.0), "all": (1e-3, 1e-3)}
"""Default ``(kl_coef, entropy_coef)`` per difficulty: on for easy sets (and all problems), off for hard ones."""


@functools.cache
def task_of(task: TaskConfig) -> Task:
    """The `Task` a task config names: ``get_task(task.name)``, or for an ``hf:`` dataset one reading the
    config's splits and columns. One object per config in a process, so a dataset is loaded once however
    often a trial asks (validation makes it, without loading anything)."""
    if task.name.startswith(HF_PREFIX):
        return HFDatasetTask(task.name.removeprefix(HF_PREFIX), task.dataset_config, task.train_split,
                             task.eval_split, task.columns.prompt, task.columns.answer)
    return get_task(task.name)


def known(lookup: Callable[[str], object]) -> AfterValidator:
    """A name field whose value ``lookup`` must find (it raises ``ValueError`` naming what is allowed)."""
    def check(name: str) -> str:
        lookup(name)
        return name

    return AfterValidator(check)


class DatasetColumns(Section):
    """Which columns of an ``hf:`` dataset hold the prompt and the answer."""

    prompt: str = "prompt"
    """Column fed to the model (GSM8K: ``question``)."""
    answer: str = "answer"
    """Column holding the answer, graded by its final number (GSM8K: ``answer``, ending ``#### 42``)."""


DATASET_KEYS = ("dataset_config", "train_split", "eval_split", "columns")
"""The ``task`` keys that only an ``hf:`` dataset reads."""


class TaskConfig(Section):
    """Which problems a trial trains and evaluates on, and how their prompts reach the model."""

    name: Annotated[str, known(get_task)] = "arithmetic"
    """A built-in task (``arithmetic``, ``countdown``), a JSONL dataset (``data.jsonl``, ``jsonl:path``), or a
    dataset read by Hugging Face ``datasets``: ``hf:data.parquet`` (or ``.json``, ``.jsonl``, ``.csv``, or a
    folder of such files) or ``hf:owner/name`` on the hub (``hf:openai/gsm8k``, downloaded when the trial starts)."""
    levels: tuple[int, ...] = (2,)
    """Task difficulty levels to draw problems from (digits for arithmetic, numbers for countdown; 0 for datasets)."""
    difficulty: Difficulty = "easy"
    """Problem set by base pass rate: ``easy`` (rate >= 0.3), ``hard`` (rate < 0.3) or ``all`` (every problem of the
    levels: the same set for every base model)."""
    eval_problems: int = Field(512, gt=0)
    """Held-out problems per evaluation (fewer if the set has fewer)."""
    dataset_config: str | None = None
    """``hf:`` datasets: the dataset's config (GSM8K: ``main``); none for a single local file."""
    train_split: str = "train"
    """``hf:`` datasets: the split training problems come from."""
    eval_split: str | None = None
    """``hf:`` datasets: the split eval problems come from (GSM8K: ``test``); unset, the train split is divided
    by a hash of each prompt (a fifth to eval), as a JSONL file's lines are."""
    columns: DatasetColumns = DatasetColumns()
    """``hf:`` datasets: the prompt and answer columns, e.g. ``{prompt: question, answer: answer}``."""
    prompt_format: Literal["auto", "raw", "chat"] = "auto"
    """``raw``: the prompt text as it is; ``chat``: wrapped as one user message by the tokenizer's chat template;
    ``auto`` (default): ``chat`` where the model's tokenizer has a template, else ``raw`` (the tiny models have
    none). The trial log and every eval record say which was used."""

    @model_validator(mode="after")
    def _dataset_keys_for_datasets(self) -> TaskConfig:
        # by value, not by whether a key was written: a dumped and reloaded config (a Ray Train worker's) has all
        stray = [f"task.{key}" for key in DATASET_KEYS if getattr(self, key) != type(self).model_fields[key].default]
        if stray and not self.name.startswith(HF_PREFIX):
            raise ValueError(f"{', '.join(stray)}: for {HF_PREFIX} datasets only, and task.name is {self.name!r}; "
                             f"allowed: task.name {HF_PREFIX}<file, folder or hub dataset>, or no {', '.join(stray)}")
        return self

    @model_validator(mode="after")
    def _known_levels(self) -> TaskConfig:
        allowed = task_of(self).levels
        bad = [lv for lv in self.levels if lv not in allowed]
        if bad or not self.levels:
            raise ValueError(f"levels {list(self.levels)} not allowed for task {self.name!r}; "
                             f"allowed: a non-empty subset of {list(allowed)}")
        return self


class ModelConfig(Section):
    """The policy's starting point."""

    name: str = "tiny-1m"
    """A tiny size (the family ``tiny-0.3m``, ``tiny-1m``, ``tiny-5m``, or the width ladder ``tiny-w64``,
    ``tiny-w128``, ``tiny-w256``: its cached base model), a local path or a hub name."""
    warmup_seed: int = Field(0, ge=0)
    """Seed of the tiny base model's warm-up (ignored for other models)."""

    @field_validator("name")
    @classmethod
    def _known_model(cls, name: str) -> str:
        if name in SIZES or name == TABULAR or Path(name).exists() or re.fullmatch(r"[\w.-]+/[\w.-]+", name):
            return name
        raise ValueError(f"unknown model {name!r}; allowed: a tiny size ({', '.join(SIZES)}), {TABULAR!r} (the codes "
                         "tasks' planted control), "
                         "an existing local path, or a hub name such as 'Qwen/Qwen2.5-0.5B'")


class RolloutConfig(Section):
    """How completions are sampled."""

    engine: Literal["auto", "vllm", "hf"] = "auto"
    """Rollout engine: ``vllm`` (Ray actors serving vLLM), ``hf`` (an in-process Hugging Face model
    per trainer worker) or ``auto`` (the default: what measures fastest for the model and hardware,
    see :func:`rollout_engine`; the trial log says which and why)."""
    precision: Literal["fp32", "bf16", "fp8", "int8", "int6", "int4", "int3", "int2"] | None = None
    """Rollout weights. Unset (default): the hardware profile's ``vllm.precision``, else ``bf16``
    (:func:`rollout_precision`). ``bf16``, or ``fp8`` (vLLM's online ``quantization="fp8_per_channel"`` on GPU; on CPU every linear
    weight is rounded through float8_e4m3fn with a per-output-channel scale, activations stay bf16), or
    ``int8`` ... ``int2``: every linear weight rounded to that many bits (symmetric, per output channel)
    and served in bf16 on any engine -- a ladder of rollout errors for studying the TIS/AIS corrections,
    not a serving mode (weight-only emulation). ``fp32``: the trainer's weights as they are, no rounding (the
    in-process engine only): rollouts exactly on-policy, as the tabular control's known answer assumes."""
    actors: int = Field(1, gt=0)
    """Rollout actors (vLLM engines) per trial; prompts are split evenly across them."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; log-probs are post-temperature on both sides."""
    max_new_tokens: int = Field(8, gt=0)
    """Cap on completion length in tokens (``<eos>`` included)."""


class AlgorithmConfig(Section):
    """GRPO hyperparameters."""

    lr_ref: float = Field(2.5e-5, gt=0)
    """Learning rate at batch ``batch_ref``; scaled by ``sqrt(Bp * n / batch_ref)``. The default is the
    pick of the learning-rate pilot for the tiny models (``isosweep calibrate``; its results are in
    ``dashboards/calibration/``); a real model needs its own."""
    batch_ref: int = Field(128, gt=0)
    """Reference batch (rollouts per step) for ``lr_ref``."""
    width_ref: int | None = Field(None, gt=0)
    """If set, ``lr_ref`` is the rate at this model width and the learning rate also scales by
    ``width_ref / width`` (tiny sizes only): one ``lr_ref`` then means the same for every width of a ladder,
    as the warm-up's rate does. Unset (default): no width scaling."""
    width_scaling: Literal["all", "hidden"] = "all"
    """Which parameters the ``width_ref / width`` factor applies to: ``all`` (every parameter, the default) or
    ``hidden`` (muP-style for Adam: only the weight matrices inside the blocks -- attention and MLP
    projections -- whose fan-in is the width; the token embedding, tied to the output head, and the
    norms and biases keep ``lr_ref``'s batch-scaled rate at every width). Without ``width_ref`` it changes nothing."""
    lr_warmup: float = Field(0.0, ge=0, lt=1)
    """Linear warm-up of the RL learning rate over this fraction of the trial's steps: step ``s`` (from 0)
    takes ``lr * min(1, (s + 1) / W)`` with ``W = ceil(lr_warmup * M)`` steps, then the full rate to the end.
    0 (the default): the full rate from the first step. A step's rate depends only on its index, so a
    resumed trial continues the same schedule."""
    clip_low: float = Field(0.2, gt=0, lt=1)
    """PPO ratio clip below 1: ratios under ``1 - clip_low`` are clipped."""
    clip_high: float = Field(0.28, gt=0)
    """PPO ratio clip above 1: ratios over ``1 + clip_high`` are clipped."""
    kl_coef: float | None = Field(None, ge=0)
    """k3 KL-to-reference weight; default by difficulty (easy 1e-3, hard 0)."""
    entropy_coef: float | None = Field(None, ge=0)
    """Entropy bonus weight; default by difficulty (easy 1e-3, hard 0)."""
    kl_every: int = Field(10, gt=0)
    """With a KL weight of 0 the reference model only measures ``train/kl`` (a health signal, not
    part of the loss), so its forward runs every ``kl_every`` steps and on the step before each
    evaluation, instead of every step (1: every step). With a non-zero KL weight it runs every
    step: the loss needs it."""
    scale_adv_by_std: bool = True
    """Divide group-centred rewards by the group's std (GRPO) or not (Dr. GRPO style)."""
    grad_clip: float = Field(1.0, gt=0)
    """Max global gradient norm."""
    correction: Literal["none", "tis", "ais"] = "none"
    """Rollout/trainer mismatch correction: none, truncated IS (advantage x min(rho, is_cap)),
    or adaptive IS (advantage x (1 + alpha (min(rho, is_cap) - 1)), alpha from the batch)."""
    is_cap: float = Field(2.0, ge=1)
    """Truncation C of the per-token importance ratio rho = pi_train / pi_rollout (TIS and AIS)."""
    ais_delta: float = Field(0.02, gt=0)
    """AIS: mean |log pi - log pi_rollout| at which the mismatch gate alpha_mis saturates at 1."""
    ais_beta: float = Field(1.0, ge=0)
    """AIS: weight of the variance-amplification penalty."""
    ais_gamma: float = Field(0.5, gt=0)
    """AIS: tolerated relative variance amplification before the penalty starts."""


class TrainerConfig(Section):
    """The trainer workers that update the policy, and how they are launched."""

    num_workers: int = Field(1, gt=0)
    """Data-parallel trainer workers; each takes Bp / num_workers problems of every step."""
    zero_stage: Literal[0, 1, 2, 3] = 1
    """DeepSpeed ZeRO stage (a GPU profile may fix it: ``clusters/profiles.yaml``)."""
    micro_batch: int | None = Field(None, gt=0)
    """Sequences per forward/backward pass on one worker; the worker's share of a step (Bp * n / num_workers
    sequences) is split into micro-batches whose gradients accumulate into one optimizer step. None (default):
    the whole share in one pass. The loss and the step are the same either way (up to float rounding); only
    the memory of a pass changes."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them: activation
    memory of one layer instead of all, for about a third more compute per step."""
    logprob_chunk: int = Field(1024, gt=0)
    """Tokens per chunk of the log-prob and entropy computation: the float32 ``[tokens, vocab]`` tensors
    exist for one chunk at a time (recomputed in the backward pass), never for a whole micro-batch."""
    param_persistence_threshold: int | None = Field(None, ge=0)
    """ZeRO-3 only: parameters of at most this many elements stay whole on every worker instead of being
    partitioned (DeepSpeed's ``stage3_param_persistence_threshold``). None: DeepSpeed's default (1e5); 0
    partitions every parameter (what the multi-worker tests of the tiny models use)."""
    launcher: Literal["auto", "ray_train", "in_process"] = "auto"
    """How the workers start: ``ray_train`` (a Ray Train ``TorchTrainer`` job per trial launch: a controller
    and worker processes, restarted by Ray Train when one dies), ``in_process`` (the one worker runs in the
    process that runs the trial -- the Ray Tune trial's own, reused from one trial to the next -- a world of
    one on loopback), or ``auto`` (the default, :func:`launcher_choice`). Either runs the same training loop
    on the same seeds: it changes where a trial runs, never what it computes."""


class EvalConfig(Section):
    """How often and how thoroughly the policy is evaluated on held-out problems."""

    every: int = Field(20, gt=0)
    """Evaluate (and checkpoint) every this many steps, plus at the start and the end."""
    checkpoint_every: int | None = Field(100, gt=0)
    """Also checkpoint every this many steps between evaluations (None: at evaluations only). Log-spaced
    evaluations leave long gaps late in a trial (the last is half of it); this bounds the work a crash
    loses to ``checkpoint_every`` steps. Checkpoints do not change what a trial computes."""
    points: int | None = Field(None, ge=2)
    """If set, replaces ``every``: about this many evaluations log-spaced in compute between
    ``first`` x C and C (plus one at the start). A sigmoid in compute is fitted to these points,
    and log spacing puts as many on its rise as on its plateau."""
    first: float = Field(1 / 64, gt=0, le=1)
    """The first log-spaced evaluation, as a fraction of the budget (with ``points``)."""
    samples: int = Field(20, gt=0)
    """Samples per eval problem (n_eval); the estimators are unbiased for any k <= samples."""
    k: int = Field(4, gt=0)
    """k of mean@k, best@k and worst@k."""
    watch: tuple[Difficulty, ...] = ()
    """Other difficulties whose held-out problems are evaluated too at every evaluation, as ``watch/<difficulty>/
    mean@k`` (and best, worst, stderr): what training on one set does to another -- the hard set while training on
    the easy one shows drift. Not part of the frontier; it costs one more evaluation per difficulty."""
    temperature: float | None = Field(None, gt=0)
    """Sampling temperature of the evaluation. None (the default): the rollouts' ``rollout.temperature``. Set it
    (to 1.0, say) when trials differ in ``rollout.temperature`` -- an HPO study that searches it -- so that every
    trial is scored the same way, whatever temperature it trained at."""

    @model_validator(mode="after")
    def _k_fits(self) -> EvalConfig:
        if self.k > self.samples:
            raise ValueError(f"k = {self.k} needs at least k samples per problem; allowed: k <= samples ({self.samples})")
        return self


class TrialConfig(Section):
    """One GRPO training run at budget C = Bp * n * M rollouts."""

    budget: int = Field(gt=0)
    """C: compute budget in rollouts (sampled completions)."""
    Bp: int = Field(16, gt=0)
    """Problems per step."""
    n: int = Field(8, gt=0)
    """Rollouts (samples) per problem."""
    seed: int = Field(0, ge=0)
    """Seed of problem order, sampling and initialisation."""
    profile: Annotated[str, known(get_profile)] = "cpu-tiny"
    """Hardware profile (``clusters/profiles.yaml``): the Ray resources of the trial."""
    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    trainer: TrainerConfig = TrainerConfig()
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="after")
    def _at_least_one_step(self) -> TrialConfig:
        if self.model.name in SIZES and self.task.name not in SYNTHETIC:
            raise ValueError(f"model.name {self.model.name!r} is a tiny base model, warmed up only on the synthetic "
                             f"tasks; allowed with task.name {', '.join(SYNTHETIC)} (use a real model for datasets)")
        if self.model.name == TABULAR and not self.task.name.startswith("codes"):
            raise ValueError(f"model.name {TABULAR!r} is the codes tasks' planted control; allowed with task.name "
                             f"codes, codes-nodrift or codes-transfer, and task.name is {self.task.name!r}")
        if (self.model.name == TABULAR or rollout_precision(self) == "fp32") and rollout_engine(self) == "vllm":
            what = "model.name 'tabular'" if self.model.name == TABULAR else "rollout.precision 'fp32'"
            raise ValueError(f"{what} runs on the in-process rollout engine only, and rollout.engine is 'vllm'; "
                             "allowed: rollout.engine hf or auto")
        if self.algorithm.width_ref is not None and self.model.name not in SIZES:
            raise ValueError(f"algorithm.width_ref scales the learning rate by the width of a tiny size, and "
                             f"model.name {self.model.name!r} is not one; allowed: a tiny size "
                             f"({', '.join(SIZES)}) or no algorithm.width_ref")
        if self.model.name in SIZES and self.task.prompt_format == "chat":
            raise ValueError(f"task.prompt_format 'chat' needs a chat template, and the tiny model {self.model.name!r} "
                             "has none; allowed with a tiny model: raw or auto")
        if rollout_precision(self).startswith("int") and get_profile(self.profile).weight_sync == "nccl":
            raise ValueError(f"rollout.precision {self.rollout.precision!r} is emulated by rounding the weights the "
                             f"trainer sends through shared memory, and profile {self.profile!r} syncs weights over "
                             "NCCL; allowed with it: bf16 or fp8")
        if self.n < MIN_GROUP:
            raise ValueError(f"n must be at least {MIN_GROUP}: group-relative advantages need two samples per problem")
        if self.trainer.launcher == "in_process" and self.trainer.num_workers > 1:
            raise ValueError(f"trainer.launcher 'in_process' runs one trainer worker, and trainer.num_workers is "
                             f"{self.trainer.num_workers}; allowed: num_workers 1, or launcher ray_train or auto")
        if self.Bp % self.trainer.num_workers:
            raise ValueError(f"Bp = {self.Bp} problems cannot be split evenly over trainer.num_workers = "
                             f"{self.trainer.num_workers}; allowed: Bp a multiple of num_workers")
        if self.budget < self.Bp * self.n:
            raise ValueError(f"budget C = {self.budget} rollouts is smaller than one step "
                             f"(Bp * n = {self.Bp} * {self.n} = {self.Bp * self.n}); allowed: budget >= Bp * n")
        return self


def rollout_precision(cfg: TrialConfig) -> str:
    """The rollout weights' precision: ``rollout.precision`` where set, else the profile's ``vllm.precision``
    (what its rollout GPUs were sized for), else ``bf16``."""
    return cfg.rollout.precision or get_profile(cfg.profile).vllm.precision or "bf16"


def steps(cfg: TrialConfig) -> int:
    """M = floor(C / (Bp * n)): optimizer steps the budget buys."""
    return cfg.budget // (cfg.Bp * cfg.n)


def eval_steps(cfg: TrialConfig) -> list[int]:
    """The steps after which a trial evaluates (and checkpoints), ascending, always 0 and M.

    ``eval.every`` spaces them evenly; ``eval.points`` spaces them evenly in log compute from
    ``eval.first * M`` to ``M``, rounded to whole steps (duplicates after rounding dropped).

    >>> cfg = TrialConfig(budget=128 * 100, Bp=16, n=8, eval={"every": 40})
    >>> eval_steps(cfg)
    [0, 40, 80, 100]
    >>> eval_steps(cfg.model_copy(update={"eval": EvalConfig(points=4, first=0.1)}))
    [0, 10, 22, 46, 100]
    """
    total = steps(cfg)
    if cfg.eval.points is None:
        chosen = set(range(0, total, cfg.eval.every))
    else:
        low = max(1.0, cfg.eval.first * total)
        chosen = {0} | {int(round(low * (total / low) ** (i / (cfg.eval.points - 1)))) for i in range(cfg.eval.points)}
    return sorted(chosen | {0, total})


def unscored_search(keys: Collection[str], cfg: TrialConfig) -> str | None:
    """Why trials that vary ``keys`` (dotted) from ``cfg`` would not be scored alike, or None. Searching
    ``rollout.temperature`` with ``eval.temperature`` unset scores each trial at its own temperature, so the values
    a searcher compares would measure the temperature as much as the training."""
    if "rollout.temperature" in keys and cfg.eval.temperature is None:
        return ("rollout.temperature varies from trial to trial and eval.temperature is not set, so each trial would be "
                "scored at its own temperature and the values would not compare; allowed: set eval.temperature "
                "(e.g. 1.0) under 'set'")
    return None


def learning_rate(cfg: TrialConfig) -> float:
    """Square-root batch scaling, ``lr_ref * sqrt(Bp * n / batch_ref)``, times ``width_ref / width`` if
    ``algorithm.width_ref`` is set: the rate of the parameters the width factor applies to (all of them
    unless ``algorithm.width_scaling`` is ``hidden``; the others take the rate without the factor)."""
    return cfg.algorithm.lr_ref * math.sqrt(cfg.Bp * cfg.n / cfg.algorithm.batch_ref) * width_factor(cfg)


def width_factor(cfg: TrialConfig) -> float:
    """``width_ref / width`` of a tiny size when ``algorithm.width_ref`` is set, else 1."""
    if cfg.algorithm.width_ref is None:
        return 1.0
    return cfg.algorithm.width_ref / SIZES[cfg.model.name].hidden


def width_scaled(cfg: TrialConfig, name: str, param_dims: int) -> bool:
    """Whether the parameter ``name`` (of ``param_dims`` dimensions) takes the width factor: every parameter
    under ``width_scaling: all``; under ``hidden``, the block matrices (2-D, not the token embedding)."""
    if cfg.algorithm.width_scaling == "all":
        return True
    return param_dims == 2 and "embed" not in name and "lm_head" not in name


def warmup_steps(cfg: TrialConfig) -> int:
    """Steps of the RL learning rate's linear warm-up (``algorithm.lr_warmup`` of the trial's steps; 0: none)."""
    return math.ceil(cfg.algorithm.lr_warmup * steps(cfg))


def warmup_fraction(cfg: TrialConfig, step: int) -> float:
    """The fraction of the full rate that optimizer step ``step`` (0-based) takes: ``min(1, (step + 1) / W)``
    during a warm-up of ``W`` steps (:func:`warmup_steps`), 1 without one."""
    warm = warmup_steps(cfg)
    return min(1.0, (step + 1) / warm) if warm else 1.0


def engine_choice(cfg: TrialConfig) -> tuple[str, str]:
    """The rollout engine a trial uses and why: the configured one, or for ``auto``:

    - a GPU profile: vLLM (where it is installed);
    - a CPU profile and a tiny model: the in-process engine. Measured by ``make bench`` on a 2-core
      machine: a trial step with it is faster than with a vLLM actor (the actor's scheduling and
      weight sync cost more than sampling a 1M-parameter model), it starts in under a second
      instead of ~13 s, and a trial without an actor asks for 1 CPU instead of 1.9, so two trials
      run side by side;
    - a CPU profile and any other model: vLLM where installed (its kernels win on real models).
    """
    if cfg.rollout.engine != "auto":
        return cfg.rollout.engine, "configured"
    if cfg.model.name == TABULAR:
        return "hf", "auto: the tabular control runs on the in-process engine (vLLM cannot serve it)"
    if not vllm_available():
        return "hf", "auto: vLLM is not installed"
    if get_profile(cfg.profile).accelerator == "gpu":
        return "vllm", "auto: GPU profile"
    if cfg.model.name in SIZES:
        return "hf", "auto: a tiny model on CPU steps faster in process than with a vLLM actor (make bench)"
    return "vllm", "auto: a real model on CPU"


def launcher_choice(cfg: TrialConfig) -> tuple[str, str]:
    """How a trial's trainer workers are launched (``trainer.launcher``) and why: the configured one, or for
    ``auto``:

    - one worker on a CPU profile: ``in_process``. A Ray Train job starts a controller, a worker and three
      helper actors per launch, each a new process importing Ray Train (and the worker torch, transformers,
      DeepSpeed): 10-20 s of every trial on a 2-core machine (``make bench``), for one process that gains
      nothing from them;
    - several workers, or a GPU profile: ``ray_train`` (its worker group, placement and NCCL set-up).
    """
    if cfg.trainer.launcher != "auto":
        return cfg.trainer.launcher, "configured"
    if get_profile(cfg.profile).accelerator == "gpu":
        return "ray_train", "auto: GPU profile"
    if cfg.trainer.num_workers > 1:
        return "ray_train", f"auto: {cfg.trainer.num_workers} data-parallel workers"
    return "in_process", "auto: one CPU worker runs in the trial's process (no Ray Train job to start)"


def rollout_engine(cfg: TrialConfig) -> str:
    """``vllm`` or ``hf``: the engine a trial uses (:func:`engine_choice`)."""
    return engine_choice(cfg)[0]


def resolve_prompt_format(tokenizer, setting: str) -> tuple[str, str]:
    """The prompt format a trial uses, ``raw`` or ``chat``, and why: ``setting`` (``task.prompt_format``)
    unless it is ``auto``, which is ``chat`` exactly when ``tokenizer`` has a chat template.

    ``chat`` for a tokenizer without a template is a ``ConfigError``: the trial cannot do what it says.
    """
    if setting not in ("auto", "raw", "chat"):
        raise ConfigError(f"task.prompt_format: {setting!r} is not a prompt format; allowed: auto, raw, chat")
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if setting == "auto":
        return ("chat", "auto: the tokenizer has a chat template") if has_template else \
            ("raw", "auto: the tokenizer has no chat template")
    if setting == "chat" and not has_template:
        raise ConfigError(f"task.prompt_format: 'chat' needs a tokenizer with a chat template, and the tokenizer of "
                          f"{tokenizer.name_or_path!r} has none; allowed: raw, or auto (chat where a template exists)")
    return setting, "configured"


def kl_coef(cfg: TrialConfig) -> float:
    """KL weight: the configured one, else on for easy sets and off for hard ones."""
    explicit = cfg.algorithm.kl_coef
    return REGULARISATION[cfg.task.difficulty][0] if explicit is None else explicit


def entropy_coef(cfg: TrialConfig) -> float:
    """Entropy-bonus weight: the configured one, else on for easy sets and off for hard ones."""
    explicit = cfg.algorithm.entropy_coef
    return REGULARISATION[cfg.task.difficulty][1] if explicit is None else explicit


def resources_of(cfg: TrialConfig) -> dict[str, float]:
    """One trial's Ray resources in total: driver + trainer + its vLLM actors (none with hf)."""
    actors = cfg.rollout.actors if rollout_engine(cfg) == "vllm" else 0
    return trial_resources(get_profile(cfg.profile), cfg.trainer.num_workers, actors)


def load_trial(path: str | Path, overrides: list[str] | None = None) -> TrialConfig:
    """Load a trial YAML, apply ``--set`` overrides, validate."""
    data = merge(read_yaml(path), parse_overrides(overrides or []))
    source = str(path) + (f" (with --set {' '.join(overrides)})" if overrides else "")
    return validate(TrialConfig, data, source)
