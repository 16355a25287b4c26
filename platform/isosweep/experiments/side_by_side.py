"""The side-by-side of ``make bench``: an isosweep trial against TRL's ``GRPOTrainer`` and a plain
PyTorch loop, on the same base model, problems, batch shape, completion length, precision and
KL setting, interleaved in one run.

Each contender runs in its own subprocess (``python -m isosweep.experiments.side_by_side
CONTENDER ...``) so none inherits another's threads, caches or memory, and the contenders take
turns: repeat 1 of each, then repeat 2 of each, ... so a machine that slows down mid-run slows
all of them alike. A run's seconds per step is the median over its steps after the first
``WARMUP_STEPS``; what is reported per contender is the median over repeats and the spread
(min, max). Nothing asserts a speed: only ratios measured in one run mean anything here.

- ``isosweep``: a real trial as ``isosweep trial`` runs it (the launcher and rollout engine a trial
  picks by default: in process, with the in-process engine, for the tiny models on CPU), seconds per
  step from the ``time/step_s`` of ``steps.jsonl``; its fixed cost (trial wall time less its steps
  and evaluations) is broken down by the ``time/start_*`` fields of the first eval record.
- ``trl``: TRL's ``GRPOTrainer`` (:mod:`isosweep.experiments.trl_baseline`), needs the ``bench`` extra.
- ``torch``: the floor of what the hardware does for this step: sample with a KV cache, score,
  one forward and backward of the policy and one AdamW step; no reference model, no logging.
- ``torch-overlap``: the plain loop with sampling moved to a second thread, one step ahead and one
  policy version behind (the next step's completions are sampled by this step's weights while they
  train), each thread on one core: what overlapping generation with training across the two cores
  of a small machine buys over torch's own use of them.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from isosweep.algo.grpo import group_advantages, token_logprobs
from isosweep.models.warmup import ensure_base_model
from isosweep.rollout.hf import sample_tokens
from isosweep.spec.trial import kl_coef, launcher_choice, learning_rate, load_trial, rollout_engine
from isosweep.tasks import get_task
from isosweep.trial.files import TrialDir
from isosweep.trial.job import run_trial
from isosweep.trial.learner import LAUNCHER_ENV
from isosweep.trial.loop import batch_problems, problem_sets

CONTENDERS = ("isosweep", "trl", "torch", "torch-overlap")
WARMUP_STEPS = 2
"""Steps of each run left out of its seconds per step (first-call allocations, lazy imports)."""


@dataclass(frozen=True)
class Setup:
    """What every contender is given: one base model, its train problems and one batch shape."""

    size: str
    model_path: str
    task: str
    seed: int
    Bp: int
    n: int
    max_new_tokens: int
    temperature: float
    lr: float
    kl_coef: float
    clip_low: float
    clip_high: float
    grad_clip: float
    overrides: tuple[str, ...]

    @classmethod
    def of(cls, size: str, trial_yaml: str = "sweeps/trials/easy.yaml", Bp: int = 16, n: int = 8,
           max_new_tokens: int = 8, kl: float = 1e-3) -> Setup:
        """The benchmark setting on base model ``size``: the easy trial at ``Bp``, ``n`` and KL ``kl``."""
        overrides = (f"model.name={size}", f"Bp={Bp}", f"n={n}", f"rollout.max_new_tokens={max_new_tokens}",
                     f"algorithm.kl_coef={kl}", "algorithm.entropy_coef=0", "budget=1000000")
        cfg = load_trial(trial_yaml, list(overrides))
        path = ensure_base_model(size, cfg.task.name, cfg.model.warmup_seed)
        return cls(size, str(path), cfg.task.name, cfg.seed, Bp, n, max_new_tokens, cfg.rollout.temperature,
                   learning_rate(cfg), kl_coef(cfg), cfg.algorithm.clip_low, cfg.algorithm.clip_high,
                   cfg.algorithm.grad_clip, overrides[:-1])

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "overrides": list(self.overrides)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Setup:
        return cls(**{**data, "overrides": tuple(data["overrides"])})

    def trial_config(self, steps: int, trial_yaml: str = "sweeps/trials/easy.yaml"):
        """The isosweep trial of this setting: ``steps`` steps, evaluated at the start and the end only."""
        return load_trial(trial_yaml, [*self.overrides, f"budget={steps * self.Bp * self.n}", f"eval.every={steps}"])

    def step_problems(self, steps: int) -> list:
        """The problems of steps ``0 .. steps - 1`` in the isosweep trial's order, ``Bp`` per step."""
        train = problem_sets(self.trial_config(steps), self.model_path, engine=None).train
        return [p for step in range(steps) for p in batch_problems(train, self.Bp, step, self.seed)]


def run_torch(setup: Setup, steps: int, overlap: bool = False) -> list[float]:
    """The plain loop: seconds per step.

    With ``overlap``, the completions of step ``s + 1`` are sampled on a second thread, by a copy of the
    weights of step ``s``, while step ``s`` trains (one step off-policy), each thread running torch on one
    core: whether splitting a step's work across the cores that way beats splitting every operation across
    them (torch's own threads, the plain loop's way).
    """
    torch.manual_seed(setup.seed)
    task = get_task(setup.task)
    tokenizer = AutoTokenizer.from_pretrained(setup.model_path)
    model = AutoModelForCausalLM.from_pretrained(setup.model_path, dtype=torch.float32)
    sampler = copy.deepcopy(model).eval().requires_grad_(False) if overlap else model
    if overlap:
        torch.set_num_threads(1)  # per calling thread: the trainer and the sampler each on one core
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr, betas=(0.9, 0.99), weight_decay=0.0)
    problems = setup.step_problems(steps)
    generator = torch.Generator().manual_seed(setup.seed)

    def sample(step: int):
        chosen = problems[step * setup.Bp:(step + 1) * setup.Bp]
        prompts = [ids for ids in tokenizer([p.prompt for p in chosen], add_special_tokens=False)["input_ids"]
                   for _ in range(setup.n)]
        sampler.eval()
        tokens, _, lengths = sample_tokens(sampler, prompts, setup.max_new_tokens, setup.temperature,
                                           tokenizer.eos_token_id, tokenizer.pad_token_id, generator)
        completions = [tokens[i, :length].tolist() for i, length in enumerate(lengths.tolist())]
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        rewards = torch.tensor([float(task.reward(chosen[i // setup.n], t)) for i, t in enumerate(texts)])
        return prompts, completions, rewards

    seconds = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(sample, 0) if overlap else None
        for step in range(steps):
            start = time.perf_counter()
            prompts, completions, rewards = pending.result() if overlap else sample(step)
            if overlap and step + 1 < steps:
                pending = pool.submit(sample, step + 1)  # by the weights of this step, while they train
            advantages, _ = group_advantages(rewards.view(setup.Bp, setup.n), True)
            width = max(len(p) + len(c) for p, c in zip(prompts, completions))
            ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
            mask = torch.zeros((len(prompts), width - 1))
            for i, (p, c) in enumerate(zip(prompts, completions)):
                ids[i, :len(p) + len(c)] = torch.tensor(p + c)
                mask[i, len(p) - 1:len(p) - 1 + len(c)] = 1.0
            model.train()
            logits = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long()).logits[:, :-1]
            logp = token_logprobs(logits, ids[:, 1:], setup.temperature)
            loss = -(advantages.reshape(-1, 1) * logp * mask).sum() / mask.sum()
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), setup.grad_clip)
            optimizer.step()
            if overlap and step + 1 < steps:
                pending.result()  # the sampler is done with this step's weights before they change
                sampler.load_state_dict(model.state_dict())
            seconds.append(time.perf_counter() - start)
    return seconds


@dataclass(frozen=True)
class TrialCost:
    """Where an isosweep run's time went beyond its steps: the engine and launcher it picked, the trial's wall
    seconds, its fixed cost (wall time less its steps and evaluations), its first evaluation, the median
    ``time/*`` of its steady-state steps (``split_s``) and its first eval record's ``time/start_*`` (``start_s``).
    ``ray_start_s``: the Ray start that runs before the in-process launcher measured (None since; its ``launcher``
    is None in those runs' figures)."""

    engine: str
    launcher: str | None
    trial_wall_s: float
    fixed_s: float
    first_eval_s: float
    split_s: dict[str, float]
    start_s: dict[str, float]
    ray_start_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine": self.engine}
        if self.launcher is not None:
            out["launcher"] = self.launcher
        if self.ray_start_s is not None:
            out["ray_start_s"] = self.ray_start_s
        return {**out, "trial_wall_s": self.trial_wall_s, "fixed_s": self.fixed_s, "first_eval_s": self.first_eval_s,
                "split_s": dict(self.split_s), "start_s": dict(self.start_s)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialCost:
        return cls(engine=data["engine"], launcher=data.get("launcher"), trial_wall_s=data["trial_wall_s"],
                   fixed_s=data["fixed_s"], first_eval_s=data["first_eval_s"], split_s=dict(data["split_s"]),
                   start_s=dict(data["start_s"]), ray_start_s=data.get("ray_start_s"))


@dataclass(frozen=True)
class ContenderRun:
    """One run of a contender: the seconds of each of its steps, or why it failed (``error``; ``seconds`` None);
    ``process_s`` the wall seconds of its subprocess (None inside the subprocess, which does not time itself);
    ``trial`` the isosweep trial's cost breakdown (None for the other contenders)."""

    seconds: tuple[float, ...] | None
    error: str | None = None
    process_s: float | None = None
    trial: TrialCost | None = None

    def to_json(self) -> dict[str, Any]:
        if self.seconds is None:
            out: dict[str, Any] = {"error": self.error}
        else:
            out = {"seconds": list(self.seconds), **(self.trial.to_json() if self.trial is not None else {})}
        if self.process_s is not None:
            out["process_s"] = self.process_s
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContenderRun:
        if "seconds" not in data:
            return cls(None, error=data["error"], process_s=data.get("process_s"))
        return cls(tuple(data["seconds"]), process_s=data.get("process_s"),
                   trial=TrialCost.from_json(data) if "engine" in data else None)

    def steady_s(self) -> float:
        """The median seconds per step after the first ``WARMUP_STEPS`` (all of them in a shorter run)."""
        return statistics.median(self.seconds[WARMUP_STEPS:] or self.seconds)


@dataclass(frozen=True)
class Speed:
    """A contender's seconds per step over the repeats that finished: the median of each run's steady state, its
    range, rollouts per second at the median, and how many repeats finished and failed."""

    s_per_step: float
    s_per_step_min: float
    s_per_step_max: float
    rollouts_per_s: float
    repeats: int
    failed: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Speed:
        return cls(data["s_per_step"], data["s_per_step_min"], data["s_per_step_max"], data["rollouts_per_s"],
                   int(data["repeats"]), int(data["failed"]))


@dataclass(frozen=True)
class ContenderSummary:
    """A contender on one size: its runs, and their :class:`Speed` (None: no run finished; then ``error`` is the
    last run's)."""

    runs: tuple[ContenderRun, ...]
    speed: Speed | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        head = {"error": self.error} if self.speed is None else self.speed.to_json()
        return {**head, "runs": [run.to_json() for run in self.runs]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ContenderSummary:
        runs = tuple(ContenderRun.from_json(run) for run in data["runs"])
        if "s_per_step" not in data:
            return cls(runs, None, data["error"])
        return cls(runs, Speed.from_json(data))


@dataclass(frozen=True)
class SizeResult:
    """Every contender on one base model size: the setting, each contender's summary, isosweep's speed-up over
    each other contender (its seconds per step over isosweep's; key: that contender) and the overlapped loop's
    over the plain one (None where a side has no finished run)."""

    setup: Setup
    contenders: dict[str, ContenderSummary]
    speedups: dict[str, float]
    overlap_speedup: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"setup": self.setup.to_json(),
                               **{name: summary.to_json() for name, summary in self.contenders.items()},
                               **{f"speedup_vs_{name}": value for name, value in self.speedups.items()}}
        if self.overlap_speedup is not None:
            out["overlap_speedup"] = self.overlap_speedup
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SizeResult:
        return cls(Setup.from_json(data["setup"]),
                   {name: ContenderSummary.from_json(data[name]) for name in data if name in CONTENDERS},
                   {key.removeprefix("speedup_vs_"): value for key, value in data.items()
                    if key.startswith("speedup_vs_")},
                   data.get("overlap_speedup"))


def run_isosweep(setup: Setup, steps: int, out: Path) -> ContenderRun:
    """A real trial as ``isosweep trial`` runs it (the launcher and engine its config picks by default): seconds
    per step and the fixed cost, broken down."""
    cfg = setup.trial_config(steps)
    start = time.perf_counter()
    run_trial(cfg, out)
    wall = time.perf_counter() - start
    trial = TrialDir(out)
    step_rows, records = trial.steps(), trial.records()
    stepping = sum(row["time/step_s"] for row in step_rows) + sum(r["time/eval_s"] for r in records)
    first = records[0]
    cost = TrialCost(
        engine=rollout_engine(cfg), launcher=launcher_choice(cfg)[0], trial_wall_s=wall, fixed_s=wall - stepping,
        first_eval_s=first["time/eval_s"],
        split_s={key.removeprefix("time/"): statistics.median(row[key] for row in step_rows[WARMUP_STEPS:])
                 for key in step_rows[0] if key.startswith("time/")},
        start_s={key.removeprefix("time/start_"): value for key, value in first.items()
                 if key.startswith("time/start_")})
    return ContenderRun(tuple(row["time/step_s"] for row in step_rows), trial=cost)


def _one(contender: str, setup: Setup, steps: int, out: Path) -> ContenderRun:
    """One run of ``contender`` in this process."""
    if contender in ("torch", "torch-overlap"):
        return ContenderRun(tuple(run_torch(setup, steps, overlap=contender == "torch-overlap")))
    if contender == "trl":
        from isosweep.experiments.trl_baseline import run_trl  # trl: the bench extra, not installed by default

        return ContenderRun(tuple(run_trl(setup, steps, str(out))))
    return run_isosweep(setup, steps, out)


def _spawn(contender: str, setup: Setup, steps: int, work: Path) -> ContenderRun:
    """One run of ``contender`` in a fresh subprocess; its figures, or why it failed."""
    out = work / f"{contender}-{time.monotonic_ns()}"
    result = out.with_suffix(".json")
    cmd = [sys.executable, "-m", "isosweep.experiments.side_by_side", contender, "--setup",
           json.dumps(setup.to_json()), "--steps", str(steps), "--out", str(out), "--result", str(result)]
    started = time.perf_counter()
    # not this process's torch.distributed world, if it has one: a contender's own launcher would join it
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return ContenderRun(None, error=proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                            else f"exit {proc.returncode}", process_s=time.perf_counter() - started)
    figures = ContenderRun.from_json(json.loads(result.read_text()))  # the child's file, read back typed
    return replace(figures, process_s=time.perf_counter() - started)


def summarize(runs: list[ContenderRun], rollouts_per_step: int) -> ContenderSummary:
    """Median and spread over repeats of each run's steady-state seconds per step, and rollouts/s."""
    ok = [run for run in runs if run.seconds is not None]
    if not ok:
        return ContenderSummary(tuple(runs), None, runs[-1].error or "no run finished")
    per_run = [run.steady_s() for run in ok]
    median = statistics.median(per_run)
    return ContenderSummary(tuple(runs), Speed(median, min(per_run), max(per_run), rollouts_per_step / median,
                                               len(per_run), len(runs) - len(ok)))


def side_by_side(sizes: list[str], repeats: int = 3, steps: int = 12, contenders: tuple[str, ...] = CONTENDERS,
                 log=print) -> dict[str, SizeResult]:
    """Every contender on every size, ``repeats`` interleaved runs each; medians, spreads and ratios (key: size)."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="isosweep-bench-") as tmp:
        for size in sizes:
            setup = Setup.of(size)
            runs: dict[str, list[ContenderRun]] = {c: [] for c in contenders}
            for r in range(repeats):
                for contender in contenders:
                    run = _spawn(contender, setup, steps, Path(tmp))
                    runs[contender].append(run)
                    said = (f"{statistics.median(run.seconds[WARMUP_STEPS:]):.3f} s/step" if run.seconds is not None
                            else f"failed: {run.error}")
                    log(f"[bench] {size} repeat {r + 1}/{repeats} {contender:8s} {said}")
            summaries = {c: summarize(runs[c], setup.Bp * setup.n) for c in contenders}
            speed = {c: summary.speed.s_per_step for c, summary in summaries.items() if summary.speed is not None}
            speedups = ({other: speed[other] / speed["isosweep"] for other in contenders
                         if other != "isosweep" and other in speed} if "isosweep" in speed else {})
            overlap = speed["torch"] / speed["torch-overlap"] if {"torch", "torch-overlap"} <= set(speed) else None
            results[size] = SizeResult(setup, summaries, speedups, overlap)
    return results


def table(results: dict[str, SizeResult]) -> str:
    """A Markdown table of rollouts/s per size and contender, with isosweep's ratio to TRL."""
    lines = ["| size | contender | s/step (median, min-max) | rollouts/s |", "| --- | --- | --- | --- |"]
    for size, row in results.items():
        for contender in CONTENDERS:
            summary = row.contenders.get(contender)
            if summary is None:
                continue
            fig = summary.speed
            if fig is None:
                lines.append(f"| {size} | {contender} | failed: {summary.error} | |")
                continue
            name = contender + (f" ({summary.runs[0].trial.engine})" if contender == "isosweep" else "")
            lines.append(f"| {size} | {name} | {fig.s_per_step:.3f} ({fig.s_per_step_min:.3f}-"
                         f"{fig.s_per_step_max:.3f}) | {fig.rollouts_per_s:.0f} |")
        if "trl" in row.speedups:
            lines.append(f"| {size} | isosweep / TRL | | {row.speedups['trl']:.2f}x |")
        if row.overlap_speedup is not None:
            lines.append(f"| {size} | torch-overlap / torch | | {row.overlap_speedup:.2f}x |")
    return "\n".join(lines)


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("contender", choices=CONTENDERS)
    parser.add_argument("--setup", required=True, help="the Setup as JSON")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True, help="the run's working folder")
    parser.add_argument("--result", required=True, help="where to write its figures (JSON)")
    args = parser.parse_args()
    setup = Setup.from_json(json.loads(args.setup))
    figures = _one(args.contender, setup, args.steps, Path(args.out))
    Path(args.result).write_text(json.dumps(figures.to_json()))


if __name__ == "__main__":
    _main()
