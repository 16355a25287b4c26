"""``make bench``: isosweep against TRL and a plain PyTorch loop, rollout throughput of each
engine and tiny size, and where one trial's time goes.

Figures go to ``bench/results.json`` (and the side-by-side as a Markdown table to
``bench/side_by_side.md``); nothing here asserts a speed (the machines are noisy: compare
numbers within one run). The side-by-side is :mod:`isosweep.experiments.side_by_side`.
Throughput is measured on the task's prompts with ``n = 8`` samples per prompt at batches of
32, 128 and 512 rollouts, after one warm-up call; the trial split averages the per-step timings
a real trial logs (``time/*`` in ``steps.jsonl``), one trial per engine.

``sweep`` measures what a trial costs beyond its steps inside a real sweep (Ray already running, a
real MLflow server): a small grid run once one trial at a time, where the study's training wall time
less every trial's steps and later evaluations, divided by the trials, is the fixed cost per trial
(process start or reuse, imports, MLflow run, model, engine, learner, first evaluation, Tune's own
scheduling), and once packed as a sweep runs it, with how busy the cores were.
"""

from __future__ import annotations

import json
import os
import platform as host
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from isosweep.experiments.side_by_side import side_by_side
from isosweep.experiments.side_by_side import table as side_by_side_table
from isosweep.models.sizes import FAMILY
from isosweep.models.warmup import ensure_base_model
from isosweep.rollout.hf import HFEngine
from isosweep.rollout.vllm import VLLMEngine, vllm_available
from isosweep.spec.grid import load_sweep
from isosweep.spec.trial import load_trial, rollout_engine
from isosweep.tasks import get_task
from isosweep.trial.files import TrialDir
from isosweep.trial.job import ray_init, run_trial
from isosweep.trial.localhost import free_port

BATCHES = (32, 128, 512)
SAMPLES_PER_PROMPT = 8
MAX_NEW_TOKENS = 8


def make_bench_engine(name: str, model_path: Path, threads: int | None = None):
    """A rollout engine for benchmarking (``hf`` or ``vllm``, bf16 rollout weights)."""
    if name == "hf":
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        return HFEngine(model, AutoTokenizer.from_pretrained(model_path), MAX_NEW_TOKENS, 1.0, precision="bf16")
    return VLLMEngine(str(model_path), MAX_NEW_TOKENS, 1.0, precision="bf16")


@dataclass(frozen=True)
class Throughput:
    """One engine's speed at one batch: rollouts per call, the best call's seconds, rollouts/s and tokens/s."""

    batch: int
    seconds: float
    rollouts_per_s: float
    tokens_per_s: float

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "seconds": self.seconds, "rollouts_per_s": self.rollouts_per_s,
                "tokens_per_s": self.tokens_per_s}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Throughput:
        return cls(int(data["batch"]), data["seconds"], data["rollouts_per_s"], data["tokens_per_s"])


@dataclass(frozen=True)
class EngineRow:
    """A row of the engine table (``engines`` of ``bench/results.json``): an engine on a size, the seconds it took to
    start, and its throughput at one batch."""

    engine: str
    size: str
    startup_s: float
    throughput: Throughput

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "size": self.size, "startup_s": self.startup_s, **self.throughput.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EngineRow:
        return cls(data["engine"], data["size"], data["startup_s"], Throughput.from_json(data))


def throughput(engine, prompts: list[str], batch: int, repeats: int = 3) -> Throughput:
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
    return Throughput(batch, best, batch / best, tokens / best)


def engine_table(engines: list[str], sizes: list[str]) -> list[EngineRow]:
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
                row = EngineRow(name, size, startup, throughput(engine, prompts, batch))
                print(f"[bench] {name:5s} {size:9s} batch {batch:4d}: {row.throughput.rollouts_per_s:8.0f} rollouts/s "
                      f"{row.throughput.tokens_per_s:8.0f} tokens/s", flush=True)
                rows.append(row)
            del engine
    return rows


@dataclass(frozen=True)
class TrialSplit:
    """Where one short trial's time went (``trial.<engine>`` of ``bench/results.json``): its engine, steps,
    evaluations and wall seconds, the mean seconds per step of each ``time/*`` phase (``per_step_s``, keys without
    ``time/``; ``eval_s_per_eval``: per evaluation), and the trial's overrides."""

    engine: str
    steps: int
    evals: int
    wall_s: float
    per_step_s: dict[str, float]
    overrides: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"engine": self.engine, "steps": self.steps, "evals": self.evals, "wall_s": self.wall_s,
                "per_step_s": dict(self.per_step_s), "overrides": list(self.overrides)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialSplit:
        return cls(data["engine"], int(data["steps"]), int(data["evals"]), data["wall_s"], dict(data["per_step_s"]),
                   tuple(data["overrides"]))


def trial_split(trial_yaml: str, overrides: list[str], out: Path) -> TrialSplit:
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
    return TrialSplit(rollout_engine(cfg), len(steps), len(records), wall, split, tuple(overrides))


SWEEP_GRID = {"n": [4, 8], "Bp": [8, 16]}
"""The fixed-cost sweep: four short trials of the easy set (every trial evaluates at its start and its end)."""
SWEEP_BUDGET = 1024


@dataclass(frozen=True)
class SweepRun:
    """One run of the fixed-cost sweep: ``concurrency`` trials at a time (``"packed"``: as many as fit), its training
    wall seconds and the trials' stepping, the fixed cost per trial (one at a time only, else None), the share of
    the cores busy (None: unknown) and each trial's start-up split (key: trial; ``time/start_*`` without the prefix,
    and ``first_eval``), rounded to the millisecond."""

    concurrency: int | str
    trials: int
    training_wall_s: float
    stepping_s: float
    fixed_s_per_trial: float | None
    cores_busy: float | None
    start_s: dict[str, dict[str, float]]

    def to_json(self) -> dict[str, Any]:
        return {"concurrency": self.concurrency, "trials": self.trials, "training_wall_s": self.training_wall_s,
                "stepping_s": self.stepping_s, "fixed_s_per_trial": self.fixed_s_per_trial,
                "cores_busy": self.cores_busy, "start_s": {key: dict(split) for key, split in self.start_s.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepRun:
        return cls(data["concurrency"], int(data["trials"]), data["training_wall_s"], data["stepping_s"],
                   data["fixed_s_per_trial"], data["cores_busy"],
                   {key: dict(split) for key, split in data["start_s"].items()})


@dataclass(frozen=True)
class SweepPart:
    """The sweep part of ``bench/results.json``: the fixed-cost sweep's grid and budget, and its runs."""

    grid: dict[str, list[int]]
    budget: int
    runs: tuple[SweepRun, ...]

    def to_json(self) -> dict[str, Any]:
        return {"grid": {key: list(values) for key, values in self.grid.items()}, "budget": self.budget,
                "runs": [run.to_json() for run in self.runs]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepPart:
        return cls({key: list(values) for key, values in data["grid"].items()}, int(data["budget"]),
                   tuple(SweepRun.from_json(run) for run in data["runs"]))


def cpu_ticks() -> tuple[int, int]:
    """``(busy, total)`` jiffies of every core since boot, from ``/proc/stat`` (0, 0 where there is none)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except OSError:
        return 0, 0
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def fixed_cost_sweep_file(work: Path, concurrency: int | None, trial_yaml: str, repeat: int) -> Path:
    """The fixed-cost sweep's file in ``work``: a name of its own per ``concurrency`` and ``repeat`` (one MLflow
    parent run belongs to one runs folder, so a repeat under the same name would be refused)."""
    spec = {"name": f"bench-fixed-{concurrency or 'packed'}-r{repeat}", "study": "isocompute",
            "trial": str(Path(trial_yaml).resolve()), "budget": SWEEP_BUDGET, "grid": SWEEP_GRID, "seeds": [0],
            "set": {"eval.every": 1_000_000}, "frontier": {"bootstrap": 20}}
    path = work / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def sweep_fixed_cost(work: Path, concurrency: int | None, trial_yaml: str = "sweeps/trials/easy.yaml",
                     repeat: int = 0) -> SweepRun:
    """One run of the fixed-cost sweep (``concurrency`` trials at a time; None: as many as fit, as a sweep runs):
    the training wall time (from Tune's start to the last trial's end, read off the sweep's progress lines), the
    trials' stepping (steps and every evaluation after the first), the fixed cost per trial, each trial's
    ``time/start_*`` split, and the share of the cores busy meanwhile. Ray must be running (this process's)."""
    from isosweep.run.grid import run_sweep  # reason: Ray Tune and MLflow, for this part only

    sweep = load_sweep(fixed_cost_sweep_file(work, concurrency, trial_yaml, repeat))
    marks: dict[str, float] = {}
    busy: list[tuple[int, int]] = []

    def log(line: str) -> None:
        if " at a time (" in line:
            marks["start"] = time.perf_counter()
            busy.append(cpu_ticks())
        elif line.startswith("[sweep] trial ") and line.endswith(" finished"):
            marks["end"] = time.perf_counter()
            busy[1:] = [cpu_ticks()]

    run_sweep(sweep, runs_root=work / "runs", dashboards=None, log=log, progress_every_s=3600,
              concurrency=concurrency)
    trials = [TrialDir(work / "runs" / sweep.sweep_id / "trials" / p.key) for p in sweep.trials]
    stepping = sum(sum(s["time/step_s"] for s in t.steps()) + sum(r["time/eval_s"] for r in t.records()[1:])
                   for t in trials)
    wall = marks["end"] - marks["start"]
    (b0, t0), (b1, t1) = busy[0], busy[-1]
    return SweepRun(
        concurrency=concurrency or "packed", trials=len(trials), training_wall_s=wall, stepping_s=stepping,
        fixed_s_per_trial=(wall - stepping) / len(trials) if concurrency == 1 else None,
        cores_busy=(b1 - b0) / (t1 - t0) if t1 > t0 else None,
        start_s={p.key: {k.removeprefix("time/start_"): round(v, 3) for k, v in t.records()[0].items()
                         if k.startswith("time/start_")} | {"first_eval": round(t.records()[0]["time/eval_s"], 3)}
                 for p, t in zip(sweep.trials, trials)})


def sweep_part(repeats: int = 2) -> SweepPart:
    """The fixed-cost sweep, one trial at a time and packed, ``repeats`` times each, on a local Ray and an MLflow
    server of its own (started first: their start is not a trial's)."""
    from isosweep.track import server  # reason: MLflow, for this part only

    with tempfile.TemporaryDirectory(prefix="isosweep-bench-sweep-") as tmp:
        saved = {k: os.environ.get(k) for k in ("ISOSWEEP_MLFLOW_DIR", "ISOSWEEP_MLFLOW_PORT", "MLFLOW_TRACKING_URI")}
        os.environ.update(ISOSWEEP_MLFLOW_DIR=str(Path(tmp) / "mlflow"), ISOSWEEP_MLFLOW_PORT=str(free_port()))
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        started = ray_init(log_to_driver=False)
        try:
            server.ensure_server(log=lambda line: None)
            runs = []
            for r in range(repeats):
                for concurrency in (1, None):
                    work = Path(tmp) / f"r{r}-{concurrency or 'packed'}"
                    work.mkdir()
                    run = sweep_fixed_cost(work, concurrency, repeat=r)
                    runs.append(run)
                    print(f"[bench] sweep of {run.trials} trials, {run.concurrency} at a time: training "
                          f"{run.training_wall_s:.1f} s wall, {run.stepping_s:.1f} s of steps, cores busy "
                          f"{run.cores_busy:.0%}" + (f", fixed cost {run.fixed_s_per_trial:.1f} s per trial"
                                                     if run.fixed_s_per_trial is not None else ""), flush=True)
        finally:
            server.stop_server()
            if started:
                import ray

                ray.shutdown()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return SweepPart(SWEEP_GRID, SWEEP_BUDGET, tuple(runs))


PARTS = ("side_by_side", "engines", "trial", "sweep")


def main(out: str = "bench/results.json", engines: list[str] | None = None, sizes: list[str] | None = None,
         repeats: int = 3, parts: list[str] | None = None) -> None:
    """Run the ``parts`` of the benchmark (default: all) and write their figures to ``out``; a part not run keeps
    what an earlier run wrote there (so a long benchmark can be redone part by part). The file is merged as plain
    JSON, the parts run written by their ``to_json``."""
    engines = engines or (["vllm", "hf"] if vllm_available() else ["hf"])
    sizes = sizes or list(FAMILY)
    parts = parts or list(PARTS)
    started = time.perf_counter()
    path = Path(out)
    results = json.loads(path.read_text()) if path.exists() else {}  # the file boundary: the other parts as read
    results["host"] = {"machine": host.machine(), "cpus": torch.get_num_threads(), "torch": torch.__version__}
    if "side_by_side" in parts:
        versus = side_by_side(sizes, repeats=repeats)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_name("side_by_side.md").write_text(side_by_side_table(versus) + "\n")
        print(side_by_side_table(versus), flush=True)
        results["side_by_side"] = {size: row.to_json() for size, row in versus.items()}
    if "engines" in parts:
        results["engines"] = [row.to_json() for row in engine_table(engines, sizes)]
    if "trial" in parts:
        results["trial"] = {name: trial_split("sweeps/trials/easy.yaml",
                                              ["budget=2560", f"rollout.engine={name}", "eval.every=10"],
                                              path.parent / f"trial-{name}").to_json()
                            for name in engines}
    if "sweep" in parts:
        results["sweep"] = sweep_part().to_json()
    results["bench_wall_s"] = {**(results.get("bench_wall_s") if isinstance(results.get("bench_wall_s"), dict)
                                  else {}), "+".join(parts): time.perf_counter() - started}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print(f"[bench] wrote {out}")
