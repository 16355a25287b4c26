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
from dataclasses import asdict, dataclass
from pathlib import Path

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


def run_isosweep(setup: Setup, steps: int, out: Path) -> dict:
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
    return {"seconds": [row["time/step_s"] for row in step_rows], "engine": rollout_engine(cfg),
            "launcher": launcher_choice(cfg)[0], "trial_wall_s": wall, "fixed_s": wall - stepping,
            "first_eval_s": first["time/eval_s"],
            "split_s": {key.removeprefix("time/"): statistics.median(row[key] for row in step_rows[WARMUP_STEPS:])
                        for key in step_rows[0] if key.startswith("time/")},
            "start_s": {key.removeprefix("time/start_"): value for key, value in first.items()
                        if key.startswith("time/start_")}}


def _one(contender: str, setup: Setup, steps: int, out: Path) -> dict:
    """One run of ``contender`` in this process."""
    if contender in ("torch", "torch-overlap"):
        return {"seconds": run_torch(setup, steps, overlap=contender == "torch-overlap")}
    if contender == "trl":
        from isosweep.experiments.trl_baseline import run_trl  # trl: the bench extra, not installed by default

        return {"seconds": run_trl(setup, steps, str(out))}
    return run_isosweep(setup, steps, out)


def _spawn(contender: str, setup: Setup, steps: int, work: Path) -> dict:
    """One run of ``contender`` in a fresh subprocess; its figures, or why it failed."""
    out = work / f"{contender}-{time.monotonic_ns()}"
    result = out.with_suffix(".json")
    cmd = [sys.executable, "-m", "isosweep.experiments.side_by_side", contender, "--setup", json.dumps(asdict(setup)),
           "--steps", str(steps), "--out", str(out), "--result", str(result)]
    started = time.perf_counter()
    # not this process's torch.distributed world, if it has one: a contender's own launcher would join it
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}",
                "process_s": time.perf_counter() - started}
    figures = json.loads(result.read_text())
    figures["process_s"] = time.perf_counter() - started
    return figures


def summarize(runs: list[dict], rollouts_per_step: int) -> dict:
    """Median and spread over repeats of each run's steady-state seconds per step, and rollouts/s."""
    ok = [run for run in runs if "seconds" in run]
    if not ok:
        return {"error": runs[-1].get("error", "no run finished"), "runs": runs}
    per_run = [statistics.median(run["seconds"][WARMUP_STEPS:] or run["seconds"]) for run in ok]
    median = statistics.median(per_run)
    return {"s_per_step": median, "s_per_step_min": min(per_run), "s_per_step_max": max(per_run),
            "rollouts_per_s": rollouts_per_step / median, "repeats": len(per_run), "failed": len(runs) - len(ok),
            "runs": runs}


def side_by_side(sizes: list[str], repeats: int = 3, steps: int = 12, contenders: tuple[str, ...] = CONTENDERS,
                 log=print) -> dict:
    """Every contender on every size, ``repeats`` interleaved runs each; medians, spreads and ratios."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="isosweep-bench-") as tmp:
        for size in sizes:
            setup = Setup.of(size)
            runs: dict[str, list[dict]] = {c: [] for c in contenders}
            for r in range(repeats):
                for contender in contenders:
                    run = _spawn(contender, setup, steps, Path(tmp))
                    runs[contender].append(run)
                    said = (f"{statistics.median(run['seconds'][WARMUP_STEPS:]):.3f} s/step" if "seconds" in run
                            else f"failed: {run['error']}")
                    log(f"[bench] {size} repeat {r + 1}/{repeats} {contender:8s} {said}")
            row = {"setup": asdict(setup), **{c: summarize(runs[c], setup.Bp * setup.n) for c in contenders}}
            if "s_per_step" in row.get("isosweep", {}):
                for other in contenders:
                    if other != "isosweep" and "s_per_step" in row[other]:
                        row[f"speedup_vs_{other}"] = row[other]["s_per_step"] / row["isosweep"]["s_per_step"]
            if "s_per_step" in row.get("torch", {}) and "s_per_step" in row.get("torch-overlap", {}):
                row["overlap_speedup"] = row["torch"]["s_per_step"] / row["torch-overlap"]["s_per_step"]
            results[size] = row
    return results


def table(results: dict) -> str:
    """A Markdown table of rollouts/s per size and contender, with isosweep's ratio to TRL."""
    lines = ["| size | contender | s/step (median, min-max) | rollouts/s |", "| --- | --- | --- | --- |"]
    for size, row in results.items():
        for contender in CONTENDERS:
            fig = row.get(contender)
            if fig is None:
                continue
            if "s_per_step" not in fig:
                lines.append(f"| {size} | {contender} | failed: {fig['error']} | |")
                continue
            name = contender + (f" ({fig['runs'][0]['engine']})" if contender == "isosweep" else "")
            lines.append(f"| {size} | {name} | {fig['s_per_step']:.3f} ({fig['s_per_step_min']:.3f}-"
                         f"{fig['s_per_step_max']:.3f}) | {fig['rollouts_per_s']:.0f} |")
        if "speedup_vs_trl" in row:
            lines.append(f"| {size} | isosweep / TRL | | {row['speedup_vs_trl']:.2f}x |")
        if "overlap_speedup" in row:
            lines.append(f"| {size} | torch-overlap / torch | | {row['overlap_speedup']:.2f}x |")
    return "\n".join(lines)


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("contender", choices=CONTENDERS)
    parser.add_argument("--setup", required=True, help="the Setup as JSON")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True, help="the run's working folder")
    parser.add_argument("--result", required=True, help="where to write its figures (JSON)")
    args = parser.parse_args()
    fields = json.loads(args.setup)
    setup = Setup(**{**fields, "overrides": tuple(fields["overrides"])})
    figures = _one(args.contender, setup, args.steps, Path(args.out))
    Path(args.result).write_text(json.dumps(figures))


if __name__ == "__main__":
    _main()
