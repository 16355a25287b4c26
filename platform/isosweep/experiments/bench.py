"""``make bench``: isosweep against TRL and a plain PyTorch loop, rollout throughput of each
engine and tiny size, and where one trial's time goes.

Figures go to ``bench/results.json`` (and the side-by-side as a Markdown table to
``bench/side_by_side.md``); nothing here asserts a speed (the machines are noisy: compare
numbers within one run). The side-by-side is :mod:`isosweep.experiments.side_by_side`.
Throughput is measured on the task's prompts with ``n = 8`` samples per prompt at batches of
32, 128 and 512 rollouts, after one warm-up call; the trial split averages the per-step timings
a real trial logs (``time/*`` in ``steps.jsonl``), one trial per engine.
"""

from __future__ import annotations

import json
import platform as host
import shutil
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from isosweep.experiments.side_by_side import side_by_side
from isosweep.experiments.side_by_side import table as side_by_side_table
from isosweep.models.sizes import FAMILY
from isosweep.models.warmup import ensure_base_model
from isosweep.rollout.hf import HFEngine
from isosweep.rollout.vllm import VLLMEngine, vllm_available
from isosweep.spec.trial import load_trial, rollout_engine
from isosweep.tasks import get_task
from isosweep.trial.files import TrialDir
from isosweep.trial.job import run_trial

BATCHES = (32, 128, 512)
SAMPLES_PER_PROMPT = 8
MAX_NEW_TOKENS = 8


def make_bench_engine(name: str, model_path: Path, threads: int | None = None):
    """A rollout engine for benchmarking (``hf`` or ``vllm``, bf16 rollout weights)."""
    if name == "hf":
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        return HFEngine(model, AutoTokenizer.from_pretrained(model_path), MAX_NEW_TOKENS, 1.0, precision="bf16")
    return VLLMEngine(str(model_path), MAX_NEW_TOKENS, 1.0, precision="bf16")


def throughput(engine, prompts: list[str], batch: int, repeats: int = 3) -> dict[str, float]:
    """Rollouts/s and tokens/s of ``engine`` at ``batch`` rollouts per call (best of ``repeats``)."""
    chosen = prompts[: batch // SAMPLES_PER_PROMPT]
    engine.generate(chosen, SAMPLES_PER_PROMPT, seed=0)  # warm-up
    best = float("inf")
    tokens = 0
    for r in range(repeats):
        start = time.perf_counter()
        rollouts = engine.generate(chosen, SAMPLES_PER_PROMPT, seed=r + 1)
        elapsed = time.perf_counter() - start
        if elapsed < best:
            best, tokens = elapsed, rollouts.num_tokens
    return {"batch": batch, "seconds": best, "rollouts_per_s": batch / best, "tokens_per_s": tokens / best}


def engine_table(engines: list[str], sizes: list[str]) -> list[dict]:
    """Throughput of every (engine, size, batch)."""
    prompts = [p.prompt for p in get_task("arithmetic").problems("eval", 2, max(BATCHES), seed=0)]
    rows = []
    for size in sizes:
        path = ensure_base_model(size, "arithmetic", 0)
        for name in engines:
            start = time.perf_counter()
            engine = make_bench_engine(name, path)
            startup = time.perf_counter() - start
            for batch in BATCHES:
                row = {"engine": name, "size": size, "startup_s": startup, **throughput(engine, prompts, batch)}
                print(f"[bench] {name:5s} {size:9s} batch {batch:4d}: {row['rollouts_per_s']:8.0f} rollouts/s "
                      f"{row['tokens_per_s']:8.0f} tokens/s", flush=True)
                rows.append(row)
            del engine
    return rows


def trial_split(trial_yaml: str, overrides: list[str], out: Path) -> dict[str, float]:
    """Run one short trial on Ray and average where its time went per step (and per eval)."""
    cfg = load_trial(trial_yaml, overrides)
    shutil.rmtree(out, ignore_errors=True)  # a fresh run, not a resumed one
    start = time.perf_counter()
    run_trial(cfg, out)
    wall = time.perf_counter() - start
    steps, records = TrialDir(out).steps(), TrialDir(out).records()
    split = {key.removeprefix("time/"): sum(s[key] for s in steps) / len(steps)
             for key in steps[0] if key.startswith("time/")}
    split["eval_s_per_eval"] = sum(r["time/eval_s"] for r in records) / len(records)
    return {"engine": rollout_engine(cfg), "steps": len(steps), "evals": len(records), "wall_s": wall,
            "per_step_s": split, "overrides": overrides}


def main(out: str = "bench/results.json", engines: list[str] | None = None, sizes: list[str] | None = None,
         repeats: int = 3) -> dict:
    engines = engines or (["vllm", "hf"] if vllm_available() else ["hf"])
    sizes = sizes or list(FAMILY)
    started = time.perf_counter()
    versus = side_by_side(sizes, repeats=repeats)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).with_name("side_by_side.md").write_text(side_by_side_table(versus) + "\n")
    print(side_by_side_table(versus), flush=True)
    results = {
        "host": {"machine": host.machine(), "cpus": torch.get_num_threads(), "torch": torch.__version__},
        "side_by_side": versus,
        "engines": engine_table(engines, sizes),
        "trial": {name: trial_split("sweeps/trials/easy.yaml",
                                    ["budget=2560", f"rollout.engine={name}", "eval.every=10"],
                                    Path(out).parent / f"trial-{name}")
                  for name in engines},
        "bench_wall_s": time.perf_counter() - started,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(results, indent=2))
    print(f"[bench] wrote {out}")
    return results
