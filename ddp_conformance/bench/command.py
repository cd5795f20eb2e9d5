"""``ddp-conformance bench``: time candidates, or run one of the DDP paper's experiments."""
from __future__ import annotations

import argparse
from typing import Any, TextIO

from ddp_conformance.bench import EXPERIMENTS
from ddp_conformance.errors import EXIT_OK
from ddp_conformance.options import add_to_argparse, check_options


def add_parser(sub: Any) -> None:
    """``bench``'s options: the option table's rows it takes, and its own. Imports no torch."""
    bench = sub.add_parser("bench", help="time candidates on benchmark models, or run one of the "
                                         "DDP paper's experiments")
    add_to_argparse(bench, "bench")
    bench.add_argument("--model", action="append", metavar="NAME",
                       help="mlp10m, many-small, convnet (default: all three for timing and "
                            "breakdown, mlp10m for the sweeps)")
    bench.add_argument("--steps", type=int, metavar="N", help="timed steps per candidate per round")
    bench.add_argument("--rounds", type=int, metavar="N", help="interleaved rounds")
    bench.add_argument("--warmup", type=int, default=3, metavar="N", help="warm-up steps (default 3)")
    bench.add_argument("--experiment", choices=EXPERIMENTS, default="timing",
                       help="timing (default) or one of the paper's experiments")
    bench.set_defaults(handler=bench_command)


def bench_command(args: argparse.Namespace, out: TextIO) -> int:
    """``bench``: the values checked and the report directory written to before any rank
    starts; then the experiment."""
    check_options(lambda dest: getattr(args, dest), "bench")
    from ddp_conformance.bench.run import BenchConfig, run_bench
    from ddp_conformance.report.files import check_writable

    check_writable(args.ddp_report_dir)
    cfg = BenchConfig(candidates=args.ddp_candidate or ["torch", "reference"],
                      world_size=args.ddp_world_size, backend=args.ddp_backend,
                      device=args.ddp_device, models=args.model, steps=args.steps,
                      rounds=args.rounds, warmup=args.warmup, experiment=args.experiment,
                      report_dir=args.ddp_report_dir)
    run_bench(cfg, out)
    return EXIT_OK
