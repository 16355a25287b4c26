"""``make gpu-check`` (``isosweep.experiments.gpu_check``) on a CPU: everything of it that needs no CUDA.

The script itself without a GPU (it says so and exits 0) and without torch (it fails and says so); installing a
missing package from a folder of wheels; the one-GPU profile it adds; the plain-torch learner against DeepSpeed's
engine and a micro-batched step against a whole-batch one; trainer settings and the 25 % memory rule; the id
tokenizer; the rollout check on vLLM's CPU build. Tiny Qwen2 models, no downloads.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config

from isosweep.experiments import gpu_check
from isosweep.run.memory import TrainerMemory
from isosweep.spec.profiles import deepspeed_overrides, load_profiles, vllm_engine_args
from isosweep.trial.learner import gathered_state_dict
from isosweep.trial.step import policy_update

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
SIZES = gpu_check.Sizes(batch=4, micro_batch=2, seq_len=32, prompt_len=8, steps=2, prompts=4, samples=2,
                        new_tokens=16)


def tiny_config() -> Qwen2Config:
    """A Qwen2 of 2 layers, width 64, head_dim 32 (vLLM's CPU attention needs 32 or more), vocabulary 512."""
    return Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
                       max_position_embeddings=512)


def lines(capsys) -> list[str]:
    return capsys.readouterr().out.splitlines()


# ---------------------------------------------------------------------------------------------
# the script


def test_without_a_gpu_it_says_so_and_exits_0():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT / "platform")}
    done = subprocess.run([sys.executable, "-m", "isosweep.experiments.gpu_check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("no NVIDIA GPU here") and "torch.cuda.is_available() is False" in done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_gpu_check_needs_no_venv_and_exits_0_without_a_gpu():
    done = subprocess.run(["make", "--no-print-directory", "gpu-check", f"PYTHON={sys.executable}"], cwd=ROOT,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no NVIDIA GPU here" in done.stdout and "pip install" not in done.stdout  # no venv was made


def test_without_torch_it_fails_and_says_so_where_there_is_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "installed", lambda module: module != "torch")
    monkeypatch.setattr(shutil, "which", lambda command: f"/usr/bin/{command}")
    assert gpu_check.main([]) == 1
    assert lines(capsys) == ["FAIL: torch not installed: install the CUDA torch this machine's driver supports"]


def test_without_torch_or_a_gpu_there_is_nothing_to_check(monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "installed", lambda module: module != "torch")
    monkeypatch.setattr(shutil, "which", lambda command: None)
    assert gpu_check.main([]) == 0
    assert lines(capsys)[0].startswith("no NVIDIA GPU here (no nvidia-smi, and torch is not installed)")


def test_the_gpu_tests_run_through_pytest_and_their_skips_are_relayed():
    report, out = gpu_check.Report(), []
    report.write = out.append
    gpu_check.run_gpu_tests(report)
    assert report.counts == {"ok": 1}, out
    assert out[0].startswith("ok: pytest tests/test_gpu.py: ") and "skipped" in out[0]
    skipped = [line for line in out[1:] if "SKIPPED" in line]
    assert skipped and all(line.startswith("    SKIPPED") for line in skipped)


# ---------------------------------------------------------------------------------------------
# packages from a folder of wheels


def make_wheel(folder: Path, name: str, version: str = "1.0") -> Path:
    """A pure-Python wheel of one module ``name`` that sets ``VALUE = 42``."""
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "VALUE = 42\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}

    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={digest(text)},{len(text.encode())}\n" for path, text in files.items())
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for file, text in {**files, f"{info}/RECORD": record + f"{info}/RECORD,,\n"}.items():
            wheel.writestr(file, text)
    return path


@pytest.fixture
def isolated_path(monkeypatch):
    """``sys.path`` and ``PYTHONPATH`` restored after the test (``provide`` adds its folder to both)."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))


def test_a_missing_package_is_installed_from_the_wheel_folder(tmp_path, isolated_path):
    name = "isosweep_gpucheck_probe"
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    make_wheel(wheels, name)
    assert not gpu_check.installed(name)
    assert gpu_check.provide({name: name}, wheels, site) is None
    assert (site / name / "__init__.py").exists() and str(site) in sys.path
    assert str(site) in os.environ["PYTHONPATH"].split(os.pathsep)  # for the child processes
    module = __import__(name)
    assert module.VALUE == 42
    sys.modules.pop(name)
    # present now: nothing is installed again, even without the folder
    assert gpu_check.provide({name: name}, tmp_path / "gone", site) is None


def test_a_folder_of_the_same_name_is_not_an_installed_package(tmp_path, monkeypatch):
    (tmp_path / "isosweep_gpucheck_folder").mkdir()  # as /tmp/ray is, for a script run from /tmp
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not gpu_check.installed("isosweep_gpucheck_folder")
    assert gpu_check.installed("json") and gpu_check.installed("torch")


def test_what_is_installed_needs_no_wheels(tmp_path):
    assert gpu_check.provide({"json": "json"}, tmp_path / "no-such-folder", tmp_path / "site") is None
    assert not (tmp_path / "site").exists()


def test_a_missing_package_without_its_wheel_is_reported(tmp_path, isolated_path):
    missing = {"isosweep_gpucheck_absent": "isosweep-gpucheck-absent"}
    problem = gpu_check.provide(missing, tmp_path / "no-such-folder", tmp_path / "site")
    assert "isosweep-gpucheck-absent not installed and no wheel folder" in problem and "make gpu-wheels" in problem
    make_wheel(tmp_path / "wheels", "isosweep_gpucheck_other")
    problem = gpu_check.provide(missing, tmp_path / "wheels", tmp_path / "site")
    assert problem.startswith("pip could not install isosweep-gpucheck-absent from ")


def test_the_needed_modules_are_what_isosweep_imports_beyond_torch():
    """What the check provides from wheels covers the non-stdlib imports of the modules it uses, less torch,
    transformers and their own dependencies (a bare GPU machine has those)."""
    code = ("import sys; import isosweep.trial.step, isosweep.run.memory, isosweep.rollout.vllm, isosweep.trial.loop, "
            "isosweep.experiments.gpu_check; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "platform")})
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(done.stdout.split())
    for module in gpu_check.NEEDED:
        assert module in loaded, f"{module} is provided from wheels but nothing imports it"
    # heavy parts stay out until a part that needs them runs
    assert not loaded & {"ray", "mlflow", "deepspeed", "vllm"}, loaded & {"ray", "mlflow", "deepspeed", "vllm"}


# ---------------------------------------------------------------------------------------------
# the one-GPU profile


def test_the_check_profile_keeps_the_trial_zero_stage_in_bf16(tmp_path):
    profiles = load_profiles(gpu_check.profiles_file(tmp_path))
    assert {"cpu-tiny", "h200-node", gpu_check.PROFILE} <= set(profiles)
    profile = profiles[gpu_check.PROFILE]
    for stage in (0, 1):
        assert deepspeed_overrides(profile, stage) == {"zero_optimization": {"stage": stage}, "bf16": {"enabled": True}}
    assert vllm_engine_args(profile, "fp8") == {"tensor_parallel_size": 1, "quantization": "fp8_per_channel",
                                                "gpu_memory_utilization": 0.3}
    assert "quantization" not in vllm_engine_args(profile, "bf16")


# ---------------------------------------------------------------------------------------------
# the plain-torch learner


def trained(setting: gpu_check.Setting, sizes: gpu_check.Sizes) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Weights and losses after ``sizes.steps`` steps of ``setting`` on the tiny model (fp32, CPU)."""
    trainer = gpu_check.make_trainer(setting, sizes, tiny_config(), CPU, profile="cpu-tiny")
    losses = []
    for step in range(sizes.steps):
        batch, advantages = gpu_check.random_batch(sizes, 512, CPU, seed=step)
        losses.append(policy_update(trainer.learner, trainer.reference, batch, advantages, trainer.cfg).loss)
    weights = gathered_state_dict(trainer.learner)
    gpu_check.release(trainer)
    return weights, losses


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Equal up to float rounding: Adam's first steps move every weight by about the learning rate (2e-3) whatever
    its gradient's size, so a rounding difference in a near-zero gradient shows as up to ~1e-3 of that move."""
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_micro_batched_step_equals_the_whole_batch_step():
    plain = gpu_check.Setting("plain", 0, False)
    whole, whole_losses = trained(plain, dataclasses.replace(SIZES, micro_batch=SIZES.batch))
    micro, micro_losses = trained(plain, SIZES)
    assert_same(micro, whole)
    assert micro_losses == pytest.approx(whole_losses, rel=1e-5)
    initial = gpu_check.random_policy(tiny_config(), CPU).state_dict()
    assert any(not torch.equal(initial[name], micro[name]) for name in initial)


@pytest.mark.parametrize("stage", [0, 1])
def test_the_plain_learner_steps_as_deepspeed_does(stage):
    pytest.importorskip("deepspeed")
    plain, plain_losses = trained(gpu_check.Setting("plain", 0, False), SIZES)
    engine, engine_losses = trained(gpu_check.Setting("deepspeed", stage, False), SIZES)
    assert_same(plain, engine)
    assert plain_losses == pytest.approx(engine_losses, rel=1e-5)


def test_the_plain_learner_keeps_an_fp32_master_copy_of_bf16_weights():
    cfg = gpu_check.trial_config(SIZES, 0, False, profile="cpu-tiny")
    learner = gpu_check.PlainLearner(gpu_check.random_policy(tiny_config(), CPU), cfg, 2, torch.bfloat16)
    assert {p.dtype for p in learner.module.parameters()} == {torch.bfloat16}
    assert {p.dtype for g in learner.optimizer.param_groups for p in g["params"]} == {torch.float32}
    assert not learner.is_gradient_accumulation_boundary()
    learner(input_ids=torch.ones(1, 4, dtype=torch.long)).logits.float().sum().backward()
    learner.step()  # first of two micro-batches: no optimizer step
    assert learner.get_global_grad_norm() is None and learner.is_gradient_accumulation_boundary()
    before = [p.detach().clone() for p in learner.module.parameters()]
    learner(input_ids=torch.ones(1, 4, dtype=torch.long)).logits.float().sum().backward()
    learner.step()
    assert learner.get_global_grad_norm() > 0
    assert all(p.grad is None for p in learner.module.parameters())
    assert any(not torch.equal(b, p) for b, p in zip(before, learner.module.parameters(), strict=True))
    for param, master in learner.pairs:
        assert torch.equal(param, master.to(torch.bfloat16))


# ---------------------------------------------------------------------------------------------
# trainer settings and the memory rule


def test_checkpointing_changes_no_step():
    off, off_losses = trained(gpu_check.Setting("plain", 0, False), SIZES)
    on, on_losses = trained(gpu_check.Setting("plain", 0, True), SIZES)
    assert_same(on, off)
    assert on_losses == pytest.approx(off_losses, rel=1e-5)


def test_a_trainer_setting_on_the_cpu_is_reported_without_a_peak(capsys):
    report = gpu_check.Report()
    setting = gpu_check.check_trainer(report, SIZES, tiny_config(), CPU, deepspeed=False, profile="cpu-tiny")
    out = lines(capsys)
    assert setting == gpu_check.Setting("plain", 0, False)
    assert report.counts == {"ok": 2}, out
    assert out[0].startswith("ok: trainer, plain-torch learner (no DeepSpeed), checkpointing off: 2 steps of "
                             "2 micro-batches x 2 x 32 tokens")
    assert "checkpointing on" in out[1] and all("(no CUDA: peak not measured)" in line for line in out)


def plan(tensors: int, overhead: int = 100) -> TrainerMemory:
    return TrainerMemory(weights=tensors, gradients=0, optimizer=0, activations=0, logits=0, logprob_chunk=0,
                         reference=0, overhead=overhead)


@pytest.mark.parametrize(("peak", "passes"), [(1000, True), (1250, True), (750, True), (1260, False), (740, False)])
def test_a_peak_passes_within_a_quarter_of_the_planned_tensors(peak, passes, capsys):
    result = gpu_check.SettingResult([0.1], [1.0], 2, True, 0.5, peak, plan(1000))
    report = gpu_check.Report()
    gpu_check.judge_setting(report, gpu_check.Setting("plain", 0, False), result, SIZES)
    assert report.counts == {"ok" if passes else "FAIL": 1}
    assert f"{peak / 1000 - 1:+.0%}" in lines(capsys)[0]


def test_a_setting_whose_weights_did_not_move_or_whose_numbers_are_not_finite_fails():
    report = gpu_check.Report(write=lambda line: None)
    setting = gpu_check.Setting("plain", 0, False)
    for losses, norms, moved in [([0.1], [1.0], False), ([float("nan")], [1.0], True), ([0.1], [float("inf")], True)]:
        result = gpu_check.SettingResult(losses, norms, 2, moved, 0.5, 1000, plan(1000))
        gpu_check.judge_setting(report, setting, result, SIZES)
    assert report.counts == {"FAIL": 3}


# ---------------------------------------------------------------------------------------------
# rollouts


def test_the_id_tokenizer_reads_the_random_prompts(tmp_path):
    tokenizer = gpu_check.id_tokenizer(512, 511, tmp_path)
    prompts = gpu_check.random_prompts(SIZES, 512, 511)
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    assert len(ids) == SIZES.prompts and all(len(row) == SIZES.prompt_len for row in ids)
    assert all(0 <= i < 511 for row in ids for i in row)
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 511
    assert tokenizer.batch_decode(ids) == prompts


@pytest.mark.slow
@pytest.mark.vllm
def test_every_part_after_the_gpu_tests_runs_on_the_cpu(tmp_path, capsys):
    """Parts 2 to 4 as ``main`` runs them on a GPU, on the tiny-1m architecture and a CPU profile: the trainer
    settings (DeepSpeed's where installed) and vLLM's CPU build in bf16 and FP8 (weights rounded through FP8 on a
    CPU): three reloads each, after which the engine's log-probs match the trainer's far better than the weights
    before the reloads did, FP8 less closely than bf16."""
    report = gpu_check.Report()
    gpu_check.run_parts(report, CPU, dataclasses.replace(SIZES, steps=3), model="tiny-1m", profile="cpu-tiny",
                        work=tmp_path)
    out = [line for line in lines(capsys) if line.startswith(("ok:", "FAIL:", "skipped:"))]
    assert report.counts["FAIL"] == 0, out
    assert out[0].startswith("ok: tiny-1m's architecture from isosweep.run.memory.model_config, random weights")
    trainer = [line for line in out if line.startswith("ok: trainer, ")]
    if gpu_check.installed("deepspeed"):
        assert [line.split(":")[1] for line in trainer] == [
            " trainer, DeepSpeed ZeRO-0, checkpointing off", " trainer, DeepSpeed ZeRO-0, checkpointing on",
            " trainer, DeepSpeed ZeRO-1, checkpointing off", " trainer, DeepSpeed ZeRO-1, checkpointing on"]
    else:
        assert "skipped: deepspeed not installed" in " ".join(out) and len(trainer) == 2
    if gpu_check.installed("vllm"):
        engines = [line for line in out if "vLLM" in line or "FP8" in line]
        assert len(engines) == 3 and all(line.startswith("ok: ") for line in engines), engines
        assert engines[0].startswith("ok: vLLM bf16: 3 weight reloads from the trainer") and "version 3" in engines[0]
        assert engines[1].startswith("ok: vLLM fp8: ") and engines[2].startswith("ok: FP8 rollouts differ more")
    else:
        assert out[-1].startswith("skipped: vllm not installed")
