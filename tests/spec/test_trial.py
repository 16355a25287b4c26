"""Trial configs: every file in sweeps/trials loads; bad input stops with file, key and what is allowed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from isosweep.models.tokenizer import char_tokenizer
from isosweep.rollout import vllm_available
from isosweep.spec.grid import id_dump
from isosweep.spec.trial import (
    engine_choice,
    entropy_coef,
    kl_coef,
    launcher_choice,
    learning_rate,
    load_trial,
    resolve_prompt_format,
    resources_of,
    steps,
    warmup_fraction,
    warmup_steps,
    width_scaled,
)
from isosweep.spec.yamlio import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TRIALS = sorted((ROOT / "sweeps" / "trials").glob("*.yaml"))


@pytest.mark.parametrize("path", TRIALS, ids=[p.name for p in TRIALS])
def test_every_trial_file_loads(path):
    cfg = load_trial(path)
    assert steps(cfg) >= 1


def test_there_are_easy_and_hard_trials():
    names = {p.name for p in TRIALS}
    assert {"easy.yaml", "hard.yaml"} <= names
    assert load_trial(ROOT / "sweeps/trials/easy.yaml").task.difficulty == "easy"
    assert load_trial(ROOT / "sweeps/trials/hard.yaml").task.difficulty == "hard"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "trial.yaml"
    path.write_text(text)
    return path


def error_of(path, overrides=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_trial(path, overrides)
    return str(info.value)


def test_overrides_set_nested_keys(tmp_path):
    path = write(tmp_path, "budget: 1000\n")
    cfg = load_trial(path, ["budget=20000", "Bp=32", "n=4", "algorithm.kl_coef=0.0", "task.levels=[2, 3]"])
    assert (cfg.budget, cfg.Bp, cfg.n) == (20000, 32, 4)
    assert cfg.algorithm.kl_coef == 0.0
    assert cfg.task.levels == (2, 3)


def test_derived_values_follow_the_recipe(tmp_path):
    easy = load_trial(write(tmp_path, "budget: 20000\nBp: 16\nn: 8\n"))
    assert steps(easy) == 20000 // 128
    assert math.isclose(learning_rate(easy), easy.algorithm.lr_ref)  # B == batch_ref
    quad = easy.model_copy(update={"Bp": 64})
    assert math.isclose(learning_rate(quad), 2 * easy.algorithm.lr_ref)  # 4x batch -> 2x lr
    assert kl_coef(easy) > 0 and entropy_coef(easy) > 0
    hard = load_trial(write(tmp_path, "budget: 20000\ntask: {difficulty: hard}\n"))
    assert kl_coef(hard) == 0 and entropy_coef(hard) == 0
    hard_with_kl = load_trial(write(tmp_path, "budget: 20000\ntask: {difficulty: hard}\nalgorithm: {kl_coef: 0.01}\n"))
    assert kl_coef(hard_with_kl) == 0.01


def test_width_ref_scales_the_learning_rate_by_width_and_needs_a_tiny_size(tmp_path):
    path = write(tmp_path, "budget: 20000\nmodel: {name: tiny-w256}\n")
    plain = load_trial(path)
    assert math.isclose(learning_rate(plain), plain.algorithm.lr_ref)  # unset: no width scaling
    for size, factor in (("tiny-w64", 2.0), ("tiny-w128", 1.0), ("tiny-w256", 0.5)):
        cfg = load_trial(path, [f"model.name={size}", "algorithm.width_ref=128"])
        assert math.isclose(learning_rate(cfg), factor * cfg.algorithm.lr_ref)
    (tmp_path / "model").mkdir()
    with pytest.raises(ConfigError, match="width_ref.*not one; allowed: a tiny size"):
        load_trial(path, [f"model.name={tmp_path / 'model'}", "algorithm.width_ref=128"])


def test_the_warm_up_ramps_linearly_over_its_fraction_of_the_steps_and_none_is_the_full_rate(tmp_path):
    path = write(tmp_path, "budget: 12800\nBp: 16\nn: 8\n")  # 100 steps
    assert [warmup_fraction(load_trial(path), s) for s in (0, 1, 99)] == [1.0, 1.0, 1.0]  # default: none
    for fraction, warm in ((0.1, 10), (0.25, 25), (0.005, 1), (0.333, 34)):
        cfg = load_trial(path, [f"algorithm.lr_warmup={fraction}"])
        assert warmup_steps(cfg) == warm
        ramp = [warmup_fraction(cfg, s) for s in range(steps(cfg))]
        assert ramp == [min(1.0, (s + 1) / warm) for s in range(100)]  # step s (from 0) takes (s + 1) / W
        assert ramp[warm - 1] == 1.0 and (warm == 1 or ramp[warm - 2] < 1.0)
        assert all(a <= b for a, b in zip(ramp, ramp[1:]))
    with pytest.raises(ConfigError, match="lr_warmup"):
        load_trial(path, ["algorithm.lr_warmup=1"])


def test_hidden_width_scaling_takes_the_block_matrices_only(tmp_path):
    cfg = load_trial(write(tmp_path, "budget: 20000\nmodel: {name: tiny-w64}\n"),
                     ["algorithm.width_ref=128", "algorithm.width_scaling=hidden"])
    assert math.isclose(learning_rate(cfg), 2 * cfg.algorithm.lr_ref)  # the block matrices' rate
    assert width_scaled(cfg, "model.layers.0.mlp.up_proj.weight", 2)
    assert width_scaled(cfg, "model.layers.3.self_attn.q_proj.weight", 2)
    assert not width_scaled(cfg, "model.embed_tokens.weight", 2)  # tied to the output head
    assert not width_scaled(cfg, "lm_head.weight", 2)
    assert not width_scaled(cfg, "model.layers.0.self_attn.q_proj.bias", 1)
    assert not width_scaled(cfg, "model.norm.weight", 1)
    every = cfg.model_copy(update={"algorithm": cfg.algorithm.model_copy(update={"width_scaling": "all"})})
    assert width_scaled(every, "model.embed_tokens.weight", 2) and width_scaled(every, "model.norm.weight", 1)


def test_config_is_frozen(tmp_path):
    cfg = load_trial(write(tmp_path, "budget: 1000\n"))
    with pytest.raises(Exception):
        cfg.budget = 5


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        ("budget: 1000\nbudgte: 3\n", None, ["key 'budgte'", "unknown key", "budget"]),
        ("budget: 1000\nalgorithm: {lr: 1.0e-3}\n", None, ["key 'algorithm.lr'", "unknown key", "lr_ref"]),
        ("budget: 1000\n", ["rollout.temprature=0.5"], ["key 'rollout.temprature'", "temperature", "--set"]),
        ("budget: 1000\ntask: {name: sudoku}\n", None, ["key 'task.name'", "unknown task 'sudoku'", "arithmetic"]),
        ("budget: 1000\nmodel: {name: tiny-2m}\n", None, ["key 'model.name'", "tiny-1m"]),
        ("budget: 1000\ntask: {levels: [9]}\n", None, ["key 'task'", "levels [9]", "allowed"]),
        ("budget: 100\nBp: 16\nn: 8\n", None, ["budget C = 100", "smaller than one step", "Bp * n = 16 * 8 = 128"]),
        ("budget: 1000\nBp: 0\n", None, ["key 'Bp'", "greater than 0", "got 0"]),
        ("budget: -5\n", None, ["key 'budget'", "greater than 0", "got -5"]),
        ("budget: 1000\nrollout: {temperature: 0}\n", None, ["key 'rollout.temperature'", "greater than 0"]),
        ("budget: 1000\nalgorithm: {kl_coef: -1}\n", None, ["key 'algorithm.kl_coef'", "greater than or equal to 0"]),
        ("budget: 1000\neval: {samples: 2, k: 4}\n", None, ["key 'eval'", "k <= samples"]),
        ("budget: 1000\nrollout: {engine: trt}\n", None, ["key 'rollout.engine'", "'hf'"]),
        ("budget: 1000\ntrainer: {launcher: slurm}\n", None, ["key 'trainer.launcher'", "'in_process'"]),
        ("budget: 1024\ntrainer: {launcher: in_process, num_workers: 2}\n", None,
         ["trainer.launcher 'in_process' runs one trainer worker", "num_workers is 2", "allowed"]),
        ("Bp: 16\n", None, ["key 'budget'", "Field required"]),
    ],
)
def test_bad_input_names_file_key_and_allowed(tmp_path, text, overrides, expected):
    path = write(tmp_path, text)
    message = error_of(path, overrides)
    assert str(path) in message
    for fragment in expected:
        assert fragment in message, (fragment, message)


def test_unreadable_files(tmp_path):
    assert "no such file" in error_of(tmp_path / "missing.yaml")
    assert "not valid YAML" in error_of(write(tmp_path, "budget: [1\n"))
    assert "mapping" in error_of(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="expected key=value"):
        load_trial(write(tmp_path, "budget: 1000\n"), ["budget"])


def test_jsonl_task_is_accepted_by_path(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "2+2?", "answer": "#### 4"}\n')
    cfg = load_trial(write(tmp_path, f"budget: 1000\ntask: {{name: '{data}', levels: [0]}}\nmodel: {{name: {tmp_path}}}\n"))
    assert cfg.task.name == str(data)


def test_auto_engine_is_in_process_for_tiny_models_on_cpu_and_configured_engines_win():
    easy = ROOT / "sweeps" / "trials" / "easy.yaml"
    cfg = load_trial(easy, ["budget=1000"])
    assert cfg.rollout.engine == "auto"
    engine, why = engine_choice(cfg)
    assert engine == "hf" and why.startswith("auto")
    assert resources_of(cfg) == {"CPU": pytest.approx(1.0), "GPU": 0.0}  # no actor: two trials fit 2 cores
    pinned = load_trial(easy, ["budget=1000", "rollout.engine=vllm"])
    assert engine_choice(pinned) == ("vllm", "configured")
    assert resources_of(pinned)["CPU"] == pytest.approx(1.9)
    real = load_trial(easy, ["budget=1000", f"model.name={ROOT}"])  # an existing path stands for a real model
    assert engine_choice(real)[0] == ("vllm" if vllm_available() else "hf")
    with pytest.raises(ConfigError, match="rollout.engine"):
        load_trial(easy, ["budget=1000", "rollout.engine=sglang"])


def test_auto_launcher_runs_one_cpu_worker_in_process_and_several_or_gpus_as_a_ray_train_job():
    easy = ROOT / "sweeps" / "trials" / "easy.yaml"
    one = load_trial(easy, ["budget=1000"])
    assert one.trainer.launcher == "auto"
    launcher, why = launcher_choice(one)
    assert launcher == "in_process" and why.startswith("auto")
    assert launcher_choice(load_trial(easy, ["budget=1000", "trainer.num_workers=2"]))[0] == "ray_train"
    assert launcher_choice(load_trial(easy, ["budget=1000", "profile=h200-node"]))[0] == "ray_train"
    assert launcher_choice(load_trial(easy, ["budget=1000", "trainer.launcher=ray_train"])) == ("ray_train", "configured")
    # how a trial is launched is not part of what it computes: the sweep id and the method ignore it
    assert id_dump(one) == id_dump(load_trial(easy, ["budget=1000", "trainer.launcher=ray_train"]))
    assert "launcher" not in id_dump(one)["trainer"]


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_prompt_format_auto_is_chat_exactly_when_the_tokenizer_has_a_template():
    plain = char_tokenizer()  # the tiny family's: no template
    templated = char_tokenizer()
    templated.chat_template = CHAT_TEMPLATE
    assert resolve_prompt_format(plain, "auto") == ("raw", "auto: the tokenizer has no chat template")
    assert resolve_prompt_format(templated, "auto") == ("chat", "auto: the tokenizer has a chat template")
    assert resolve_prompt_format(templated, "raw") == ("raw", "configured")
    assert resolve_prompt_format(templated, "chat") == ("chat", "configured")
    assert resolve_prompt_format(plain, "raw") == ("raw", "configured")
    with pytest.raises(ConfigError, match="task.prompt_format: 'chat' needs a tokenizer with a chat template.*"
                                          "allowed: raw, or auto"):
        resolve_prompt_format(plain, "chat")
    with pytest.raises(ConfigError, match="allowed: auto, raw, chat"):
        resolve_prompt_format(templated, "chatml")


def test_tiny_models_stay_raw():
    easy = ROOT / "sweeps" / "trials" / "easy.yaml"
    assert load_trial(easy, ["budget=1000"]).task.prompt_format == "auto"  # resolves to raw: no template
    message = error_of(easy, ["budget=1000", "task.prompt_format=chat"])
    assert "task.prompt_format 'chat' needs a chat template" in message and "tiny-1m" in message


def test_an_unset_rollout_precision_is_the_profiles():
    """The GPU profiles were sized for FP8 rollouts (``vllm.precision: fp8``): a trial that does not set
    ``rollout.precision`` gets it (a default of bf16 had made the profile's choice dead), and a trial that sets it
    keeps its own; on a CPU profile unset is bf16, and a sweep's id does not change (its trials resume)."""
    from isosweep.spec.grid import id_dump
    from isosweep.spec.profiles import get_profile, vllm_engine_args
    from isosweep.spec.trial import TrialConfig, rollout_precision

    gpu = TrialConfig(budget=1024, profile="h200-node")
    assert gpu.rollout.precision is None and rollout_precision(gpu) == "fp8"
    assert vllm_engine_args(get_profile("h200-node"), rollout_precision(gpu))["quantization"] == "fp8_per_channel"
    chosen = TrialConfig(budget=1024, profile="h200-node", rollout={"precision": "bf16"})
    assert rollout_precision(chosen) == "bf16"
    assert "quantization" not in vllm_engine_args(get_profile("h200-node"), rollout_precision(chosen))
    cpu = TrialConfig(budget=1024)
    assert rollout_precision(cpu) == "bf16"
    assert id_dump(cpu) == id_dump(TrialConfig(budget=1024, rollout={"precision": "bf16"}))
