"""The ``isosweep`` command.

    isosweep trial sweeps/trials/easy.yaml --set budget=20000 --set Bp=16 --set n=8 --out runs/easy [--address auto]
    isosweep models build [--sizes tiny-1m ...] [--task arithmetic] [--seed 0]
    isosweep ais-study [--budget 20000] [--out dashboards/ais-study]
    isosweep bench [--out bench/results.json]

A configuration error prints one message naming the file and key and exits with status 2
before any model is built or trained.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from isosweep.config import ConfigError, load_trial


def _trial(args: argparse.Namespace) -> None:
    cfg = load_trial(args.config, args.set)
    from isosweep.launch import run_trial  # heavy imports only once the config is known to be good

    records = run_trial(cfg, args.out, address=args.address)
    first, last = records[0], records[-1]
    k = cfg.eval.k
    print(f"[trial] done: mean@{k} {first[f'eval/mean@{k}']:.3f} -> {last[f'eval/mean@{k}']:.3f} "
          f"over {last['rollouts']} rollouts; metrics in {args.out}/metrics.jsonl")


def _models_build(args: argparse.Namespace) -> None:
    from isosweep.models import SIZES, ensure_base_model
    from isosweep.models.warmup import REPORT_FILE

    for size in args.sizes or list(SIZES):
        path = ensure_base_model(size, args.task, args.seed)
        report = json.loads((path / REPORT_FILE).read_text())
        print(f"{size:10s} {report['parameters']:>9,d} params  warm-up {report['warmup_seconds']:>5.0f}s  "
              f"eval pass@1 by level {report['eval_pass@1']}  {path}")


def _ais_study(args: argparse.Namespace) -> None:
    from isosweep.ais_study import run_study

    rows = run_study(args.out, args.budget, extra=args.set, address=args.address)
    print((Path(args.out) / "table.md").read_text())
    print(f"[ais-study] {len(rows)} arms; table, alpha trace and plot in {args.out}")


def _bench(args: argparse.Namespace) -> None:
    from isosweep.bench import main as bench

    bench(args.out, engines=args.engines, sizes=args.sizes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="isosweep", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    trial = commands.add_parser("trial", help="run (or resume) one GRPO trial")
    trial.add_argument("config", help="trial YAML, e.g. sweeps/trials/easy.yaml")
    trial.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key (dotted for sections: algorithm.kl_coef=0); repeatable")
    trial.add_argument("--out", required=True, help="output directory (metrics.jsonl, checkpoints/)")
    trial.add_argument("--address", default=None,
                       help="Ray cluster to join (e.g. 'auto'); default: start a local Ray for this trial")
    trial.set_defaults(run=_trial)

    models = commands.add_parser("models", help="tiny model family")
    models_commands = models.add_subparsers(dest="models_command", required=True)
    build = models_commands.add_parser("build", help="build (or find cached) base models")
    build.add_argument("--sizes", nargs="*", help="tiny sizes (default: all)")
    build.add_argument("--task", default="arithmetic", help="task to warm up on (default: arithmetic)")
    build.add_argument("--seed", type=int, default=0, help="warm-up seed (default: 0)")
    build.set_defaults(run=_models_build)

    study = commands.add_parser("ais-study", help="bf16 vs fp8 rollouts with none/tis/ais corrections, easy and hard sets")
    study.add_argument("--budget", type=int, default=20000, help="C per arm, in rollouts (default: 20000)")
    study.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override for every arm")
    study.add_argument("--out", default="dashboards/ais-study", help="output directory (default: dashboards/ais-study)")
    study.add_argument("--address", default=None, help="Ray cluster to join; default: a local Ray per arm")
    study.set_defaults(run=_ais_study)

    bench = commands.add_parser("bench", help="rollout engine throughput and one trial's time split")
    bench.add_argument("--out", default="bench/results.json", help="where to write the figures")
    bench.add_argument("--engines", nargs="*", help="engines to measure (default: vllm and hf where installed)")
    bench.add_argument("--sizes", nargs="*", help="tiny sizes (default: all)")
    bench.set_defaults(run=_bench)

    args = parser.parse_args(argv)
    try:
        args.run(args)
    except ConfigError as err:
        print(f"isosweep: configuration error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
