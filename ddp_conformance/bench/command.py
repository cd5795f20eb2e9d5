"""``ddp-conformance bench``: time candidates, or run one of the DDP paper's experiments."""
from __future__ import annotations

import argparse
from typing import Any, TextIO

from ddp_conformance.errors import EXIT_OK


def add_parser(sub: Any) -> None:
    from ddp_conformance.bench.run import EXPERIMENTS

    bench = sub.add_parser("bench", help="time candidates on benchmark models, or run one of the "
                                         "DDP paper's experiments")
    bench.add_argument("--candidate", action="append", metavar="SPEC",
                       help="as for run; repeatable (default: torch and reference; torch is always "
                            "timed as the baseline)")
    bench.add_argument("--world-size", type=int, default=2, metavar="N", help="ranks (default 2)")
    bench.add_argument("--backend", default="gloo", metavar="NAME",
                       help="process-group backend: gloo (default) or nccl")
    bench.add_argument("--device", default="cpu", metavar="DEV",
                       help="cpu (default) or cuda (nccl implies cuda); on CUDA the phases are "
                            "timed with CUDA events (one device synchronisation per step) and the "
                            "overlap is measured on the GPU timeline too (profiler kernels)")
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


def bench_command(args: argparse.Namespace, out: TextIO) -> int:
    from ddp_conformance.bench.run import BenchConfig, run_bench

    cfg = BenchConfig(candidates=args.candidate or ["torch", "reference"], world_size=args.world_size,
                      backend=args.backend, device=args.device, models=args.model,
                      steps=args.steps, rounds=args.rounds, warmup=args.warmup,
                      experiment=args.experiment, report_dir=args.report_dir)
    run_bench(cfg, out)
    return EXIT_OK
