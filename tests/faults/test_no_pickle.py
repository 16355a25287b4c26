"""Nothing executes code from a file it reads back.

Each place isosweep reads its own state back gets a planted pickle whose loading would create a
marker file (``__reduce__`` -> ``Path.touch``); the read must fail with an error naming the file,
and the marker must never appear. Places: the HPO searcher's state, the study's ``search.json``
(and a leftover ``search.pkl`` of an older version), a trial checkpoint's ``trainer_state.json``,
its DeepSpeed optimizer state and its model weights.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from isosweep.hpo.searcher import JFHPOSearcher, read_json_state
from isosweep.hpo.space import Param, SearchSpace


class Planted:
    """Unpickling this touches ``marker``: the proof that a file's code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def plant(path: Path, marker: Path, *, torch_format: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"state": Planted(marker)}
    if torch_format:
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload))
    assert not marker.exists()


def space() -> SearchSpace:
    return SearchSpace(params=(Param("lr", 1e-5, 1e-3, log=True),), sizes={"a": 10, "b": 100},
                       budget_min=100, budget_max=1000, budget_step=100)


def test_a_searcher_state_roundtrips_as_json_and_a_pickle_is_refused(tmp_path):
    searcher = JFHPOSearcher(space(), "score", "max", n_init=2, seed=3)
    for i in range(3):
        config = searcher.suggest(f"t{i}")
        searcher.on_trial_complete(f"t{i}", {"score": config["lr"] * 1e3, "time_total_s": 1.0 + i})
    searcher.suggest("live")
    path = tmp_path / "state.json"
    searcher.save(str(path))
    state = read_json_state(path)  # plain JSON: observations, the live trial, the RNG state, the space
    assert [o["trial_id"] for o in state["observations"]] == ["t0", "t1", "t2"] and "live" in state["_live"]

    marker = tmp_path / "ran"
    plant(path, marker)
    with pytest.raises(ValueError, match="state.json is not a JSON search state"):
        JFHPOSearcher(space(), "score", "max").restore(str(path))
    assert not marker.exists()


def test_a_study_state_that_is_a_pickle_is_refused(tmp_path):
    from isosweep.run.hpo import STATE_FILE, StudySearch, make_searcher
    from isosweep.spec.hpo import load_hpo

    study = load_hpo(Path(__file__).parents[2] / "sweeps" / "hpo-smoke.yaml")
    search = StudySearch(study, make_searcher(study), tmp_path, "http://127.0.0.1:1", "parent", log=lambda line: None)
    marker = tmp_path / "ran"
    plant(tmp_path / STATE_FILE, marker)
    with pytest.raises(ValueError, match="search.json is not a JSON search state"):
        search.restore(str(tmp_path / STATE_FILE))
    assert not marker.exists()


def test_a_trial_checkpoint_state_that_is_a_pickle_is_refused(tmp_path):
    from isosweep.trial.files import STATE_FILE, TrialDir

    folder = tmp_path / "checkpoints" / "step-000004"
    marker = tmp_path / "ran"
    plant(folder / STATE_FILE, marker, torch_format=True)
    with pytest.raises(ValueError):
        TrialDir.checkpoint_record(folder)
    assert not marker.exists()


def test_deepspeed_optimizer_state_loads_weights_only_and_a_pickle_in_it_never_runs(tmp_path):
    """A real ZeRO checkpoint loads back (weights-only, DeepSpeed's data classes allowed); the same
    file replaced by a planted pickle fails to load and runs nothing."""
    from isosweep.spec.trial import load_trial
    from isosweep.trial.learner import init_distributed, load_state, make_learner, save_state

    init_distributed("gloo")
    cfg = load_trial(Path(__file__).parents[2] / "sweeps" / "trials" / "easy.yaml")
    torch.manual_seed(0)
    engine = make_learner(torch.nn.Linear(4, 4), cfg, gpu=False)
    engine.backward(engine(torch.randn(1, 4)).sum())
    engine.step()
    save_state(engine, tmp_path / "deepspeed")
    trained = {k: v.clone() for k, v in engine.module.state_dict().items()}

    fresh = make_learner(torch.nn.Linear(4, 4), cfg, gpu=False)
    load_state(fresh, tmp_path / "deepspeed")
    for name, value in fresh.module.state_dict().items():
        assert torch.equal(value, trained[name])

    optim = next((tmp_path / "deepspeed" / "state").glob("*optim_states.pt"))
    marker = tmp_path / "ran"
    plant(optim, marker, torch_format=True)
    with pytest.raises(pickle.UnpicklingError):
        load_state(make_learner(torch.nn.Linear(4, 4), cfg, gpu=False), tmp_path / "deepspeed")
    assert not marker.exists()


def test_model_weights_load_from_safetensors_only(tmp_path):
    """A checkpoint folder whose weights are a pickled ``pytorch_model.bin`` is not loaded."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from isosweep.trial.loop import load_policy

    folder = tmp_path / "model"
    Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
                num_key_value_heads=1).save_pretrained(folder)
    marker = tmp_path / "ran"
    plant(folder / "pytorch_model.bin", marker, torch_format=True)
    with pytest.raises(OSError):
        load_policy(folder)
    assert not marker.exists()
    assert AutoModelForCausalLM  # the loader is transformers' own
