"""The rollout interface's wrapper: a templated engine formats every prompt once, and forwards the rest."""

from __future__ import annotations

from isosweep.rollout.base import Rollouts, TemplatedEngine


class Recorder:
    """A stand-in engine that remembers what it was asked."""

    def __init__(self):
        self.policy_version, self.prompts, self.weights = 0, [], None

    def generate(self, prompts, n, seed, temperature=None):
        self.prompts.append(list(prompts))
        self.temperature = temperature
        return Rollouts([[1]] * len(prompts) * n, [[2]] * len(prompts) * n, [[0.0]] * len(prompts) * n,
                        ["4"] * len(prompts) * n, self.policy_version)

    def update_weights(self, state_dict, version, at_precision=True):
        self.weights, self.policy_version, self.at_precision = state_dict, version, at_precision


def test_prompts_are_templated_and_weights_and_versions_pass_through():
    inner = Recorder()
    engine = TemplatedEngine(inner, lambda prompt: f"<user>{prompt}<assistant>")
    rollouts = engine.generate(["2+2=", "3+3="], n=2, seed=0)
    assert inner.prompts == [["<user>2+2=<assistant>", "<user>3+3=<assistant>"]]
    assert rollouts.texts == ["4"] * 4  # completions come back as the engine made them
    assert inner.temperature is None
    engine.generate(["2+2="], n=1, seed=0, temperature=0.5)
    assert inner.temperature == 0.5  # an evaluation's own temperature reaches the engine
    engine.update_weights({"w": 1}, version=3)
    assert inner.weights == {"w": 1} and engine.policy_version == inner.policy_version == 3 and inner.at_precision
    engine.update_weights({"w": 2}, version=4, at_precision=False)  # an evaluation's bf16 weights pass through too
    assert inner.weights == {"w": 2} and inner.policy_version == 4 and inner.at_precision is False
