"""The ``report`` and ``bench`` subcommands of ``ddp-conformance`` (added by cli.py)."""
from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from ..errors import EXIT_FAILED, EXIT_OK, UsageError


def add_subcommands(sub: Any) -> None:
    report = sub.add_parser("report", help="re-render the report set of a run, or compare two runs")
    report.add_argument("results_dir", nargs="?", metavar="RESULTS_DIR",
                        help="directory holding results.jsonl and/or bench.json")
    report.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"),
                        help="print changed verdicts and significant timing changes; exit 1 when "
                             "a verdict regressed or a timing got significantly slower")
    report.set_defaults(handler=report_command)

    from ..bench.run import EXPERIMENTS

    bench = sub.add_parser("bench", help="time candidates on benchmark models, or run one of the "
                                         "DDP paper's experiments")
    bench.add_argument("--candidate", action="append", metavar="SPEC",
                       help="as for run; repeatable (default: torch and reference; torch is always "
                            "timed as the baseline)")
    bench.add_argument("--world-size", type=int, default=2, metavar="N", help="ranks (default 2)")
    bench.add_argument("--model", action="append", metavar="NAME",
                       help="mlp10m, many-small, convnet (default: all three for timing and "
                            "breakdown, mlp10m for the sweeps)")
    bench.add_argument("--steps", type=int, metavar="N", help="timed steps per candidate per round")
    bench.add_argument("--rounds", type=int, metavar="N", help="interleaved rounds")
    bench.add_argument("--warmup", type=int, default=3, metavar="N", help="warm-up steps (default 3)")
    bench.add_argument("--experiment", choices=EXPERIMENTS, default="timing",
                       help="timing (default) or one of the paper's experiments")
    bench.add_argument("--report-dir", default="reports", metavar="DIR",
                       help="bench.json goes here, merged with what is there; the report set is "
                            "re-rendered with it (default reports/)")
    bench.set_defaults(handler=bench_command)


def report_command(args: argparse.Namespace, out: TextIO) -> int:
    from . import write_report_set
    from .compare import compare_dirs, format_comparison

    if args.compare:
        if args.results_dir:
            raise UsageError("give either RESULTS_DIR or --compare OLD NEW, not both")
        comp = compare_dirs(*args.compare)
        out.write(format_comparison(comp) + "\n")
        return EXIT_FAILED if comp.failed else EXIT_OK
    if not args.results_dir:
        raise UsageError("report needs RESULTS_DIR (or --compare OLD NEW)")
    if not os.path.isdir(args.results_dir):
        raise UsageError(f"{args.results_dir!r} is not a directory")
    for path in write_report_set(args.results_dir):
        out.write(f"wrote {path}\n")
    return EXIT_OK


def bench_command(args: argparse.Namespace, out: TextIO) -> int:
    from ..bench.run import BenchConfig, run_bench

    cfg = BenchConfig(candidates=args.candidate or ["torch", "reference"], world_size=args.world_size,
                      models=args.model, steps=args.steps, rounds=args.rounds, warmup=args.warmup,
                      experiment=args.experiment, report_dir=args.report_dir)
    run_bench(cfg, out)
    return EXIT_OK
