"""Base models for RL: a deterministic supervised warm-up of each tiny size, cached on disk.

A *base model* is a tiny Qwen2 trained by next-token prediction on correct solutions of a
synthetic task for a fixed number of steps: enough to be right some of the time, not enough to
be right always, which is the regime where RL has something to do. After training, the base
model's pass rate is measured per problem (``probe_samples`` samples each) on pools of train and
eval problems of every level; those rates define the easy and hard problem sets.

The cache key is (size, task, seed, ``WARMUP_VERSION``); bump the version whenever this file
changes what a base model is. A model directory appears only when complete (built in a
temporary directory, then renamed), so a crashed build leaves nothing half-written behind.

The same base model on every machine: learning addition "clicks" during the warm-up, so the last bits
of a float sum decide where a model lands. Built with torch's fastest kernels, tiny-1m's level-2
pass@1 came out 0.315 with the AVX-512 kernels of one CPU and 0.591 with the AVX2 kernels of the same
CPU (and its easy and hard sets with it). So ``ensure_base_model`` builds in a fresh interpreter with
the numerics pinned (``PINNED_NUMERICS``: torch's portable kernels, MKL's conditional numerical
reproducibility, two threads); its weights, probe and problem sets are then the same bits on any x86-64
CPU with the same torch, which the build's report records with a fingerprint of the weights.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import Qwen2ForCausalLM

from isosweep.models.family import qwen2_config
from isosweep.models.problemsets import level_pass_rates, probe_pass_rates
from isosweep.models.sizes import LADDER, SIZES, TABULAR, WARMUP_VERSION
from isosweep.models.tabular import TABULAR_VERSION, TabularConfig, TabularPolicy
from isosweep.models.tokenizer import char_tokenizer
from isosweep.rollout.hf import HFEngine
from isosweep.tasks import CodesTask, Task, get_task

PROBE_FILE = "probe.json"
REPORT_FILE = "base_report.json"


@dataclass(frozen=True)
class WarmupRecipe:
    """How one task warms a tiny model up."""

    steps: int
    """Optimizer steps (the same for every size: larger sizes end up stronger)."""
    level_weights: dict[int, float]
    """Sampling weight of each difficulty level in the warm-up data."""
    probe_levels: tuple[int, ...]
    """Levels whose pass rates are measured after warm-up."""
    batch: int = 128
    lr: float = 1e-3
    """Peak learning rate at hidden size 128; scaled by ``128 / hidden`` for other widths (see ``warmup_lr``)."""
    probe_samples: int = 8
    """Samples per problem when measuring the base pass rate."""
    probe_pool: int = 1024
    """Problems per (split, level) whose base pass rate is measured (fewer if the level has fewer)."""
    max_new_tokens: int = 8
    stage_pass: float | None = None
    """If set, warm up *to a stage* instead of for ``steps``: a constant rate after the 50-step ramp, and every
    ``stage_every`` steps the pass@1 on the shared stage set (``stage_problems`` eval problems of level
    ``stage_level``, ``probe_samples`` samples each) is measured; the warm-up stops at the first check that
    reaches ``stage_pass`` (``steps`` is then the most it may take: never reaching it is an error)."""
    stage_level: int = 2
    stage_every: int = 50
    stage_problems: int = 256
    stage_tolerance: float = 0.05
    """A check above ``stage_pass + stage_tolerance`` overshot: the warm-up steps back to its last check below the
    stage and checks every step from there."""


RECIPES: dict[str, WarmupRecipe] = {
    "arithmetic": WarmupRecipe(steps=600, level_weights={1: 1.0, 2: 3.0, 3: 1.5}, probe_levels=(2, 3)),
    "countdown": WarmupRecipe(steps=600, level_weights={2: 2.0, 3: 2.0, 4: 1.0}, probe_levels=(2, 3, 4),
                              max_new_tokens=16),
    **{name: WarmupRecipe(steps=1500, level_weights={1: 1.0}, probe_levels=(1,), probe_samples=128)
       for name in ("codes", "codes-nodrift", "codes-transfer")},
}
"""The codes tasks warm up long enough to fit each family's planted rate (about 4,000 targets per family) and probe
with 128 samples a problem, which resolves a needle's rate of 0.01 to 0.04 where 8 samples see nothing."""


LADDER_RECIPES: dict[str, WarmupRecipe] = {
    "arithmetic": WarmupRecipe(steps=3000, level_weights={1: 1.0, 2: 3.0, 3: 1.5}, probe_levels=(2, 3),
                               stage_pass=0.4, stage_level=2, stage_every=10),
}
"""Warm-up of the width ladder (``sizes.LADDER``): every width to the same stage, level-2 pass@1 0.4."""


def recipe_for(size: str, task: str) -> WarmupRecipe:
    """The warm-up recipe of one (size, task): the ladder's to-a-stage recipe for ladder sizes."""
    recipes = LADDER_RECIPES if size in LADDER else RECIPES
    if task not in recipes:
        raise ValueError(f"no warm-up recipe for task {task!r} and size {size!r}; allowed: {', '.join(recipes)}")
    return recipes[task]


def _recipe_key(recipe: WarmupRecipe) -> dict:
    # the stage fields joined the recipe after the family's models were cached: leaving them out of the key
    # while unset keeps those models' cache directories (and the studies that name them) where they were
    fields = asdict(recipe)
    if recipe.stage_pass is None:
        for name in ("stage_pass", "stage_level", "stage_every", "stage_problems", "stage_tolerance"):
            fields.pop(name)
    return fields


def warmup_lr(recipe: WarmupRecipe, size: str) -> float:
    """Peak warm-up learning rate of one size: inversely proportional to its width.

    With one rate for all widths, tiny-0.3m and tiny-5m were still before the point where
    addition "clicks" after 600 steps (level-2 pass@1 0.11 and 0.10, against 0.32 for tiny-1m).
    """
    return recipe.lr * 128 / SIZES[size].hidden


PINNED_NUMERICS: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "default",  # torch's portable kernels, not the AVX2 / AVX-512 ones the CPU offers
    "MKL_CBWR": "COMPATIBLE,STRICT",  # MKL's reproducible path, the same on every x86-64 CPU
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
}
"""The environment a base model is built in (read by torch and MKL when they load, hence a fresh interpreter).
Measured on one machine: the same tiny-1m bits at 1 and 2 threads and with MKL held to AVX2; the build takes about
1.7x as long as an unpinned one for tiny-1m (96 s against 57 s) and 2.2x for tiny-0.3m (81 s against 37 s)."""


def cache_root() -> Path:
    """Where base models live: ``$ISOSWEEP_CACHE`` or ``~/.cache/isosweep``."""
    return Path(os.environ.get("ISOSWEEP_CACHE", Path.home() / ".cache" / "isosweep"))


def base_model_dir(size: str, task: str, seed: int) -> Path:
    """The cache directory of one base model (it may not exist yet)."""
    recipe = recipe_for(size, task)
    parts = [size, asdict(SIZES[size]), task, _recipe_key(recipe), warmup_lr(recipe, size), seed, WARMUP_VERSION]
    version = getattr(get_task(task), "version", None)  # a task that versions what its base model learns (codes)
    key = json.dumps(parts + ([version] if version else []), sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root() / "models" / f"{size}-{task}-s{seed}-{digest}"


def ensure_base_model(size: str, task: str, seed: int = 0, log: Callable[[str], None] = print) -> Path:
    """Return the base model directory, building it first if it is not cached."""
    if size not in SIZES:
        raise ValueError(f"unknown tiny size {size!r}; allowed: {', '.join(SIZES)}")
    recipe_for(size, task)  # a task without a recipe for this size says so before any lock is taken
    return build_once(base_model_dir(size, task, seed), lambda tmp: build_pinned(size, task, seed, tmp, log))


def build_once(target: Path, build: Callable[[Path], object]) -> Path:
    """``target``, built by ``build(tmp)`` into a temporary folder renamed to it, unless it holds a
    ``base_report.json`` already. One builder per model on this machine: a second process asking for it (a packed
    trial, a test worker) waits for the first instead of building it again; the kernel drops the lock if its holder
    dies, and a failed build leaves nothing behind."""
    if (target / REPORT_FILE).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / REPORT_FILE).exists():
            return target
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".build-"))
        try:
            build(tmp)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def build_pinned(size: str, task: str, seed: int, out: Path, log: Callable[[str], None] = print,
                 recipe: WarmupRecipe | None = None) -> dict:
    """``build_base_model`` in a fresh interpreter under ``PINNED_NUMERICS``; its report. The build's own lines
    go to ``log``; a failed build raises ``RuntimeError`` with the end of its output."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, **PINNED_NUMERICS,
           "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", "isosweep.models.warmup", size, task, str(seed), str(out)]
    if recipe is not None:
        cmd.append(json.dumps(asdict(recipe)))
    tail: deque[str] = deque(maxlen=20)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            tail.append(line.rstrip())
            if tail[-1].startswith("[warm-up"):
                log(tail[-1])
    if proc.returncode != 0:
        last = "\n  ".join(tail)
        raise RuntimeError(f"building base model {size} on {task} (seed {seed}) failed, exit {proc.returncode}:\n  {last}")
    return json.loads((out / REPORT_FILE).read_text())


def _warmup_batch(task: Task, recipe: WarmupRecipe, rng: random.Random, tokenizer) -> tuple[torch.Tensor, ...]:
    """One batch of ``prompt + solution + <eos>`` sequences, loss on the solution part only."""
    levels = list(recipe.level_weights)
    weights = [recipe.level_weights[lv] for lv in levels]
    rows, masks = [], []
    for _ in range(recipe.batch):
        level = rng.choices(levels, weights)[0]
        problem = task.problems("train", level, 1, rng.randrange(2**31))[0]
        prompt = tokenizer(problem.prompt, add_special_tokens=False)["input_ids"]
        answer = tokenizer(task.solution(problem, rng), add_special_tokens=False)["input_ids"]
        rows.append(prompt + answer + [tokenizer.eos_token_id])
        masks.append([0] * len(prompt) + [1] * (len(answer) + 1))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    loss_mask = torch.zeros_like(ids)
    for i, (row, mask) in enumerate(zip(rows, masks)):
        ids[i, :len(row)] = torch.tensor(row)
        attention[i, :len(row)] = 1
        loss_mask[i, :len(row)] = torch.tensor(mask)
    return ids, attention, loss_mask


def stage_pass_rate(model, tokenizer, task: Task, recipe: WarmupRecipe, seed: int) -> float:
    """pass@1 on the shared stage set: the first ``stage_problems`` eval problems of ``stage_level`` (the same
    problems for every size and seed of the warm-up), ``probe_samples`` samples each."""
    problems = task.problems("eval", recipe.stage_level, recipe.stage_problems, 0)
    engine = HFEngine(model, tokenizer, recipe.max_new_tokens, temperature=1.0)
    model.eval()
    rollouts = engine.generate([p.prompt for p in problems], recipe.probe_samples, seed=seed)
    model.train()
    rewards = [task.reward(problems[i // recipe.probe_samples], text) for i, text in enumerate(rollouts.texts)]
    return sum(rewards) / len(rewards)


def build_base_model(size: str, task_name: str, seed: int, out: Path,
                     log: Callable[[str], None] = print, recipe: WarmupRecipe | None = None) -> dict:
    """Warm a fresh tiny model up on ``task_name`` and save it, its tokenizer, probe and report to ``out``.

    ``recipe`` (default: ``recipe_for(size, task_name)``) with ``stage_pass`` set warms up to that stage
    and raises ``RuntimeError`` if ``steps`` do not get there."""
    task, recipe = get_task(task_name), recipe or recipe_for(size, task_name)
    tokenizer = char_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(qwen2_config(size, len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id))
    optimizer = torch.optim.AdamW(model.parameters(), lr=warmup_lr(recipe, size), weight_decay=0.01)
    staged = recipe.stage_pass is not None

    def shape(s: int) -> float:  # a 50-step ramp, then a cosine over ``steps`` (constant when warming to a stage)
        return min(1.0, (s + 1) / 50) * (1.0 if staged else 0.5 * (1 + math.cos(math.pi * s / recipe.steps)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, shape)
    rng = random.Random(seed)
    start = time.perf_counter()
    stage: dict[str, float] = {}
    rate = math.nan
    every = recipe.stage_every
    saved = None  # the state at the last check below the stage, to step back to when a check overshoots it
    model.train()
    step = 0
    while step < recipe.steps:
        ids, attention, loss_mask = _warmup_batch(task, recipe, rng, tokenizer)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1]
        target, weight = ids[:, 1:], loss_mask[:, 1:].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        loss = (nll * weight).sum() / weight.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        step += 1
        if step % 100 == 1 or step == recipe.steps:
            log(f"[warm-up {size}/{task_name}] step {step}/{recipe.steps} loss {loss.item():.3f}")
        if not staged or step % every:
            continue
        rate = stage_pass_rate(model, tokenizer, task, recipe, seed)
        log(f"[warm-up {size}/{task_name}] step {step}: stage pass@1 {rate:.3f} (target {recipe.stage_pass})")
        if rate < recipe.stage_pass:
            if every > 1:
                saved = (step, copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()),
                         schedule.state_dict(), rng.getstate())
            continue
        if rate > recipe.stage_pass + recipe.stage_tolerance and saved is not None and every > 1:
            # learning the task "clicks": the rate can jump by 0.15 between two checks. Go back to the last
            # check below the stage and check every step from there (the same batches: the data stream rewinds)
            step, weights, moments, ramp, data = saved
            model.load_state_dict(weights)
            optimizer.load_state_dict(moments)
            schedule.load_state_dict(ramp)
            rng.setstate(data)
            every = 1
            log(f"[warm-up {size}/{task_name}] {rate:.3f} overshoots the stage by more than "
                f"{recipe.stage_tolerance}: back to step {step}, checking every step")
            continue
        stage = {"steps": step, "pass@1": round(rate, 4), "target": recipe.stage_pass, "level": recipe.stage_level,
                 "problems": recipe.stage_problems, "checked_every": every}
        break
    if staged and not stage:
        raise RuntimeError(f"warm-up of {size} on {task_name} did not reach the stage (level-{recipe.stage_level} "
                           f"pass@1 {recipe.stage_pass}) within {recipe.steps} steps (last check {rate:.3f})")
    train_seconds = time.perf_counter() - start

    model.eval()
    engine = HFEngine(model, tokenizer, recipe.max_new_tokens, temperature=1.0)
    probe = probe_pass_rates(engine, task, recipe.probe_levels, recipe.probe_pool, recipe.probe_samples, seed)
    report = {
        "size": size,
        "task": task_name,
        "seed": seed,
        "warmup_version": WARMUP_VERSION,
        "parameters": sum(p.numel() for p in model.parameters()),
        "warmup_seconds": round(train_seconds, 1),
        "eval_pass@1": level_pass_rates(probe, "eval"),
        **({"stage": stage} if staged else {}),
        "numerics": {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__,
                     "threads": torch.get_num_threads(), "MKL_CBWR": os.environ.get("MKL_CBWR")},
    }
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / PROBE_FILE).write_text(json.dumps(probe))
    report["weights_sha256"] = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()[:16]
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2))
    log(f"[warm-up {size}/{task_name}] done in {train_seconds:.0f}s; eval pass@1 by level {report['eval_pass@1']}")
    return report


def tabular_model_dir(task: str, root: Path) -> Path:
    """The cache directory of the tabular base model of ``task`` under ``root`` (it may not exist yet)."""
    key = json.dumps([TABULAR, task, TABULAR_VERSION, RECIPES[task].probe_samples, RECIPES[task].probe_pool])
    return root / "models" / f"{TABULAR}-{task}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def ensure_tabular_model(task_name: str, root: Path) -> Path:
    """The planted tabular base model of a codes task, built (seconds) and probed like a tiny model the first
    time: a ``from_pretrained`` directory with the character tokenizer, ``probe.json`` and ``base_report.json``."""
    task = get_task(task_name)
    if not isinstance(task, CodesTask):
        raise ValueError(f"model.name {TABULAR!r} is the codes tasks' planted control; task {task_name!r} is not one "
                         "(allowed: codes, codes-nodrift, codes-transfer)")
    return build_once(tabular_model_dir(task_name, root), lambda tmp: _build_tabular(task, tmp))


def _build_tabular(task: CodesTask, out: Path) -> None:
    """Plant, probe and save the tabular base model of ``task`` into ``out``."""
    tokenizer = char_tokenizer()
    config = TabularConfig(families=len(task.families), vocab_size=len(tokenizer),
                           digit_ids=tokenizer.convert_tokens_to_ids(list("0123456789")),
                           marker_id=tokenizer.convert_tokens_to_ids(">"),
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = TabularPolicy(config)
    codes = [f.code for f in task.families]
    model.plant(codes, [f.epsilon for f in task.families])
    recipe = RECIPES[task.name]
    engine = HFEngine(model, tokenizer, recipe.max_new_tokens, temperature=1.0)
    probe = probe_pass_rates(engine, task, recipe.probe_levels, recipe.probe_pool, recipe.probe_samples, 0)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / PROBE_FILE).write_text(json.dumps(probe))
    report = {"model": TABULAR, "task": task.name, "tabular_version": TABULAR_VERSION,
              "parameters": sum(p.numel() for p in model.parameters()),
              "planted_pass_rates": [round(r, 6) for r in model.pass_rates(codes).tolist()],
              "eval_pass@1": level_pass_rates(probe, "eval")}
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2))


def resolve_model(name: str, task: str, seed: int = 0) -> str:
    """What ``from_pretrained`` should load for ``model.name``: a tiny size's base model, the codes tasks' planted
    tabular control (``tabular``, :mod:`isosweep.models.tabular`), or ``name`` itself."""
    if name in SIZES:
        return str(ensure_base_model(name, task, seed))
    if name == TABULAR:
        return str(ensure_tabular_model(task, cache_root()))
    return name


def _main(argv: list[str]) -> None:
    """``python -m isosweep.models.warmup SIZE TASK SEED OUT [RECIPE_JSON]``: the build ``build_pinned`` runs."""
    size, task, seed, out = argv[:4]
    recipe = None
    if len(argv) > 4:
        fields = json.loads(argv[4])
        fields["level_weights"] = {int(k): v for k, v in fields["level_weights"].items()}
        fields["probe_levels"] = tuple(fields["probe_levels"])
        recipe = WarmupRecipe(**fields)
    build_base_model(size, task, int(seed), Path(out), log=lambda line: print(line, flush=True), recipe=recipe)


if __name__ == "__main__":
    _main(sys.argv[1:])
