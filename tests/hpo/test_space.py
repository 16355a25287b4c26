"""The JF-HPO search space: validation errors and the config <-> unit-cube mapping."""

from __future__ import annotations

import math

import pytest

from isosweep.hpo.space import Param, SearchSpace

TINY = {"tiny-0.3m": 322880, "tiny-1m": 955776, "tiny-5m": 4830464}


def grpo_space(**overrides) -> SearchSpace:
    kwargs = dict(params=(Param("lr", 1e-6, 1e-4, log=True), Param("clip_high", 0.1, 0.4),
                          Param("kl_coef", 1e-5, 1e-1, log=True)),
                  sizes=TINY, budget_min=1000, budget_max=10000, budget_step=500, min_budget=500)
    kwargs.update(overrides)
    return SearchSpace(**kwargs)


def test_layout_and_target_fidelity():
    space = grpo_space()
    assert space.dim == 5 and (space.idx_s, space.idx_b) == (3, 4)
    assert space.target == "tiny-5m"
    assert space.target_fidelities == {3: 1.0, 4: 1.0}
    assert space.size_fidelities == tuple(c / TINY["tiny-5m"] for c in sorted(TINY.values()))
    assert space.b_min == 1000 / 10000


def test_round_trip_config():
    space = grpo_space()
    config = {"lr": 3e-5, "clip_high": 0.28, "kl_coef": 1e-3, "model": "tiny-1m", "budget": 4500}
    x = space.to_unit(config)
    # log parameters are placed by their log: lr = 3e-5 sits at log(30)/log(100) of the way from 1e-6 to 1e-4.
    assert x[0] == pytest.approx(math.log(30) / math.log(100))
    assert x[1] == pytest.approx((0.28 - 0.1) / 0.3)
    assert x[3] == pytest.approx(955776 / 4830464) and x[4] == pytest.approx(0.45)
    back = space.from_unit(x)
    assert back["model"] == "tiny-1m" and back["budget"] == 4500
    for name in ("lr", "clip_high", "kl_coef"):
        assert back[name] == pytest.approx(config[name], rel=1e-9)


def test_from_unit_snaps_size_and_budget():
    space = grpo_space()
    # 0.19 is nearest (in log) to tiny-1m's 0.198; 0.43 * 10000 = 4300 -> nearest 500 multiple 4500.
    config = space.from_unit([0.5, 0.5, 0.5, 0.19, 0.43])
    assert config["model"] == "tiny-1m" and config["budget"] == 4500
    # budgets are clamped into [budget_min, budget_max]
    assert space.from_unit([0, 0, 0, 1.0, 0.0])["budget"] == 1000
    assert space.from_unit([1, 1, 1, 1.0, 1.0]) == {"lr": pytest.approx(1e-4), "clip_high": pytest.approx(0.4),
                                                     "kl_coef": pytest.approx(1e-1), "model": "tiny-5m",
                                                     "budget": 10000}


def test_at_target():
    space = grpo_space()
    assert space.at_target({"lr": 1e-5, "model": "tiny-0.3m", "budget": 1000}) == {
        "lr": 1e-5, "model": "tiny-5m", "budget": 10000}


def test_from_dict_matches_constructor():
    space = SearchSpace.from_dict({"params": {"lr": {"low": 1e-6, "high": 1e-4, "log": True},
                                              "clip_high": {"low": 0.1, "high": 0.4},
                                              "kl_coef": {"low": 1e-5, "high": 1e-1, "log": True}},
                                   "sizes": TINY, "budget": [1000, 10000], "budget_step": 500, "min_budget": 500})
    assert space == grpo_space()


@pytest.mark.parametrize("kwargs, message", [
    ({"target": "tiny-1m"}, "not the largest size"),
    ({"target": "tiny-9m"}, "not in the ladder"),
    ({"sizes": {"a": 10, "b": 10}}, "tie for largest"),
    ({"sizes": {}}, "ladder is empty"),
    ({"budget_min": 20000}, "budget range is empty"),
    ({"budget_min": 500, "min_budget": 1000}, "below the smallest budget one trial can run"),
    ({"budget_min": 1200}, "not a multiple of budget_step"),
    ({"params": ()}, "at least one hyperparameter"),
    ({"params": (Param("lr", 0.1, 1), Param("lr", 0.1, 1))}, "duplicate"),
    ({"params": (Param("model", 0.1, 1),)}, "clashes"),
])
def test_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        grpo_space(**kwargs)


@pytest.mark.parametrize("args, message", [
    (("lr", 1e-4, 1e-4), "empty range"),
    (("clip_high", 0.4, 0.1), "empty range"),
    (("kl_coef", 0.0, 0.1, True), "log range needs low > 0"),
    (("kl_coef", -1.0, 0.1, True), "log range needs low > 0"),
    (("lr", 0.0, math.inf), "finite"),
])
def test_param_errors(args, message):
    with pytest.raises(ValueError, match=message):
        Param(*args)


def test_config_missing_keys():
    with pytest.raises(ValueError, match="lacks"):
        grpo_space().to_unit({"lr": 1e-5})


LADDER = {"tiny-w64": 240320, "tiny-w128": 955776, "tiny-w256": 3812096}


def test_a_log_size_scale_spaces_a_doubling_ladder_evenly_and_keeps_the_cost_in_parameters():
    space = grpo_space(sizes=LADDER, size_scale="log")
    params = grpo_space(sizes=LADDER)
    ratios = [LADDER[n] / LADDER["tiny-w256"] for n in LADDER]
    # s = 1 + ln(p / p_target) / (2 ln(p_target / p_smallest)): the smallest at 0.5, the rest by their log
    span = 2 * math.log(LADDER["tiny-w256"] / LADDER["tiny-w64"])
    assert space.size_fidelities == pytest.approx([1 + math.log(r) / span for r in ratios])
    assert space.size_fidelities[0] == pytest.approx(0.5) and space.size_fidelities[1] == pytest.approx(0.75, abs=1e-3)
    assert params.size_fidelities == pytest.approx(ratios)
    for name, ratio in zip(LADDER, ratios):  # the cost of a rung is its parameters on either scale
        assert space.size_ratio(space.size_fidelity(name)) == pytest.approx(ratio)
        assert params.size_ratio(params.size_fidelity(name)) == pytest.approx(ratio)
        assert space.params_ratio(name) == params.params_ratio(name) == pytest.approx(ratio)
        assert space.snap_size(space.size_fidelity(name)) == name
    assert space.snap_size(0.6) == "tiny-w64" and space.snap_size(0.66) == "tiny-w128"
    with pytest.raises(ValueError, match="size_scale 'cubic': allowed: params, log"):
        grpo_space(size_scale="cubic")
    assert SearchSpace.from_dict({"params": {"lr": {"low": 1e-6, "high": 1e-4, "log": True}}, "sizes": LADDER,
                                  "budget": [1000, 10000], "size_scale": "log"}).size_scale == "log"
