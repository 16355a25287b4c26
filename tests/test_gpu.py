"""GPU paths: NCCL, DeepSpeed bf16 / ZeRO-3 on CUDA, a GRPO trial on the GPU, vLLM FP8, multi-GPU sync.

Every test here is marked ``gpu`` and skips (with the reason) on a machine without CUDA; on a
GPU machine run them with ``pytest -m gpu tests/test_gpu.py`` (``make gpu-check`` does). Tests that also
need vLLM, DeepSpeed, Ray or several GPUs skip where those are missing ("<package> not installed"),
decided at collection: before the tiny base model they would train on is built.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (CUDA is not available here)"),
]

ROOT = Path(__file__).resolve().parents[1]
EASY = ROOT / "sweeps" / "trials" / "easy.yaml"


def needs(*packages: str) -> pytest.MarkDecorator:
    """Skip where one of ``packages`` is not installed (a mark, so that no fixture is built for a skipped test)."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed")


def test_nccl_process_group_reduces_on_the_gpu():
    import torch.distributed as dist

    from isosweep.trial.learner import init_distributed

    rank, world = init_distributed("nccl")
    assert dist.get_backend() == "nccl" and (rank, world) == (0, 1)
    x = torch.arange(4.0, device="cuda")
    dist.all_reduce(x)
    assert torch.equal(x.cpu(), torch.arange(4.0))


def test_step_statistics_and_micro_batch_widths_reduce_on_the_gpu():
    """Under NCCL a collective on a CPU tensor fails ("No backend type associated with device type cpu"): the
    trial's reductions put their tensors on the worker's device (a world of one reduces too, to show it here)."""
    from isosweep.trial.learner import init_distributed
    from isosweep.trial.loop import Worker, agreed_widths, mean_over_workers

    init_distributed("nccl")
    worker = Worker(rank=0, world=1, device=torch.device("cuda"), shared_engine=False)
    stats = {"train/loss": 0.5, "rollout/tokens": 12.0}
    assert mean_over_workers(stats, worker) == stats
    attention = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], device="cuda")
    assert agreed_widths(attention, [slice(0, 1), slice(1, 3)], worker) == [2, 3]


def test_fp8_roundtrip_is_the_same_on_gpu_and_cpu():
    from isosweep.rollout.fp8 import fp8_roundtrip

    w = torch.randn(512, 256, generator=torch.Generator().manual_seed(0))
    assert torch.equal(fp8_roundtrip(w.cuda()).cpu(), fp8_roundtrip(w))


@needs("deepspeed")
@pytest.mark.parametrize("stage", [1, 3])
def test_deepspeed_bf16_trainer_saves_and_restores_full_weights(base_model, tmp_path, stage):
    from transformers import AutoModelForCausalLM

    from isosweep.spec.trial import load_trial
    from isosweep.trial.learner import (
        gathered_state_dict,
        init_distributed,
        load_state,
        save_state,
    )
    from isosweep.trial.learner import make_learner as make_trainer

    init_distributed("nccl")
    cfg = load_trial(EASY, [f"trainer.zero_stage={stage}"])
    policy = AutoModelForCausalLM.from_pretrained(base_model)
    names = {k: v.shape for k, v in policy.state_dict().items()}
    trainer = make_trainer(policy, cfg, gpu=True)
    assert trainer.device.type == "cuda"
    weights = gathered_state_dict(trainer)
    assert {k: v.shape for k, v in weights.items()} == names  # ZeRO-3 partitions are gathered
    ids = torch.randint(2, 20, (4, 10), device=trainer.device)
    loss = trainer(input_ids=ids, labels=ids).loss
    trainer.backward(loss)
    trainer.step()
    stepped = gathered_state_dict(trainer)
    save_state(trainer, tmp_path)
    fresh = make_trainer(AutoModelForCausalLM.from_pretrained(base_model), cfg, gpu=True)
    load_state(fresh, tmp_path)
    restored = gathered_state_dict(fresh)
    assert all(torch.equal(restored[k].float(), stepped[k].float()) for k in stepped)
    assert any(not torch.equal(weights[k].float(), stepped[k].float()) for k in stepped)


@needs("deepspeed")
def test_grpo_trial_runs_on_the_gpu(base_model, tmp_path):
    from isosweep.spec.trial import load_trial
    from isosweep.trial.files import TrialDir
    from isosweep.trial.loop import train_loop

    cfg = load_trial(EASY, ["budget=1024", "Bp=16", "n=8", "eval.every=4", "task.eval_problems=64",
                            "rollout.engine=hf", "rollout.precision=fp8", "algorithm.correction=ais"])
    records = train_loop(cfg, tmp_path, log=print)
    steps = TrialDir(tmp_path).steps()
    assert [r["rollouts"] for r in records] == [0, 512, 1024]
    assert all(s["rollout/policy_version"] == s["step"] - 1 for s in steps)
    assert all(0 <= s["ais/alpha"] <= 1 and s["mismatch/logp_abs_diff_mean"] > 0 for s in steps)
    print("gpu trial:", {k: round(v, 4) for k, v in records[-1].items() if isinstance(v, float)})


@needs("vllm")
def test_vllm_fp8_engine_on_the_gpu(base_model):
    from isosweep.rollout.vllm import VLLMEngine

    engine = VLLMEngine(str(base_model), 8, 1.0, precision="fp8", gpu=True,
                        engine_kwargs={"gpu_memory_utilization": 0.2})
    rollouts = engine.generate(["12+34=", "56+7="], n=4, seed=0)
    assert len(rollouts.texts) == 8 and all(len(lp) == len(ids) for lp, ids in
                                             zip(rollouts.logprobs, rollouts.completion_ids))


SCORED = ["12+34=46", "56+7=63", "3+4=7", "90+11=101", "205+318=523"]
"""Sequences whose prompt log-probs the engine reports under its current weights."""
LOGP_ATOL = 0.02
"""bf16 tolerance on one log-prob; (a) asks the perturbation to move some log-prob by 5x as much."""


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="multi-GPU weight sync needs at least 2 GPUs")
@needs("vllm", "ray")
def test_multi_gpu_weight_sync(base_model, monkeypatch):
    """Weights broadcast over NCCL from the trainer's GPU 0 to a vLLM engine on GPU 1 serve the same
    log-probs as the same weights loaded through the /dev/shm path, and carry their version."""
    import ray
    from transformers import AutoModelForCausalLM

    from isosweep.rollout.pool import RolloutPool

    def score(engine, texts):
        """(Runs in the actor.) Log-prob of every token but the first of each text, flattened."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = [engine.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], params, use_tqdm=False)
        return [step[token].logprob for i, out in zip(ids, outputs)
                for step, token in zip(out.prompt_logprobs[1:], i[1:])]

    # This process is the trainer, on GPU 0. CUDA is initialised before Ray starts so that this
    # process keeps both GPUs while Ray, and the engine it places, see only the second one.
    torch.cuda.init()
    torch.cuda.set_device(0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") or ",".join(map(str, range(torch.cuda.device_count())))
    with monkeypatch.context() as env:
        env.setenv("CUDA_VISIBLE_DEVICES", visible.split(",")[1])
        ray.init(num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:
        pool = RolloutPool.spawn([f"nccl-sync-{os.getpid()}"], str(base_model), max_new_tokens=8, temperature=1.0,
                                 precision="bf16", seed=0, cpus=1, gpus=1, weight_sync="nccl")
        actor = pool.actors[0]
        before = torch.tensor(ray.get(actor.__ray_call__.remote(score, SCORED)))

        policy = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32).to("cuda:0")
        generator = torch.Generator(device="cuda:0").manual_seed(0)
        with torch.no_grad():
            for param in policy.parameters():  # the tied embedding once
                param.add_(0.1 * param.std() * torch.randn(param.shape, generator=generator, device="cuda:0"))
        state = policy.state_dict()  # fp32 on GPU 0: the sender casts to bf16 there
        pool.update_weights(state, version=3)
        synced = torch.tensor(ray.get(actor.__ray_call__.remote(score, SCORED)))
        assert pool.policy_version == 3
        assert pool.generate(["12+34="], n=2, seed=0).policy_version == 3

        ray.get(actor.update_weights.remote({name: t.cpu() for name, t in state.items()}, 4))  # the /dev/shm path
        loaded = torch.tensor(ray.get(actor.__ray_call__.remote(score, SCORED)))
        assert ray.get(actor.generate.remote(["12+34="], 1, 0)).policy_version == 4

        assert (synced - before).abs().max() > 5 * LOGP_ATOL  # (a) the broadcast reached the engine
        assert torch.allclose(synced, loaded, atol=LOGP_ATOL)  # (b) and loaded what /dev/shm loads
        pool.sender.close()
    finally:
        ray.shutdown()
