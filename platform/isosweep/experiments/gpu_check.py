"""``make gpu-check``: what one NVIDIA GPU (an H100 or H200) proves before the first cluster run, in minutes.

It runs on a bare GPU machine -- Python 3.12, a CUDA torch and transformers, nothing more, no network -- with
isosweep from this checkout (``PYTHONPATH=platform``). isosweep's pure dependencies it lacks (pydantic, PyYAML)
and pytest are installed from a folder of wheels (``--wheels``, filled by ``make gpu-wheels`` on a machine with
network) into ``.cache/gpu-check/``, only where missing. What needs a package the machine lacks (DeepSpeed,
vLLM, Ray, MLflow) prints ``skipped: <package> not installed`` and the rest runs. One line per result, in order:

1. ``tests/test_gpu.py`` through pytest (each test skips what lacks a package or a second GPU);
2. Qwen2.5-0.5B's architecture (:func:`isosweep.run.memory.model_config`: its real dimensions and 151,936-token
   vocabulary) with random weights, and batches of random token ids: no download, no tokenizer;
3. trainer steps on it (:func:`isosweep.trial.step.policy_update`: micro-batches, bf16, with and without gradient
   checkpointing) through DeepSpeed (:func:`isosweep.trial.learner.make_learner`, ZeRO-0 and ZeRO-1 at world 1)
   or, without DeepSpeed, through :class:`PlainLearner`; each setting's ``torch.cuda.max_memory_allocated()``
   beside the memory plan's tensors (:func:`isosweep.run.memory.trainer_memory` less its allowance for the CUDA
   context, which the allocator does not see), failing beyond 25 %;
4. with vLLM: the same model served in bf16 and in FP8 (``fp8_per_channel``, as the GPU profiles do), its weights
   reloaded from the trainer three times, the per-token mismatch ``mean |log pi_train - log pi_rollout|`` on the
   sampled tokens and the generation tokens/s of each.

The exit status is 1 if anything failed. Without a GPU it says so and exits 0 (CI runs it that way).

Not covered: anything of several GPUs (NCCL between GPUs, ZeRO-3 partitioning, weights broadcast to another
GPU's engine: the multi-GPU test of ``tests/test_gpu.py`` needs two), Ray placement, MLflow, CUDA graphs (the
engines run eager, to start in seconds: their tokens/s are below a production engine's), real weights.

The GPU parts run under a one-GPU hardware profile of their own, ``gpu-check`` (bf16, the trainer's ZeRO stage
from the setting), added to a copy of ``clusters/profiles.yaml`` that ``ISOSWEEP_PROFILES`` points at: the GPU
profiles there fix ZeRO-3. The module's top-level imports are the standard library only, so that a machine
missing torch hears it from this script.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
WHEELS = ROOT / ".cache" / "gpu-wheels"
SITE = ROOT / ".cache" / "gpu-check" / f"py{sys.version_info.major}.{sys.version_info.minor}"
"""Where missing wheels are installed (``pip install --target``): per Python version, as compiled wheels are."""

NEEDED = {"pydantic": "pydantic", "pydantic_core": "pydantic-core", "annotated_types": "annotated-types",
          "typing_inspection": "typing-inspection", "typing_extensions": "typing-extensions", "yaml": "pyyaml"}
"""Module -> distribution of what ``isosweep.spec`` needs beyond torch and transformers (found by importing
``isosweep.trial.step``, ``isosweep.run.memory`` and ``isosweep.rollout.vllm`` where only those two are installed)."""
PYTEST = {"pytest": "pytest", "pluggy": "pluggy", "iniconfig": "iniconfig", "packaging": "packaging",
          "pygments": "pygments"}
"""Module -> distribution of pytest and what it imports."""
OPTIONAL = ("deepspeed", "vllm", "ray", "mlflow")
"""Packages of the cluster image a bare GPU machine may lack; the parts needing them are skipped."""

MODEL = "Qwen/Qwen2.5-0.5B"
PROFILE = "gpu-check"
PROFILE_YAML = f"""
# make gpu-check: one GPU, bf16, the trainer's ZeRO stage from the trial (the GPU profiles above fix ZeRO-3)
{PROFILE}:
  accelerator: gpu
  node: {{CPU: 1, GPU: 1}}
  driver: {{CPU: 0}}
  trainer: {{CPU: 1, GPU: 1}}
  rollout: {{CPU: 0, GPU: 1}}
  backend: nccl
  deepspeed: {{bf16: true}}
  vllm: {{tensor_parallel_size: 1, gpu_memory_utilization: 0.3}}
"""
"""The check's hardware profile; vLLM takes 30 % of the GPU, beside the trainer in this process."""
MEMORY_TOLERANCE = 0.25
"""Largest relative difference between a measured peak and the memory plan that passes."""


@dataclass(frozen=True)
class Sizes:
    """What one run of the check trains and samples."""

    batch: int = 8
    """Sequences per optimizer step (one worker's share)."""
    micro_batch: int = 4
    """Sequences per forward/backward pass."""
    seq_len: int = 512
    """Tokens per training sequence (prompt and completion)."""
    prompt_len: int = 64
    """Prompt tokens of every sequence, trained and sampled."""
    steps: int = 3
    """Optimizer steps per trainer setting, and weight reloads per engine."""
    prompts: int = 32
    """Prompts per generation call."""
    samples: int = 4
    """Completions per prompt."""
    new_tokens: int = 256
    """Tokens generated per completion (at most)."""
    lr: float = 2e-3
    """Learning rate of the steps: large, so that three steps move the weights well beyond FP8's rounding and the
    engine's log-probs show whether a reload took."""


class Report:
    """Prints one line per result (``ok: ...``, ``FAIL: ...``, ``skipped: ...``; details indented) and counts them."""

    def __init__(self, write: Callable[[str], None] = print):
        self.write = write
        self.counts: Counter[str] = Counter()

    def result(self, status: str, text: str) -> None:
        self.counts[status] += 1
        self.write(f"{status}: {text}")

    def ok(self, text: str) -> None:
        self.result("ok", text)

    def fail(self, text: str) -> None:
        self.result("FAIL", text)

    def check(self, passed: bool, text: str) -> None:
        self.result("ok" if passed else "FAIL", text)

    def skip(self, package: str, what: str) -> None:
        self.result("skipped", f"{package} not installed ({what})")

    def detail(self, text: str) -> None:
        self.write(f"    {text}")


# ---------------------------------------------------------------------------------------------
# packages


def installed(module: str) -> bool:
    """Whether ``module`` can be imported: a module or a regular package, not a namespace package (any folder of
    that name on ``sys.path`` is one: Ray's session folder ``/tmp/ray`` for a script run from ``/tmp``)."""
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.origin not in (None, "namespace")


def version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def use_site(site: Path) -> None:
    """Import from ``site``: here after the machine's own packages (``sys.path``), in child processes (pytest, vLLM's
    engine) through ``PYTHONPATH``. It holds only what was missing when it was filled."""
    if str(site) not in sys.path:
        sys.path.append(str(site))
        importlib.invalidate_caches()
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(site) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([*paths, str(site)])


def provide(modules: dict[str, str], wheels: Path, site: Path = SITE) -> str | None:
    """Install the distributions of the ``modules`` that cannot be imported, from the wheel folder ``wheels`` into
    ``site`` (:func:`use_site`); None when all import, else what is wrong."""
    if site.is_dir():
        use_site(site)
    missing = sorted({dist for module, dist in modules.items() if not installed(module)})
    if not missing:
        return None
    if not wheels.is_dir():
        return (f"{', '.join(missing)} not installed and no wheel folder {wheels} (run `make gpu-wheels` on a "
                f"machine with network and copy {wheels} here)")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-index", "--find-links", str(wheels), "--only-binary=:all:", "--no-deps",
                           "--target", str(site), *missing], capture_output=True, text=True)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-500:]
        return f"pip could not install {', '.join(missing)} from {wheels}: {said}"
    use_site(site)
    still = [module for module in modules if not installed(module)]
    return f"{', '.join(still)} still not importable after installing into {site}" if still else None


def profiles_file(directory: Path) -> Path:
    """A copy of the hardware profiles (``ISOSWEEP_PROFILES`` or ``clusters/profiles.yaml``) with :data:`PROFILE`."""
    source = Path(os.environ.get("ISOSWEEP_PROFILES", ROOT / "clusters" / "profiles.yaml"))
    path = directory / "profiles.yaml"
    path.write_text(source.read_text() + PROFILE_YAML)
    return path


# ---------------------------------------------------------------------------------------------
# 1. tests/test_gpu.py


def run_gpu_tests(report: Report, timeout_s: float = 360) -> None:
    """``pytest -m gpu tests/test_gpu.py`` in a child process (this checkout's isosweep first), its skip reasons
    relayed."""
    paths = [str(ROOT / "platform"), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    started = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-m", "gpu",
                               "tests/test_gpu.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        report.fail(f"pytest tests/test_gpu.py: still running after {timeout_s:.0f} s")
        return
    lines = done.stdout.strip().splitlines()
    summary = lines[-1].strip("= ") if lines else "no output"
    report.check(done.returncode == 0, f"pytest tests/test_gpu.py: {summary} ({time.perf_counter() - started:.0f} s)")
    for line in lines:
        if line.startswith("SKIPPED"):
            report.detail(line)
    if done.returncode != 0:
        for line in (done.stdout + done.stderr).strip().splitlines()[-40:]:
            report.detail(line)


# ---------------------------------------------------------------------------------------------
# 2. the model and its batches


def random_policy(config, device, seed: int = 0):
    """A causal LM of ``config`` with random weights (fp32), built on ``device``."""
    import torch  # reason: a bare machine without torch hears it from main()
    from transformers import AutoModelForCausalLM  # reason: as torch

    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config)


def random_batch(sizes: Sizes, vocab: int, device, seed: int) -> tuple[dict, object]:
    """A worker's batch in :func:`isosweep.trial.loop.pack`'s layout -- ``ids``, ``attention`` ``(batch, seq_len)``,
    ``mask``, ``rollout_logp`` ``(batch, seq_len - 1)``: random ids, every sequence full length, its completion
    after ``prompt_len`` tokens, rollout log-probs of a uniform policy -- and random advantages ``(batch,)``."""
    import torch  # reason: as random_policy

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (sizes.batch, sizes.seq_len), generator=generator)
    mask = torch.zeros(sizes.batch, sizes.seq_len - 1)
    mask[:, sizes.prompt_len - 1:] = 1.0
    batch = {"ids": ids, "attention": torch.ones_like(ids), "mask": mask, "rollout_logp": -math.log(vocab) * mask}
    advantages = torch.randn(sizes.batch, generator=generator)
    return {k: v.to(device) for k, v in batch.items()}, advantages.to(device)


def trial_config(sizes: Sizes, zero_stage: int, checkpointing: bool, profile: str = PROFILE):
    """The trial whose trainer settings the check runs: ``sizes.batch`` sequences a step (Bp * n), Qwen2.5-0.5B."""
    from isosweep.spec.trial import TrialConfig  # pydantic: provided before this runs

    return TrialConfig(
        budget=sizes.batch * sizes.steps, Bp=sizes.batch // 2, n=2, profile=profile, model={"name": MODEL},
        algorithm={"lr_ref": sizes.lr * math.sqrt(128 / sizes.batch), "batch_ref": 128},
        trainer={"zero_stage": zero_stage, "micro_batch": sizes.micro_batch, "gradient_checkpointing": checkpointing,
                 "logprob_chunk": 1024})


# ---------------------------------------------------------------------------------------------
# 3. trainer steps


class PlainLearner:
    """The part of a DeepSpeed engine's interface that :func:`isosweep.trial.step.policy_update` uses, in plain
    torch, for a machine without DeepSpeed. Mixed precision as DeepSpeed's bf16 does it: the module's weights and
    gradients in ``dtype``, an fp32 master copy that AdamW updates (2 + 2 + 4 + 8 = 16 bytes per parameter, and the
    fp32 gradients of the optimizer step). The forward runs on the bf16 weights themselves rather than under
    autocast, because the step applies the output head outside the learner's forward (chunk by chunk), where
    autocast would not reach. Gradient accumulation and clipping as DeepSpeed's: :meth:`step` after every
    micro-batch, the optimizer steps on the last of ``accumulation``."""

    def __init__(self, module, cfg, accumulation: int, dtype):
        import torch  # reason: as random_policy

        from isosweep.spec.trial import learning_rate  # the rate make_learner gives AdamW
        from isosweep.trial.learner import param_groups  # and its parameter groups

        self.module = module.to(dtype)
        if cfg.trainer.gradient_checkpointing:  # as make_learner does
            module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.device = next(module.parameters()).device
        self.accumulation = accumulation
        self.grad_clip = cfg.algorithm.grad_clip
        self.micro_steps = 0
        self.grad_norm: float | None = None
        groups = param_groups(module, cfg)
        self.pairs = [(p, p.detach().to(torch.float32, copy=True)) for group in groups for p in group["params"]]
        master = {id(p): m for p, m in self.pairs}
        self.optimizer = torch.optim.AdamW([{**g, "params": [master[id(p)] for p in g["params"]]} for g in groups],
                                           lr=learning_rate(cfg), betas=(0.9, 0.99), weight_decay=0.0)

    def __call__(self, **inputs):
        return self.module(**inputs)

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()

    def zero_optimization_stage(self) -> int:
        return 0

    def is_gradient_accumulation_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.accumulation == 0

    def backward(self, loss, scale_wrt_gas: bool = True) -> None:
        (loss / self.accumulation if scale_wrt_gas else loss).backward()

    def step(self) -> None:
        """After every micro-batch; on the last: fp32 gradients, clip, AdamW on the master weights, copy back."""
        import torch  # reason: as random_policy

        if self.is_gradient_accumulation_boundary():
            for param, master in self.pairs:
                master.grad = None if param.grad is None else param.grad.float()
                param.grad = None
            masters = [m for _, m in self.pairs if m.grad is not None]
            self.grad_norm = float(torch.nn.utils.clip_grad_norm_(masters, self.grad_clip))
            self.optimizer.step()
            with torch.no_grad():
                for param, master in self.pairs:
                    param.copy_(master)
                    master.grad = None
        self.micro_steps += 1

    def get_global_grad_norm(self) -> float | None:
        return self.grad_norm


@dataclass(frozen=True)
class Setting:
    """One trainer setting: which learner, ZeRO stage, gradient checkpointing."""

    learner: str
    """``deepspeed`` or ``plain``."""
    zero_stage: int
    checkpointing: bool

    def label(self) -> str:
        name = (f"DeepSpeed ZeRO-{self.zero_stage}" if self.learner == "deepspeed"
                else "plain-torch learner (no DeepSpeed)")
        return f"{name}, checkpointing {'on' if self.checkpointing else 'off'}"


@dataclass
class Trainer:
    """A learner, its frozen reference and the trial they train under."""

    learner: object
    reference: object
    cfg: object


def make_trainer(setting: Setting, sizes: Sizes, config, device, profile: str = PROFILE) -> Trainer:
    """A fresh random policy wrapped as ``setting`` says, and its reference (the same weights, frozen)."""
    from isosweep.trial.learner import (  # the trial's own learner and reference
        init_distributed,
        make_learner,
        make_reference,
        micro_batches,
        uses_bf16,
    )

    cfg = trial_config(sizes, setting.zero_stage, setting.checkpointing, profile)
    gpu = device.type == "cuda"
    policy = random_policy(config, device)
    reference = make_reference(copy.deepcopy(policy), cfg, gpu, device)
    if setting.learner == "deepspeed":
        init_distributed("nccl" if gpu else "gloo")
        learner = make_learner(policy, cfg, gpu)
    else:
        import torch  # reason: as random_policy

        dtype = torch.bfloat16 if uses_bf16(cfg, gpu) else torch.float32
        learner = PlainLearner(policy, cfg, micro_batches(cfg, 1), dtype)
    return Trainer(learner, reference, cfg)


def release(trainer: Trainer | None) -> None:
    """Free a trainer's memory before the next setting is measured (the caller may still hold ``trainer``)."""
    import torch  # reason: as random_policy

    if trainer is not None:
        if hasattr(trainer.learner, "destroy"):  # a DeepSpeed engine's hooks and buffers
            trainer.learner.destroy()
        trainer.learner = trainer.reference = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class SettingResult:
    """What one trainer setting measured."""

    losses: list[float]
    grad_norms: list[float]
    micro_batches: int
    moved: bool
    """Whether the steps changed the weights."""
    step_s: float
    """Mean seconds per optimizer step."""
    peak: int | None
    """``torch.cuda.max_memory_allocated()`` over the setting, less what was allocated before it; None on a CPU."""
    plan: object
    """The memory plan's :class:`isosweep.run.memory.TrainerMemory` of the setting."""


def train_setting(setting: Setting, sizes: Sizes, config, device, profile: str = PROFILE) -> SettingResult:
    """Build ``setting``'s trainer and take ``sizes.steps`` steps on random batches, measuring the peak memory."""
    import torch  # reason: as random_policy

    from isosweep.run.memory import trainer_memory  # the memory plan
    from isosweep.trial.learner import uses_bf16  # as make_learner decides
    from isosweep.trial.step import policy_update  # the trial's own step

    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    trainer = make_trainer(setting, sizes, config, device, profile)
    first = next(trainer.learner.module.parameters()).detach()[:8].float().clone()
    losses, norms, micro, started = [], [], 0, time.perf_counter()
    for step in range(sizes.steps):
        batch, advantages = random_batch(sizes, config.vocab_size, device, seed=step)
        stats = policy_update(trainer.learner, trainer.reference, batch, advantages, trainer.cfg, with_reference=True)
        losses.append(stats.loss)
        norms.append(stats.grad_norm)
        micro = stats.micro_batches
    if cuda:
        torch.cuda.synchronize()
    step_s = (time.perf_counter() - started) / sizes.steps
    moved = not torch.equal(first, next(trainer.learner.module.parameters()).detach()[:8].float())
    peak = torch.cuda.max_memory_allocated() - before if cuda else None
    cfg = trainer.cfg
    release(trainer)
    stage = setting.zero_stage if setting.learner == "deepspeed" else 0
    plan = trainer_memory(config, micro_batch=sizes.micro_batch, seq_len=sizes.seq_len, world=1, zero_stage=stage,
                          bf16=uses_bf16(cfg, cuda), gradient_checkpointing=setting.checkpointing,
                          logprob_chunk=cfg.trainer.logprob_chunk, reference=True)
    return SettingResult(losses, norms, micro, moved, step_s, peak, plan)


def planned_tensors(plan) -> int:
    """The plan's bytes of tensors: its total less the allowance for the CUDA context and fragmentation, which
    ``max_memory_allocated`` does not count."""
    return plan.total - plan.overhead


def judge_setting(report: Report, setting: Setting, result: SettingResult, sizes: Sizes) -> None:
    """Report one setting: finite losses and gradient norms, weights moved, the peak against the plan."""
    gib = 2**30
    # the gradient norm is printed, not judged: DeepSpeed reports none (0 here) for fp32 ZeRO-0, a CPU-only setting
    finite = all(math.isfinite(x) for x in result.losses + result.grad_norms)
    text = (f"trainer, {setting.label()}: {sizes.steps} steps of {result.micro_batches} micro-batches x "
            f"{sizes.micro_batch} x {sizes.seq_len} tokens, {result.step_s:.2f} s/step, loss "
            f"{result.losses[-1]:+.4f}, grad norm {result.grad_norms[-1]:.3g}")
    planned = planned_tensors(result.plan)
    if result.peak is None:
        report.check(finite and result.moved, text + f"; plan {planned / gib:.2f} GiB (no CUDA: peak not measured)")
        return
    off = result.peak / planned - 1
    report.check(finite and result.moved and abs(off) <= MEMORY_TOLERANCE,
                 text + f"; peak {result.peak / gib:.2f} GiB allocated, plan {planned / gib:.2f} GiB ({off:+.0%}, "
                 f"within +-{MEMORY_TOLERANCE:.0%} passes)")
    p = result.plan
    report.detail(f"plan GiB: weights {p.weights / gib:.2f}, gradients {p.gradients / gib:.2f}, optimizer "
                  f"{p.optimizer / gib:.2f}, activations {p.activations / gib:.2f}, logits {p.logits / gib:.2f}, "
                  f"log-prob chunk {p.logprob_chunk / gib:.2f}, reference {p.reference / gib:.2f}; + "
                  f"{p.overhead / gib:.1f} overhead not in the allocator's count")
    if not finite or not result.moved:
        report.detail(f"losses {result.losses}, grad norms {result.grad_norms}, weights moved: {result.moved}")


def check_trainer(report: Report, sizes: Sizes, config, device, deepspeed: bool, profile: str = PROFILE) -> Setting:
    """Every trainer setting, reported; returns the first (the one the rollout check trains)."""
    learner = "deepspeed" if deepspeed else "plain"
    stages = (0, 1) if deepspeed else (0,)
    settings = [Setting(learner, stage, ckpt) for stage in stages for ckpt in (False, True)]
    peaks: dict[Setting, int | None] = {}
    for setting in settings:
        try:
            result = train_setting(setting, sizes, config, device, profile)
        except Exception as err:  # noqa: BLE001 -- a failed setting is reported, the others still run
            report.fail(f"trainer, {setting.label()}: {type(err).__name__}: {err}")
            continue
        judge_setting(report, setting, result, sizes)
        peaks[setting] = result.peak
    for stage in stages:
        off, on = peaks.get(Setting(learner, stage, False)), peaks.get(Setting(learner, stage, True))
        if off is not None and on is not None:
            report.check(on < off, f"gradient checkpointing ({Setting(learner, stage, True).label()}) lowers the "
                                   f"peak: {off / 2**30:.2f} -> {on / 2**30:.2f} GiB")
    return settings[0]


# ---------------------------------------------------------------------------------------------
# 4. rollouts


def eos_id(config) -> int:
    """The end-of-sequence id of ``config`` (the last id where it names none)."""
    return config.eos_token_id if isinstance(config.eos_token_id, int) else config.vocab_size - 1


def id_tokenizer(vocab: int, eos: int, directory: Path):
    """A tokenizer of one word per id, ``t0`` ... ``t<vocab-1>`` split on spaces (its ``tokenizer.json`` written
    to ``directory``): how the check writes random ids as prompts, Qwen's own tokenizer not being here."""
    from transformers import PreTrainedTokenizerFast  # reason: as random_policy

    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(vocab)}, "unk_token": f"t{eos}"}}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), eos_token=f"t{eos}",
                                   pad_token=f"t{eos}")


def save_model(module, config, directory: Path):
    """``module``'s weights (safetensors, in its dtype) and the id tokenizer, as a model folder an engine loads;
    returns the tokenizer."""
    module.save_pretrained(directory)
    tokenizer = id_tokenizer(config.vocab_size, eos_id(config), directory)
    tokenizer.save_pretrained(directory)
    return tokenizer


def random_prompts(sizes: Sizes, vocab: int, eos: int, seed: int = 0) -> list[str]:
    """``sizes.prompts`` prompts of ``sizes.prompt_len`` random ids other than ``eos``, as the id tokenizer's words."""
    rng = random.Random(seed)
    ids = [[(i + 1) % vocab if i == eos else i for i in (rng.randrange(vocab) for _ in range(sizes.prompt_len))]
           for _ in range(sizes.prompts)]
    return [" ".join(f"t{i}" for i in row) for row in ids]


def next_token_logprobs(model, batch: dict, cfg):
    """``(batch, tokens - 1)`` log-probs of every next token under ``model`` (a learner or the reference), in
    micro-batches of ``trainer.micro_batch``, as the trainer computes them."""
    import torch  # reason: as random_policy

    from isosweep.trial.step import micro_slices, token_stats  # the step's own log-probs

    out = torch.zeros_like(batch["mask"])
    with torch.no_grad():
        for rows in micro_slices(len(out), cfg.trainer.micro_batch):
            logp, _ = token_stats(model, batch["ids"][rows], batch["attention"][rows], cfg.rollout.temperature,
                                  cfg.trainer.logprob_chunk)
            out[rows] = logp
    return out


@dataclass(frozen=True)
class RolloutResult:
    """What one engine measured."""

    reload_s: list[float]
    policy_version: int
    tokens: int
    tokens_per_s: float
    mismatch: float
    """Token mean of ``|log pi_train - log pi_rollout|`` on the sampled tokens, against the trainer now."""
    mismatch_before: float
    """The same against the weights before the reloads (the reference): larger, if the reloads took."""


def rollout_check(trainer: Trainer, model_dir: Path, tokenizer, precision: str, sizes: Sizes, config, gpu: bool,
                  profile: str = PROFILE) -> RolloutResult:
    """Serve ``model_dir`` (the trainer's weights before its steps) at ``precision``; then ``sizes.steps`` times
    a trainer step and a reload of its weights into the engine; then sample, and compare the engine's log-probs
    with the trainer's and the reference's. ``tokenizer``: :func:`save_model`'s."""
    import torch  # reason: as random_policy

    from isosweep.algo.correction import mismatch_metrics  # the trial's mismatch metric
    from isosweep.rollout.vllm import VLLMEngine  # the trial's engine
    from isosweep.spec.profiles import get_profile, vllm_engine_args  # the profiles' engine arguments
    from isosweep.trial.learner import gathered_state_dict  # what the trial publishes
    from isosweep.trial.loop import pack  # the trial's batch layout
    from isosweep.trial.step import policy_update  # the trial's step

    extra = {"max_model_len": sizes.prompt_len + sizes.new_tokens + 64, "enforce_eager": True} if gpu else {}
    engine = VLLMEngine(str(model_dir), sizes.new_tokens, trainer.cfg.rollout.temperature, precision=precision, seed=0,
                        gpu=gpu, engine_kwargs={**vllm_engine_args(get_profile(profile), precision), **extra})
    # AutoTokenizer gives a qwen2 folder Qwen2Tokenizer, a byte-level BPE over the saved vocabulary that splits
    # the id words into bytes (transformers 5): the engine encodes the prompts with the tokenizer that wrote them
    engine.tokenizer = tokenizer
    try:
        device = trainer.learner.device
        reloads = []
        for step in range(sizes.steps):
            batch, advantages = random_batch(sizes, config.vocab_size, device, seed=1000 + step)
            policy_update(trainer.learner, trainer.reference, batch, advantages, trainer.cfg)
            started = time.perf_counter()
            engine.update_weights(gathered_state_dict(trainer.learner), version=engine.policy_version + 1)
            reloads.append(time.perf_counter() - started)
        eos = eos_id(config)
        prompts = random_prompts(sizes, config.vocab_size, eos)
        engine.generate(prompts[:2], 1, seed=1)  # warm-up
        if gpu:
            torch.cuda.synchronize()
        started = time.perf_counter()
        rollouts = engine.generate(prompts, sizes.samples, seed=2)
        elapsed = time.perf_counter() - started
        batch = {k: v.to(device) for k, v in pack(rollouts, eos).items()}
        now = mismatch_metrics(next_token_logprobs(trainer.learner, batch, trainer.cfg), batch["rollout_logp"],
                               batch["mask"])["logp_abs_diff_mean"]
        before = mismatch_metrics(next_token_logprobs(trainer.reference, batch, trainer.cfg), batch["rollout_logp"],
                                  batch["mask"])["logp_abs_diff_mean"]
        return RolloutResult(reloads, rollouts.policy_version, rollouts.num_tokens, rollouts.num_tokens / elapsed,
                             float(now), float(before))
    finally:
        core = getattr(getattr(engine.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        engine.llm = None
        gc.collect()
        if gpu:
            torch.cuda.empty_cache()


def check_rollouts(report: Report, setting: Setting, sizes: Sizes, config, device, work: Path,
                   profile: str = PROFILE) -> None:
    """The bf16 and FP8 engines, each beside a fresh trainer of ``setting``, reported."""
    mismatch: dict[str, float] = {}
    for precision in ("bf16", "fp8"):
        trainer = None
        try:
            trainer = make_trainer(setting, sizes, config, device, profile)
            model_dir = work / f"model-{precision}"
            tokenizer = save_model(trainer.learner.module, config, model_dir)
            r = rollout_check(trainer, model_dir, tokenizer, precision, sizes, config, device.type == "cuda", profile)
        except Exception as err:  # noqa: BLE001 -- reported; the other precision still runs
            report.fail(f"vLLM {precision}: {type(err).__name__}: {err}")
            continue
        finally:
            release(trainer)
        took = r.policy_version == sizes.steps and r.mismatch < r.mismatch_before and math.isfinite(r.mismatch)
        report.check(took, f"vLLM {precision}: {sizes.steps} weight reloads from the trainer "
                           f"({sum(r.reload_s) / len(r.reload_s):.2f} s each), policy version {r.policy_version}; "
                           f"{r.tokens} tokens at {r.tokens_per_s:,.0f} tokens/s; mismatch "
                           f"mean |log pi_train - log pi_rollout| {r.mismatch:.4f} (against the weights before the "
                           f"reloads: {r.mismatch_before:.4f})")
        mismatch[precision] = r.mismatch
    if len(mismatch) == 2:
        report.check(mismatch["fp8"] > mismatch["bf16"],
                     f"FP8 rollouts differ more from the bf16 trainer than bf16 rollouts: mismatch "
                     f"{mismatch['fp8']:.4f} vs {mismatch['bf16']:.4f}")


# ---------------------------------------------------------------------------------------------
# the check


def run_parts(report: Report, device, sizes: Sizes, model: str = MODEL, profile: str = PROFILE,
              work: Path | None = None) -> None:
    """Parts 2 to 4 on ``device``: the model, the trainer settings, the engines (where vLLM is installed)."""
    try:
        from isosweep.run.memory import model_config  # the memory plan's architectures

        config = model_config(model)
    except Exception as err:  # noqa: BLE001 -- reported; nothing below can run without it
        report.fail(f"{model}'s architecture from isosweep.run.memory.model_config: {type(err).__name__}: {err}")
        return
    report.ok(f"{model}'s architecture from isosweep.run.memory.model_config, random weights: hidden "
              f"{config.hidden_size}, {config.num_hidden_layers} layers, vocabulary {config.vocab_size:,}")
    deepspeed = installed("deepspeed")
    if not deepspeed:
        report.skip("deepspeed", "trainer through make_learner; the plain-torch learner stands in")
    setting = check_trainer(report, sizes, config, device, deepspeed, profile)
    if installed("vllm"):
        with tempfile.TemporaryDirectory(prefix="isosweep-gpu-check-", dir=work) as tmp:
            check_rollouts(report, setting, sizes, config, device, Path(tmp), profile)
    else:
        report.skip("vllm", "rollouts: bf16 and FP8 engines, weight reloads, mismatch, tokens/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m isosweep.experiments.gpu_check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--wheels", type=Path, default=WHEELS, help=f"folder of wheels (default {WHEELS})")
    args = parser.parse_args(argv)
    report, started = Report(), time.perf_counter()
    if not installed("torch"):
        if shutil.which("nvidia-smi") is None:
            print("no NVIDIA GPU here (no nvidia-smi, and torch is not installed): nothing to check; run "
                  "`make gpu-check` on a GPU node")
            return 0
        report.fail("torch not installed: install the CUDA torch this machine's driver supports")
        return 1
    import torch  # reason: only here, after the check that it is installed

    if not torch.cuda.is_available():
        print(f"no NVIDIA GPU here (torch {torch.__version__}: torch.cuda.is_available() is False): nothing to "
              "check; run `make gpu-check` on a GPU node")
        return 0
    props = torch.cuda.get_device_properties(0)
    print(f"gpu-check: {props.name}, {props.total_memory / 2**30:.0f} GiB, compute capability "
          f"{props.major}.{props.minor}; torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
          f"{version_of('transformers')}, Python {sys.version.split()[0]}")
    print("gpu-check: " + ", ".join(f"{p} {version_of(p)}" if installed(p) else f"{p} not installed" for p in OPTIONAL))
    problem = provide(NEEDED, args.wheels)
    if problem:
        report.fail(f"isosweep's dependencies: {problem}")
        return 1
    problem = provide(PYTEST, args.wheels)
    if problem:
        report.skip("pytest", f"tests/test_gpu.py; {problem}")
    else:
        run_gpu_tests(report)

    with tempfile.TemporaryDirectory(prefix="isosweep-gpu-check-") as tmp:
        os.environ["ISOSWEEP_PROFILES"] = str(profiles_file(Path(tmp)))  # read when isosweep.spec.profiles is imported
        run_parts(report, torch.device("cuda"), Sizes(), work=Path(tmp))
    if not installed("ray"):
        report.skip("ray", "the multi-GPU weight-sync test of tests/test_gpu.py, which also needs a second GPU")
    if not installed("mlflow"):
        report.skip("mlflow", "nothing on one GPU needs it; trials log to MLflow on a cluster")
    c = report.counts
    print(f"gpu-check: {c['ok']} ok, {c['FAIL']} failed, {c['skipped']} skipped in "
          f"{time.perf_counter() - started:.0f} s")
    return 1 if c["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
