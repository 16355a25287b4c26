"""What several trainer workers must agree on, run on two real gloo ranks (two processes): a decision made once and
broadcast (a failure included, with no rank left waiting), and a step's rollouts sampled in one call by rank 0 from
the shared engine and handed out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

WORKER = r"""
import json, sys
import torch, torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer
from isosweep.rollout.hf import HFEngine
from isosweep.tasks import Problem
from isosweep.trial.loop import Worker, decide_once, sample

rank, store, model_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", store=dist.FileStore(store, 2), rank=rank, world_size=2)
out = {"decided": decide_once(lambda: f"rank {rank}'s problem set", rank, 2)}


def fails():
    raise ValueError("no problem of the band")


try:
    decide_once(fails, rank, 2)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"


class Counted(HFEngine):
    calls, last = [], None

    def generate(self, prompts, n, seed, temperature=None):
        if rank != 0:
            raise AssertionError("only rank 0 samples from a shared engine")
        self.calls.append(len(prompts))
        Counted.last = super().generate(prompts, n, seed, temperature)
        return Counted.last


engine = Counted(AutoModelForCausalLM.from_pretrained(model_path), AutoTokenizer.from_pretrained(model_path), 6, 1.0)
problems = [Problem(f"{a}+{a}=", str(2 * a), "arithmetic", 2) for a in range(10, 18)]
mine = sample(engine, problems, 3, seed=5, worker=Worker(rank, 2, torch.device("cpu"), shared_engine=True))
out["texts"] = mine.texts
out["prompts"] = [p for p in mine.prompt_ids]
if rank == 0:
    out["calls"] = engine.calls
    out["shares"] = [Counted.last.select(range(r, 8, 2), 3).texts for r in range(2)]
print("RESULT " + json.dumps(out), flush=True)
dist.barrier()  # neither rank leaves while the other still talks to it: gloo aborts a process torn down mid-call
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_ranks_agree_on_decisions_failures_and_the_steps_rollouts(base_model, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(store), str(base_model)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    results = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail("a rank hung waiting for the other")
        assert proc.returncode == 0, stderr[-3000:]
        results.append(json.loads(next(line for line in stdout.splitlines() if line.startswith("RESULT "))[7:]))
    zero, one = results
    assert zero["decided"] == one["decided"] == "rank 0's problem set"
    assert zero["error"] == "ValueError: no problem of the band"
    assert one["error"] == "RuntimeError: rank 0 failed to decide: ValueError: no problem of the band"
    assert zero["calls"] == [8]  # the whole step in one call, not one call per rank
    assert [zero["texts"], one["texts"]] == zero["shares"]  # rank r gets the samples of problems r, r + 2, ...
    assert len(one["texts"]) == 4 * 3
