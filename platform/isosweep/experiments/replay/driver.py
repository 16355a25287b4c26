"""JF-HPO driven on a table: isosweep's ``JFHPOSearcher`` proposes, the simulator trains and charges.

The searcher (multi-fidelity GP over hyperparameters x size x budget, cost-aware log EI) is driven directly,
one trial at a time:

- its acquisition is scored on every point of the table (each configuration x size x evaluation budget,
  ``candidates``); option ``acquisition: continuous`` optimises it over the continuous box instead and snaps
  the proposal to the grid (:func:`~isosweep.experiments.replay.simulator.snap`);
- its GP's hyperparameters are refitted every ``refit_every`` (4) observations; in between the last fit is
  conditioned on the new data;
- every evaluation of a trial is reported to it (intermediate observations), its cost model is fitted to the
  nominal cost (the units the study is charged in), the objective is the gain over the size's base model,
  and the GP's noise is floored at the evaluation's own variance (from the table's per-problem counts);
- a proposal that repeats a configuration run at a smaller budget is a promotion; one that does not fit what
  is left is cut, the budget first, then the size;
- one full target trial's worth of the budget is kept for the end, where its recommendation is run at the
  target (a recommendation backed by a full-fidelity run);
- its proxies must earn their trust (``proxy_check``: :data:`PROXY_CHECK` configurations run at the target's
  smallest budget after the initial design; distrusted, the rest of the study is at the target) and may cost
  at most :data:`PROXY_SHARE` of the study budget (``proxy_budget``).

Three methods use it: ``jfhpo``; ``jfhpo-log``, the same with the size fidelity on a log scale
(``size_scale: log``: rungs at 0.5, 0.75, 1 for a ladder that doubles twice, instead of 0.06, 0.25, 1 in
parameters); and ``bo-target``, the ablation of the proxies: the same searcher with every trial at the target
size (``proxy_budget`` 0, no proxy check), so its only cheaper fidelity is the budget.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from isosweep.experiments.replay.records import ProxyVerdict
from isosweep.experiments.replay.simulator import Curves, Run, Study, search_space, snap

PROXY_CHECK = 3
"""JF-HPO's proxy check in the replay: configurations verified at the target (``JFHPOSearcher(proxy_check=)``)."""
PROXY_SHARE = 0.5
"""The most of a study's budget JF-HPO may spend below the target size in the replay (``proxy_budget``)."""


def reusable(run: Run | None, upto: int) -> Run | None:
    """``run`` if it can be continued to ``upto``; None (a fresh trial, another training seed) for a repeat of
    what it has seen or a stopped trial."""
    return None if run is None or run.done >= upto or run.stopped else run


def run_jfhpo(curves: Curves, study: Study, seed: int, options: dict[str, Any] | None = None,
              size_scale: str = "params") -> None:
    """One JF-HPO study on ``curves``; ``options``: ``JFHPOSearcher`` arguments over the replay's defaults,
    plus ``proxy_share`` (None: no cap) and ``acquisition`` (``grid`` or ``continuous``)."""
    from isosweep.hpo.searcher import JFHPOSearcher  # reason: torch and BoTorch, for the JF-HPO methods only

    options = {"num_restarts": 2, "raw_samples": 64, "fit_maxiter": 60, "acq_maxiter": 60, "refit_every": 4,
               "proxy_check": PROXY_CHECK, "proxy_share": PROXY_SHARE, **(options or {})}
    share = options.pop("proxy_share")
    options["proxy_budget"] = None if share is None else share * study.study_budget
    space = search_space(curves, size_scale)
    if options.pop("acquisition", "grid") == "grid":  # the table is a grid: score its points, not the continuous box
        options["candidates"] = [{**config, space.size_key: size, space.budget_key: point}
                                 for config in curves.configs for size in curves.sizes for point in curves.points]
    rng = np.random.default_rng([seed, 4])
    by_key = dict(zip(curves.keys, curves.configs))
    options.setdefault("noise_floor", curves.eval_variance)
    searcher = JFHPOSearcher(space, metric="gain", mode="max", seed=seed, time_attr="nominal",
                             progress_key="rollouts", intermediate=len(curves.points), **options)
    target, budget = curves.target, curves.budget
    reserve = study.price(target, budget)  # the final full-fidelity run of the recommendation
    runs: dict[tuple[str, str], Run] = {}

    def recommended() -> str | None:
        config = searcher.recommend()
        return None if config is None else snap(curves, space, config)[1]

    def observe(trial_id: str, size: str, key: str, upto: int, run: Run | None) -> Run:
        run, new = study.run(size, key, upto, seed=int(rng.choice(curves.seeds)) if run is None else None, run=run)
        searcher.replace_live(trial_id, {**{p.name: by_key[key][p.name] for p in space.params},
                                         space.size_key: size, space.budget_key: upto})
        for rollouts, value in new[:-1]:
            searcher.on_trial_result(trial_id, {"gain": value - curves.base[size], "rollouts": rollouts})
        rollouts, value = new[-1]
        searcher.on_trial_complete(trial_id, {"gain": value - curves.base[size], "rollouts": rollouts,
                                              "nominal": study.price(size, run.done)})
        return run

    i = 0
    while study.left - reserve > 1e-12:
        trial_id = f"t{i}"
        i += 1
        config = searcher.suggest(trial_id)
        size, key, upto = snap(curves, space, config)
        run = reusable(runs.get((size, key)), upto)
        # cut what does not fit: the budget first, then the size (unless the searcher keeps to the target)
        while not study.affords(size, upto, run, keep=reserve):
            lower = [p for p in curves.points if p < upto and (run is None or p > run.done)]
            smaller = [] if searcher.target_only() else curves.sizes[:curves.sizes.index(size)]
            if lower:
                upto = lower[-1]
            elif smaller:
                size, upto = smaller[-1], curves.points[-1]
                run = reusable(runs.get((size, key)), upto)
            else:
                break
        if not study.affords(size, upto, run, keep=reserve):
            searcher.on_trial_complete(trial_id, None)  # nothing fits: the search phase is over
            break
        runs[(size, key)] = observe(trial_id, size, key, upto, run)
        study.record(recommended())
    # the recommendation, run at the target (a continuation when the search ran it part-way)
    key = recommended()
    if key is not None:
        run = reusable(runs.get((target, key)), budget)
        if study.affords(target, budget, run):
            trial_id = f"t{i}"
            searcher.suggest(trial_id)
            observe(trial_id, target, key, budget, run)
            study.record(recommended())
    verdict = searcher.proxy_verdict
    study.proxy_verdict = None if verdict is None else ProxyVerdict(**verdict)
