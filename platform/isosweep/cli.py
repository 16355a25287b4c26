"""The ``isosweep`` command line: one parser (:func:`build_parser`) for the everyday commands and the research
tools, and one small function per command that reads its arguments and calls the library.

A configuration error prints one message naming the file and key and exits with status 2
before any model is built or trained.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import webbrowser
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from isosweep.models.sizes import FAMILY, LADDER, SIZES
from isosweep.report.schema import SCHEMA_VERSION, upgrade_folder
from isosweep.report.studies import load_studies
from isosweep.report.studies import write_report as write_study_report
from isosweep.run.memory import memory_table
from isosweep.run.plan import check_memory, plan, prompt_tokens, study_memory
from isosweep.run.submit import how_to_follow, ray_cli, submit, token_auth
from isosweep.spec.grid import AdaptiveSpec, Sweep
from isosweep.spec.hpo import HPOStudy
from isosweep.spec.study import load_study
from isosweep.spec.trial import load_trial
from isosweep.spec.values import parse_budget
from isosweep.spec.yamlio import ConfigError
from isosweep.track import server

# The commands import what runs trials (torch, Ray, DeepSpeed, MLflow: seconds of imports) inside
# their functions, once the config is known to be good, so `isosweep --help` and a bad file answer at once.


def _trial(args: argparse.Namespace) -> None:
    cfg = load_trial(args.config, args.set)
    from isosweep.trial.job import run_trial  # torch, Ray, DeepSpeed

    records = run_trial(cfg, args.out, address=args.address)
    first, last = records[0], records[-1]
    k = cfg.eval.k
    print(f"[trial] done: mean@{k} {first[f'eval/mean@{k}']:.3f} -> {last[f'eval/mean@{k}']:.3f} "
          f"over {last['rollouts']} rollouts; metrics in {args.out}/metrics.jsonl")


def _models_build(args: argparse.Namespace) -> None:
    from isosweep.models.warmup import REPORT_FILE, ensure_base_model  # torch, transformers

    for size in args.sizes or list(FAMILY):
        path = ensure_base_model(size, args.task, args.seed)
        report = json.loads((path / REPORT_FILE).read_text())
        print(f"{size:10s} {report['parameters']:>9,d} params  warm-up {report['warmup_seconds']:>5.0f}s  "
              f"eval pass@1 by level {report['eval_pass@1']}  weights {report.get('weights_sha256', '?')[:12]}  {path}")


def comma_list(kind: Callable[[str], Any]) -> Callable[[str], list]:
    """An argparse type: ``"a,b"`` -> ``[kind("a"), kind("b")]``."""
    def parse(text: str) -> list:
        items = [part.strip() for part in text.split(",") if part.strip()]
        if not items:
            raise argparse.ArgumentTypeError("give at least one value, comma-separated")
        try:
            return [kind(item) for item in items]
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return parse


def _ais_study(args: argparse.Namespace) -> None:
    from isosweep.experiments.ais_study import run_study  # torch, Ray, DeepSpeed

    rows = run_study(args.out, args.budget, extra=args.set, address=args.address, arms=tuple(args.arms),
                     sets=tuple(args.sets), seeds=tuple(args.seeds))
    print((Path(args.out) / "table.md").read_text())
    print(f"[ais-study] {len(rows)} arms; table, alpha trace and plot in {args.out}")


def _calibrate(args: argparse.Namespace) -> None:
    from isosweep.experiments.calibrate import run_pilot  # torch, Ray, DeepSpeed

    chosen, rows = run_pilot(args.out, args.budget, trial_file=Path(args.trial), sweep_file=Path(args.sweep),
                             extra=args.set, address=args.address)
    print((Path(args.out) / "summary.md").read_text())
    print(f"[calibrate] {len(rows)} trials; pilot.csv, summary.md and calibration.png in {args.out}")


def _codes_pilot(args: argparse.Namespace) -> None:
    from isosweep.experiments.codes_pilot import run_pilot  # torch, DeepSpeed

    run_pilot(args.out, args.budget)
    print((Path(args.out) / "pilot.md").read_text())


def _tabular_truth(args: argparse.Namespace) -> None:
    from isosweep.experiments.tabular_control import compare, write  # the simulation, the report's fits

    agreements = compare(args.sweep, args.folder, metric=args.metric)
    print(write(agreements, args.folder))
    if not all(a.agrees for a in agreements):
        raise SystemExit(f"[tabular-truth] the report of {args.folder} misses the known n* at "
                         f"{sum(not a.agrees for a in agreements)} budget(s): a fault of the platform, not of the scale")


def _validate_stats(args: argparse.Namespace) -> None:
    from isosweep.experiments.stats_validation import validate, write_report  # SciPy, the fitting

    path = write_report(validate(args.repeats, args.bootstrap, args.seed), args.out)
    print(path.read_text())


def _adaptive_replay(args: argparse.Namespace) -> None:
    from isosweep.report.adaptive import METHODS, Rule, replay_studies  # SciPy, the fitting

    unknown = sorted(set(args.methods or ()) - set(METHODS))
    if unknown:
        raise ConfigError(f"--methods {unknown}: allowed {list(METHODS)}")
    root = Path(args.dashboards)
    folders = [Path(f).name for f in args.folders] or [s.folder for s in load_studies(root)]
    bad = [f for f in folders if not (root / f / "fits.json").exists()]
    if bad:
        raise ConfigError(f"no study folder {bad} under {root} (a folder with fits.json and curves.json)")
    try:
        rule = Rule(bootstrap=args.bootstrap, **({"rungs": tuple(args.rungs)} if args.rungs else {}))
    except ValueError as e:
        raise ConfigError(f"--rungs: {e}") from None
    table = replay_studies(root, folders, tuple(args.confidence), tuple(args.methods or METHODS), rule,
                           unguarded=args.unguarded)
    path = table.write(args.out)
    print(path.read_text())
    print(f"[adaptive-replay] {path}")


def _report(args: argparse.Namespace) -> None:
    if args.upgrade:
        changed = upgrade_folder(args.dashboards)
        print(f"[report] {len(changed)} fits.json rewritten to schema_version {SCHEMA_VERSION}"
              + "".join(f"\n  {path}" for path in changed))
    if args.refresh:
        from isosweep.run.grid import refresh_dashboards  # Ray, MLflow

        refresh_dashboards(server.ensure_server(), args.dashboards)
    path = write_study_report(args.dashboards)
    print(path.read_text())
    print(f"[report] {path}")


def _bench(args: argparse.Namespace) -> None:
    from isosweep.experiments.bench import main as bench  # torch, Ray, DeepSpeed

    bench(args.out, engines=args.engines, sizes=args.sizes, repeats=args.repeats, parts=args.parts)


def _sweep(args: argparse.Namespace) -> None:
    study = load_study(args.spec, args.budget, args.study_budget)
    if isinstance(study, HPOStudy):
        return _hpo(study, args)
    if args.adaptive and study.spec.adaptive is None:
        study = dataclasses.replace(study, spec=study.spec.model_copy(update={"adaptive": AdaptiveSpec()}))
    if args.dry_run:
        _dry_run(study, args.cluster)
        return
    from isosweep.run.grid import run_sweep  # Ray, torch, MLflow

    analysis = run_sweep(study, runs_root=Path(args.runs).expanduser(), dashboards=None if args.no_dashboards else args.dashboards,
                         address=args.address, progress_every_s=args.progress_every, live=not args.plain)
    if analysis is None:
        raise SystemExit(130)


def _hpo(study: HPOStudy, args: argparse.Namespace) -> None:
    if args.dry_run:
        space, first = study.space, study.space.ladder[0][0]
        print(f"{study.sweep_id}: {study.spec.search} search over {', '.join(space.names)}\n"
              f"  sizes {', '.join(f'{n} ({p:,} params, s={study.size_fidelity(n):.3g})' for n, p in space.ladder)}\n"
              f"  budgets {space.budget_min:,}..{space.budget_max:,} rollouts in steps of {study.batch}\n"
              f"  study budget {study.study_budget:,.0f} target-equivalent rollouts = "
              f"{study.study_budget / study.cost(study.target, study.budget):.2f} full-fidelity trials or "
              f"{study.study_budget / study.cost(first, space.budget_min):.0f} trials at the lowest fidelity")
        jf = study.spec.jfhpo
        if study.spec.search == "jfhpo" and jf.proxy_check:
            print(f"  proxy check: {jf.proxy_check} configurations at {study.target}, {space.budget_min:,} rollouts, "
                  f"after the design; Spearman rho < {jf.proxy_rho:g} -> the rest at {study.target} only")
        if study.spec.search == "jfhpo" and jf.proxy_share is not None:
            print(f"  sizes below {study.target} may cost at most {jf.proxy_share:.0%} of the study budget "
                  f"({jf.proxy_share * study.study_budget:,.0f})")
        print("\n".join(memory_table(study_memory(study), prompt_tokens(study))))
        check_memory(study)
        return
    from isosweep.run.hpo import run_hpo  # Ray, BoTorch, torch, MLflow

    result = run_hpo(study, runs_root=Path(args.runs).expanduser(),
                     dashboards=None if args.no_dashboards else args.dashboards, address=args.address,
                     progress_every_s=args.progress_every, live=not args.plain)
    if result is None:
        raise SystemExit(130)


def _dry_run(sweep: Sweep, cluster: str | None = None) -> None:
    print(plan(sweep, cluster))
    check_memory(sweep)  # after the table, so the refusal comes with the numbers behind it


def _frontier(args: argparse.Namespace) -> None:
    from isosweep.run.grid import frontier_report  # Ray, MLflow

    uri = server.ensure_server()
    frontier_report(uri, args.sweep_id, args.out, dashboards=args.dashboards, prefix=True, runs_root=args.runs,
                    guard_dashboards=True)


def _submit(args: argparse.Namespace) -> None:
    # a bad file or budget stops here, before any upload
    extra = []
    study = load_study(args.spec, args.budget, args.study_budget or None)
    if isinstance(study, HPOStudy):
        what = (f"{study.sweep_id}: {study.spec.search} HPO study, C = {study.budget:,} rollouts, study budget "
                f"{study.study_budget:,.0f} target-equivalent rollouts")
        if args.study_budget:
            extra = ["--study-budget", str(args.study_budget)]
    else:
        what = f"{study.sweep_id}: {len(study.trials)} trials at C = {study.budget:,} rollouts"
    env = dict(pair.split("=", 1) for pair in args.env)
    tunnel = None
    address = args.address
    if address is None:
        if not args.cluster:
            raise ConfigError("submit needs --cluster clusters/<x>.yaml (a cluster started with `ray up`) or --address")
        if token_auth(args.cluster):  # the tunnel and the job client then send this machine's token
            os.environ["RAY_AUTH_MODE"] = "token"
        # `ray dashboard` forwards the head's dashboard (127.0.0.1 there) to 127.0.0.1:8265 here over SSH
        tunnel = subprocess.Popen([ray_cli(), "dashboard", "--port", "8265", args.cluster],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        address = "http://127.0.0.1:8265"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", 8265)) == 0:
                    break
            time.sleep(1)
        else:
            tunnel.terminate()
            raise RuntimeError(f"no SSH tunnel to the dashboard of {args.cluster} after 120 s: is the cluster up (make cluster-up)?")
    try:
        print(f"[submit] {what}, to {address}")
        job = submit(address, args.spec, args.budget, runs=args.runs, env=env, wait=args.wait, extra=extra)
        print(how_to_follow(address, job, args.cluster))
    finally:
        if tunnel is not None:
            tunnel.terminate()


def _hpo_bench(args: argparse.Namespace) -> None:
    from isosweep.experiments.hpo_bench import MARGINS, run  # Ray, BoTorch, torch

    run(args.out, part=args.part, seeds=args.seeds, cost_budget=args.cost_budget, threshold=args.threshold,
        spec=args.spec, real_seeds=args.real_seeds, budget=args.budget, study_budget=args.study_budget,
        margins=tuple(args.margin or MARGINS), runs_root=Path(args.runs).expanduser(), table=args.table,
        replay_seeds=args.replay_seeds, study_budgets=tuple(args.study_budgets), eps=args.eps, force=args.force,
        jobs=args.jobs, reeval_seeds=args.reeval_seeds)


def _hpo_table(args: argparse.Namespace) -> None:
    from isosweep.experiments.hpo_table import build, load_table_spec  # torch, DeepSpeed when a curve runs

    out = Path(args.out) if args.out else Path("dashboards") / load_table_spec(args.spec)[0].name
    table = build(args.spec, out, limit=args.limit)
    print((out / "signal.md").read_text())
    print(f"[hpo-table] {len(table.cells)} of {table.expected_cells} curves; table.json and signal.md in {out}")


def _recommend(args: argparse.Namespace) -> None:
    from isosweep.run.recommend import recommend  # SciPy, the fitting; MLflow unless --from

    parse_budget(args.budget)  # a bad budget answers before a server starts (spec.values: the sweep files' rule)
    uri = None if args.source is not None and args.no_log else server.ensure_server()
    recommend(args.budget, uri=uri, folder=args.source, sweep_ids=args.sweeps, task=args.task,
              difficulty=args.difficulty, model=args.model, metric=args.metric, bootstrap=args.bootstrap,
              suggest=args.suggest, log_to=None if args.no_log else uri)


def _ui(args: argparse.Namespace) -> None:
    if args.stop:
        print("[mlflow] stopped" if server.stop_server() else "[mlflow] no local server was running")
        return
    uri = server.ensure_server()
    from isosweep.track import runs  # MLflow's client

    page = runs.experiment_url(uri, runs.client(uri))  # its runs table, not MLflow's GenAI pages
    if os.environ.get("DISPLAY") or sys.platform == "darwin":  # a desktop: open it there too
        webbrowser.open(page)
    print(f"[mlflow] UI at {page} -- experiment '{server.EXPERIMENT}'; each sweep is a parent run with its "
          "frontier under Artifacts > frontier, its best checkpoint at each C in Model registry > "
          f"{runs.registered_model_name('<sweep id>')}. Stop it with `make ui-stop`. On a remote machine: "
          "ssh -L 5000:127.0.0.1:5000 <host>")


def version() -> str:
    """The installed package's version; run from the source tree without installing it (``PYTHONPATH=platform``,
    as a Ray job's entrypoint does), the one in its pyproject.toml."""
    try:
        return metadata.version("isosweep")
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        # [project] is the file's first table with a version key
        found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M) if pyproject.is_file() else None
        return found.group(1) if found else "unknown"


EVERYDAY, RESEARCH = "everyday commands", "research tools (the studies and benchmarks behind dashboards/ and bench/)"

INTRO = ("Iso-compute sweeps and joint-fidelity HPO of GRPO training on Ray, vLLM, DeepSpeed, BoTorch and MLflow:\n"
         "run a study, read its compute-optimal frontier, plan the next run.")

EXAMPLES = """\
examples:
  # about a minute: two tiny trials check an installation end to end
  isosweep sweep sweeps/smoke.yaml --budget 2e3
  # the default study: its trials, resources and GPU-hours first, then the sweep (run again: it resumes)
  isosweep sweep sweeps/isocompute-easy.yaml --budget 1e5 --dry-run
  isosweep sweep sweeps/isocompute-easy.yaml --budget 1e5
  isosweep ui                          # MLflow's runs table: every trial, each sweep's frontier plots
  isosweep recommend --budget 1e6      # which (Bp, n, M) to run at C = 1e6, from the finished sweeps
  isosweep submit sweeps/qwen25-gsm8k-h200.yaml --cluster clusters/aws-h200.yaml --budget 1e6
  isosweep <command> --help            # that command's options

exit status: 0 done; 2 bad input (a configuration error names the file and the key), before anything is
built or trained; 130 a sweep interrupted or left with unfinished trials (the same command resumes it).
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``isosweep`` command's parser, built without running anything (``isosweep.docs`` writes cli.md from it)."""
    parser = argparse.ArgumentParser(prog="isosweep", usage="%(prog)s [-h] [--version] <command> [<args>]",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    # The list of commands is the description, in two sections; argparse's own list (one flat section) is hidden.
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>", prog="isosweep",
                                     help=argparse.SUPPRESS)
    listed: dict[str, list[tuple[str, str]]] = {EVERYDAY: [], RESEARCH: []}

    def command(name: str, line: str, section: str, more: str = "", examples: str = "") -> argparse.ArgumentParser:
        listed[section].append((name, line))
        about = line[0].upper() + line[1:] + "." + (f"\n\n{textwrap.fill(more, 100)}" if more else "")
        return commands.add_parser(name, help=line, description=about, epilog=examples or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)

    # --- everyday commands ---------------------------------------------------------------------------------
    sweep = command(
        "sweep", "run (or resume) a study file: a grid sweep and its frontier, or an HPO study", EVERYDAY,
        more="A grid sweep trains every grid point at budget C under Ray Tune, each trial a run in MLflow, and ends "
             "with the frontier analysis: the table printed, the report (frontier.csv, fits.json, plots, report.html) "
             "written to RUNS/<sweep id>/frontier/ and to the sweep's MLflow parent run. An HPO study (study: hpo) "
             "writes its summary to RUNS/<sweep id>/hpo/ and to its parent run. The committed studies under "
             "dashboards/ change only with --dashboards (or `make report`). Run the same command again to resume; a "
             "finished sweep trains nothing again.",
        examples="examples:\n  isosweep sweep sweeps/isocompute-easy.yaml --budget 1e5 --dry-run\n"
                 "  isosweep sweep sweeps/isocompute-easy.yaml --budget 1e5\n"
                 "  isosweep sweep sweeps/jfhpo.yaml --study-budget 6x\n")
    sweep.add_argument("spec", help="study file, e.g. sweeps/isocompute-easy.yaml")
    budgets = sweep.add_argument_group("budget")
    budgets.add_argument("--budget", default=None, help="C, rollouts per trial (e.g. 1e5); default: the file's budget")
    budgets.add_argument("--study-budget", default=None,
                         help="HPO studies: total spend in target-equivalent rollouts, or e.g. 6x for six "
                              "full-fidelity trials (default: the file's study_budget)")
    budgets.add_argument("--adaptive", action="store_true",
                         help="grid sweeps: advance in budget rungs (C/64, C/16, C/4) and stop the configurations that "
                              "cannot reach the frontier (the file's adaptive: section, else its defaults); the same "
                              "sweep id, so a later run without it resumes the stopped trials")
    outputs = sweep.add_argument_group("where the results go")
    outputs.add_argument("--runs", default="runs/sweeps",
                         help="RUNS/<sweep id>/ holds the trials and the report (default: runs/sweeps)")
    copies = outputs.add_mutually_exclusive_group()
    copies.add_argument("--dashboards", default=None,
                        help="also write the report (an HPO study: its summary) to DASHBOARDS/<sweep name>/, "
                             "replacing what that folder holds; e.g. dashboards, the committed studies")
    copies.add_argument("--no-dashboards", action="store_true",
                        help="the report only beside the runs and in MLflow (the default; for scripts that say so)")
    ray = sweep.add_argument_group("Ray")
    ray.add_argument("--address", default=None,
                     help="Ray cluster to join (e.g. 'auto'); default: a new local Ray on 127.0.0.1")
    ray.add_argument("--progress-every", type=float, default=30.0,
                     help="seconds between progress lines (default: 30)")
    ray.add_argument("--plain", action="store_true",
                     help="progress as plain lines, never the live display a terminal gets otherwise (as "
                          "ISOSWEEP_PLAIN=1; pipes and CI always get plain lines)")
    dry = sweep.add_argument_group("dry run")
    dry.add_argument("--dry-run", action="store_true",
                     help="print the trials, resources per trial, expected GPU-hours and concurrency (on GPU profiles "
                          "also the memory per GPU, refusing a point that does not fit); start nothing")
    dry.add_argument("--cluster", default=None,
                     help="with --dry-run of a grid sweep: the cluster YAML to plan concurrency for")
    sweep.set_defaults(run=_sweep)

    ui = command("ui", "start (or --stop) the local MLflow server and print its URL", EVERYDAY,
                 more="The server keeps its runs in .mlflow/ (SQLite; $ISOSWEEP_MLFLOW_DIR) and listens on "
                      "127.0.0.1:5000 ($ISOSWEEP_MLFLOW_PORT); where $MLFLOW_TRACKING_URI is set, that server is "
                      "used instead. On a desktop the page opens in the browser too.")
    ui.add_argument("--stop", action="store_true", help="stop the local server started by isosweep")
    ui.set_defaults(run=_ui)

    rec = command("recommend", "which (Bp, n, M) to run at a budget, from the finished sweeps", EVERYDAY,
                  more="Pools the finished grid sweeps of one task, difficulty and base model (from MLflow, or the "
                       "study folders with --from) and prints the allocation to run at C with its predicted value, "
                       "interval, P(best) and warnings; the recommendation is logged to MLflow unless --no-log.",
                  examples="examples:\n  isosweep recommend --budget 1e6\n"
                           "  isosweep recommend --budget 3e5 --difficulty easy --metric worst --suggest\n"
                           "  isosweep recommend --budget 1e6 --from dashboards --no-log\n")
    rec.add_argument("--budget", required=True, help="C, rollouts for the run (e.g. 1e6)")
    which = rec.add_argument_group("which sweeps")
    which.add_argument("--task", default=None, help="only sweeps of this task (e.g. arithmetic)")
    which.add_argument("--difficulty", choices=["easy", "hard", "all"], default=None,
                       help="only sweeps of this difficulty")
    which.add_argument("--model", default=None, help="only sweeps of this base model (e.g. tiny-1m)")
    which.add_argument("--sweeps", nargs="+", default=None, help="plan from these sweep ids (or their starts) only")
    which.add_argument("--from", dest="source", default=None,
                       help="read the sweeps from the study folders here (*/curves.json, e.g. dashboards) "
                            "instead of MLflow")
    how = rec.add_argument_group("the plan and where it goes")
    how.add_argument("--metric", default="mean", help="mean, best or worst (@k of the sweeps' eval.k; default: mean)")
    how.add_argument("--bootstrap", type=int, default=200, help="bootstrap replicates (default: 200)")
    how.add_argument("--suggest", nargs="?", const="sweeps", default=None,
                     help="also write the sweep that would most shrink the uncertainty (a YAML file, or a folder: "
                          "default sweeps/)")
    how.add_argument("--no-log", action="store_true",
                     help="do not log the recommendation to MLflow (with --from: no MLflow server is needed)")
    rec.set_defaults(run=_recommend)

    study_report = command("report", "test the papers' claims on the study folders -> DASHBOARDS/REPORT.md", EVERYDAY,
                           more="Reads the study folders one level under DASHBOARDS (their fits.json) and writes "
                                "REPORT.md and report.html there; with --refresh each folder is first redone from "
                                "MLflow.")
    study_report.add_argument("--dashboards", default="dashboards", help="the study folders (default: dashboards)")
    study_report.add_argument("--refresh", action="store_true",
                              help="first redo each study folder from MLflow, from the sweeps its fits.json names "
                              "(a finished sweep no folder holds: a new folder, the newest of its name)")
    study_report.add_argument("--upgrade", action="store_true",
                              help="first rewrite every fits.json under DASHBOARDS (at any depth) to the current "
                                   "schema_version (an older one is converted; a second run changes nothing)")
    study_report.set_defaults(run=_report)

    trial = command("trial", "run (or resume) one GRPO trial", EVERYDAY,
                    more="OUT gets metrics.jsonl, steps.jsonl and checkpoints/ (the log is printed); run the same command "
                         "again to resume from the latest checkpoint.",
                    examples="example:\n  isosweep trial sweeps/trials/easy.yaml --set budget=20000 --set Bp=16 "
                             "--set n=8 --out runs/easy\n")
    trial.add_argument("config", help="trial YAML, e.g. sweeps/trials/easy.yaml")
    trial.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (dotted for sections: algorithm.kl_coef=0); repeatable")
    trial.add_argument("--out", required=True, help="output directory (metrics.jsonl, checkpoints/)")
    trial.add_argument("--address", default=None,
                       help="Ray cluster to join (e.g. 'auto'); default: no Ray for a trial trained in this process "
                            "with in-process rollouts, a new local Ray for vLLM rollout actors or a Ray Train trial")
    trial.set_defaults(run=_trial)

    sub = command("submit", "submit a sweep to a Ray cluster as a Ray job", EVERYDAY,
                  more="Uploads this checkout (less .venv, .git, runs, .mlflow and caches) with Ray's job submission "
                       "client and runs `isosweep sweep SPEC --address auto --runs RUNS --no-dashboards` on the head; "
                       "prints how to follow the job. Submitting the same sweep again resumes it from the trials' "
                       "checkpoints under RUNS.",
                  examples="examples:\n  isosweep submit sweeps/qwen25-gsm8k-h200.yaml --cluster clusters/aws-h200.yaml "
                           "--budget 1e6 --runs /fsx/isosweep\n"
                           "  isosweep submit sweeps/smoke.yaml --address http://127.0.0.1:8265 --budget 2048\n")
    sub.add_argument("spec", help="sweep YAML, e.g. sweeps/isocompute-easy.yaml")
    # One of the two is needed; a missing one is answered as a configuration error (exit 2, see _submit).
    where = sub.add_argument_group("where (one of these is required)").add_mutually_exclusive_group()
    where.add_argument("--cluster", default=None,
                       help="cluster YAML started with `ray up` (make cluster-up): an SSH tunnel to its dashboard")
    where.add_argument("--address", default=None, help="Ray dashboard address, e.g. http://127.0.0.1:8265")
    job = sub.add_argument_group("the job")
    job.add_argument("--budget", default=None, help="C, rollouts per trial; default: the file's budget")
    job.add_argument("--study-budget", default=None, help="HPO studies: the total spend (default: the file's)")
    job.add_argument("--runs", default="~/isosweep/runs/sweeps",
                     help="where trial directories go on the cluster; a multi-node cluster needs shared storage "
                          "here (EFS, Filestore, NFS) so that a re-submitted sweep finds every trial's checkpoints "
                          "(default: ~/isosweep/runs/sweeps)")
    job.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                     help="environment variable for the job; repeatable")
    job.add_argument("--wait", action="store_true", help="follow the job's logs until it ends")
    sub.set_defaults(run=_submit)

    front = command("frontier", "redo a sweep's frontier analysis from MLflow alone (no training)", EVERYDAY,
                    more="Reads the sweep's trials from MLflow (no trial folders needed), fits the frontier again, "
                         "prints the table and writes the report to RUNS/<sweep id>/frontier/ (or --out) and to the "
                         "sweep's parent run.")
    front.add_argument("sweep_id", help="the sweep id (or its start, for the newest matching sweep), "
                                        "e.g. isocompute-easy-100k")
    out = front.add_argument_group("where the report goes").add_mutually_exclusive_group()
    out.add_argument("--runs", default="runs/sweeps",
                     help="to RUNS/<sweep id>/frontier (default: runs/sweeps)")
    out.add_argument("--out", default=None, help="to this folder instead")
    front.add_argument("--dashboards", default=None,
                       help="also write the report into this folder, the sweep's own (e.g. dashboards/<study>); a "
                            "folder holding the study report, other studies or another sweep's report is refused")
    front.set_defaults(run=_frontier)

    # --- research tools ------------------------------------------------------------------------------------
    models = command("models", "the tiny model family: `isosweep models build` builds (or finds) its base models",
                     RESEARCH)
    models_commands = models.add_subparsers(dest="models_command", required=True, metavar="<models command>",
                                            help="the one models command, build")
    build = models_commands.add_parser("build", help="build (or find cached) base models",
                                       description="Build (or find cached) the tiny base models: each warmed up on "
                                                   "the task, in $ISOSWEEP_CACHE (default ~/.cache/isosweep).")
    build.add_argument("--sizes", nargs="*", choices=list(SIZES), metavar="SIZE",
                       help=f"tiny sizes (default: the family, {' '.join(FAMILY)}; the width ladder: {' '.join(LADDER)})")
    build.add_argument("--task", default="arithmetic", help="task to warm up on (default: arithmetic)")
    build.add_argument("--seed", type=int, default=0, help="warm-up seed (default: 0)")
    build.set_defaults(run=_models_build)

    study = command("ais-study", "bf16 vs fp8 rollouts with none/tis/ais corrections, easy and hard sets", RESEARCH)
    arms = study.add_argument_group("the arms")
    arms.add_argument("--arms", type=comma_list(str), default=["bf16", "fp8+none", "fp8+tis", "fp8+ais"],
                      help="arms, <precision>[+<correction>] (precision bf16, fp8, int8, int6, int4, int3, int2; "
                           "correction none, tis, ais); default: bf16,fp8+none,fp8+tis,fp8+ais")
    arms.add_argument("--sets", type=comma_list(str), default=["easy", "hard"],
                      help="problem sets, sweeps/trials/<set>.yaml (default: easy,hard)")
    arms.add_argument("--seeds", type=comma_list(int), default=[0], help="training seeds, e.g. 0,1 (default: 0)")
    arms.add_argument("--budget", type=int, default=20000, help="C per arm, in rollouts (default: 20000)")
    arms.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every arm")
    study.add_argument("--out", default="dashboards/ais-study", help="output directory (default: dashboards/ais-study)")
    study.add_argument("--address", default=None, help="Ray cluster to join; default: one local Ray for every arm")
    study.set_defaults(run=_ais_study)

    pilot = command("calibrate", "the learning-rate pilot behind the default lr_ref", RESEARCH,
                    more="Trains lr x the smallest and largest batch of the sweep's grid x 2 seeds, and picks lr_ref.")
    pilot.add_argument("--budget", type=int, default=20000, help="C per trial, in rollouts (default: 20000)")
    pilot.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every trial")
    pilot.add_argument("--trial", default="sweeps/trials/easy.yaml",
                       help="base trial of every pilot trial (default: sweeps/trials/easy.yaml)")
    pilot.add_argument("--sweep", default="sweeps/isocompute-easy.yaml",
                       help="sweep whose grid gives the smallest and largest batch (default: sweeps/isocompute-easy.yaml)")
    pilot.add_argument("--out", default="dashboards/calibration", help="output directory (default: dashboards/calibration)")
    pilot.add_argument("--address", default=None, help="Ray cluster to join; default: a local Ray")
    pilot.set_defaults(run=_calibrate)

    codes = command("codes-pilot", "how fast the codes needles drift and how many successes learn one", RESEARCH,
                    more="Trains on the anchors (drift on and off, the needles watched) and on the needles; "
                         "writes OUT/pilot.json and OUT/pilot.md.")
    codes.add_argument("--budget", type=int, default=25600, help="C per run, in rollouts (default: 25600)")
    codes.add_argument("--out", default="dashboards/codes-pilot", help="output directory (default: dashboards/codes-pilot)")
    codes.set_defaults(run=_codes_pilot)

    known = command("tabular-truth", "the planted control's known n*(C) beside its study's report", RESEARCH,
                    more="Simulates the tabular control (numpy, 64 seeds) on the study's grid and writes "
                         "FOLDER/truth.json and FOLDER/truth.md; exits 1 where the report misses the known n*.")
    known.add_argument("sweep", help="the control's sweep file, e.g. sweeps/studies/tabular-control.yaml")
    known.add_argument("folder", help="its study folder, e.g. dashboards/tabular-control")
    known.add_argument("--metric", default="mean@4", help="the frontier metric compared (default: mean@4)")
    known.set_defaults(run=_tabular_truth)

    check = command("validate-stats", "check the frontier statistics on synthetic sweeps with a known truth", RESEARCH,
                    more="Recovery, coverage, ties and the decision hold-out, written to OUT/validation.md.")
    check.add_argument("--repeats", type=int, default=20, help="synthetic sweeps per check (default: 20)")
    check.add_argument("--bootstrap", type=int, default=100, help="bootstrap replicates per analysis (default: 100)")
    check.add_argument("--seed", type=int, default=0, help="seed of the synthetic data (default: 0)")
    check.add_argument("--out", default="dashboards/methods", help="output directory (default: dashboards/methods)")
    check.set_defaults(run=_validate_stats)

    adaptive = command("adaptive-replay", "replay adaptive-sweep stopping rules on finished studies", RESEARCH,
                       more="Each study folder's recorded curves replayed rung by rung (each decision sees only the data "
                            "up to its rung): the compute each rule would have spent against the full grid's, and "
                            "whether the frontier it leaves (n*'s 90% set, the value) is the full grid's. Writes "
                            "OUT/replay.md and replay.json.",
                       examples="example:\n  isosweep adaptive-replay dashboards/bend-easy-full --confidence 0.5 0.9\n")
    adaptive.add_argument("folders", nargs="*",
                          help="study folders (default: every study the report counts under --dashboards)")
    adaptive.add_argument("--dashboards", default="dashboards", help="where the studies' curves.json are (default: "
                                                                     "dashboards)")
    adaptive.add_argument("--methods", nargs="+", default=None,
                          help="the rules to replay: frontier, asha, hyperband, p-best, full, and two bounds that "
                               "read the finished study: hindsight (each configuration stopped at the rung after the "
                               "last budget at which the full grid names it the winner) and hindsight-keep (the "
                               "winners run whole, the others stop at the first rung) (default: all)")
    adaptive.add_argument("--confidence", type=float, nargs="+", default=[0.9],
                          help="the frontier rule's confidence(s), each replayed (default: 0.9)")
    adaptive.add_argument("--unguarded", action="store_true",
                          help="also replay the frontier rule without its guard (stopping fits not identified or not "
                               "yet risen), to show what the guard costs")
    adaptive.add_argument("--bootstrap", type=int, default=100, help="replicates per decision (default: 100)")
    adaptive.add_argument("--rungs", type=float, nargs="+", default=None,
                          help="the budget rungs, increasing fractions of C_max in (0, 1) (default: 1/64 1/16 1/4)")
    adaptive.add_argument("--out", default="dashboards/adaptive", help="output directory (default: dashboards/adaptive)")
    adaptive.set_defaults(run=_adaptive_replay)

    bench = command("bench", "isosweep vs TRL vs a plain loop, engine throughput, one trial's time split", RESEARCH)
    bench.add_argument("--out", default="bench/results.json",
                       help="where to write the figures (default: bench/results.json)")
    bench.add_argument("--engines", nargs="*",
                       help="engines to measure (default: vllm and hf, or hf alone where vLLM is not installed)")
    bench.add_argument("--sizes", nargs="*", help=f"tiny sizes (default: {' '.join(FAMILY)})")
    bench.add_argument("--repeats", type=int, default=3,
                       help="interleaved runs of each contender in the side-by-side (default: 3)")
    bench.add_argument("--parts", nargs="*", choices=["side_by_side", "engines", "trial", "sweep"],
                       help="parts to run (default: all); the others keep what --out already holds")
    bench.set_defaults(run=_bench)

    hpo = command("hpo-bench", "JF-HPO vs its baselines: Hartmann, live tiny-family studies, a replayed table",
                  RESEARCH, more="(a) the two-fidelity Hartmann function, (b) HPO studies on the tiny family, (c) the "
                                 "studies replayed on a table of learning curves.")
    hpo.add_argument("--part", choices=("synthetic", "real", "table", "all"), default="table",
                     help="synthetic: (a) (seconds); real: (b) (about an hour on 2 cores); table: (c) (minutes); "
                          "all: every part; default: table")
    hpo.add_argument("--out", default="bench/hpo.json", help="where to write the figures (default: bench/hpo.json)")
    synthetic = hpo.add_argument_group("(a) synthetic: the Hartmann function")
    synthetic.add_argument("--seeds", type=int, default=3, help="number of seeds (default: 3)")
    synthetic.add_argument("--cost-budget", type=float, default=60.0,
                           help="study budget in target-trial units (default: 60)")
    synthetic.add_argument("--threshold", type=float, default=0.8, help="regret to reach (default: 0.8)")
    real = hpo.add_argument_group("(b) real: HPO studies on the tiny family")
    real.add_argument("--spec", default="sweeps/jfhpo.yaml", help="the HPO study file (default: sweeps/jfhpo.yaml)")
    real.add_argument("--real-seeds", type=int, default=3, help="searcher seeds per method (default: 3)")
    real.add_argument("--budget", default=None, help="C, the full-fidelity budget (default: the file's)")
    real.add_argument("--study-budget", default=None, help="the study budget (default: the file's)")
    real.add_argument("--margin", type=float, action="append",
                      help="a threshold = the target base model's eval + margin; repeat for several "
                           "(default: 0.01 and 0.02)")
    real.add_argument("--runs", default="runs/sweeps",
                      help="where the studies' trial directories go (default: runs/sweeps)")
    real.add_argument("--reeval-seeds", type=comma_list(int), default=None,
                      help="when the studies ran a table's setting: retrain each recommendation at the target "
                           "with these fresh training seeds, e.g. 1,2 (runs/hpo-reeval/; finished runs are read back)")
    table = hpo.add_argument_group("(c) table: replayed on a table of learning curves")
    table.add_argument("--table", default="dashboards/hpo-table-mup/table.json",
                       help="the table of learning curves (isosweep hpo-table's table.json; "
                            "default: dashboards/hpo-table-mup/table.json)")
    table.add_argument("--replay-seeds", type=int, default=20, help="searcher seeds per method (default: 20)")
    table.add_argument("--study-budgets", type=float, nargs="+", default=[4.0, 8.0],
                       help="study budgets in full target trials (default: 4 8)")
    table.add_argument("--force", action="store_true",
                       help="replay a table that does not meet its signal check's preconditions (refused "
                            "otherwise); its report says it is not a fair test")
    table.add_argument("--eps", type=float, default=0.01,
                       help="a recommendation within eps of the best true value counts as found (default: 0.01)")
    table.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                       help="processes the replayed studies run in (default: one per CPU core); the results do "
                            "not depend on it")
    hpo.set_defaults(run=_hpo_bench)

    curves = command("hpo-table", "learning curves over an HPO grid, and whether they have signal", RESEARCH,
                     more="A table of learning curves (grid x sizes x seeds, each curve a trial run in this process) "
                          "and the check that it has signal, for a tabular HPO benchmark: table.json and signal.md "
                          "in OUT. A rerun continues where the last one stopped.")
    curves.add_argument("spec", nargs="?", default="sweeps/tables/hpo-table-pilot.yaml",
                        help="the table file (default: sweeps/tables/hpo-table-pilot.yaml)")
    curves.add_argument("--out", default=None, help="output directory (default: dashboards/<the table's name>)")
    curves.add_argument("--limit", type=int, default=None,
                        help="run at most this many unfinished curves, then write what is finished (a rerun continues)")
    curves.set_defaults(run=_hpo_table)

    width = max(len(name) for section in listed.values() for name, _ in section) + 2
    parser.description = "\n\n".join([INTRO] + [f"{title}:\n" + "\n".join(f"  {name:<{width}}{line}" for name, line in rows)
                                                for title, rows in listed.items()])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except ConfigError as err:
        print(f"isosweep: configuration error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
