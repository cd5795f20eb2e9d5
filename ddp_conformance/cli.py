"""``ddp-conformance``: run the catalog against candidates, or list it.

Exit codes (SPEC.md): 0 when nothing failed unexpectedly, 1 when something did, 2 on a
usage or environment error, said in one line on stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TextIO

from tabulate import tabulate

from .catalog import keyword_matcher, load_catalog
from .errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PoolError, UsageError
from .pool import RankPool
from .results import ResultsWriter, count_verdicts, run_info
from .runner import RunConfig, Runner
from .scenario import Scenario
from .stability import Stability
from .verdict import Result, Verdict

DEFAULT_REPORT_DIR = "reports"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """Bad usage: one line, exit 2 (argparse's own behaviour, minus the usage block)."""
        self.exit(EXIT_USAGE, f"ddp-conformance: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ddp-conformance", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run the catalog against one or more candidates")
    run.add_argument("--candidate", action="append", metavar="SPEC",
                     help="built-in name (torch, reference) or package.module:attr; repeatable "
                          "(default: torch)")
    run.add_argument("--backend", default="gloo", help="gloo (default) or nccl")
    run.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    run.add_argument("--world-size", type=int, default=2, metavar="N", help="ranks (default 2)")
    run.add_argument("-k", dest="keyword", metavar="EXPR",
                     help="only cases whose id matches, as pytest -k reads it")
    run.add_argument("--timeout", type=float, default=60.0, metavar="S",
                     help="deadline per scenario in seconds (default 60)")
    run.add_argument("--pool", choices=("persistent", "fresh"), default="persistent",
                     help="reuse rank processes (default) or start new ones per scenario")
    run.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, metavar="DIR",
                     help="where results.jsonl, summary.md and junit.xml go (default reports/)")
    run.add_argument("--expectations", metavar="FILE",
                     help="known deviations: scenario-id patterns with reasons")
    run.add_argument("--repeat", type=int, default=1, metavar="N",
                     help="run everything N times; report flaky cases and rank memory growth")
    run.add_argument("--strict-profile", action="store_true",
                     help="hold every candidate to torch's bucket layout (trace.buckets)")
    run.add_argument("--no-trace", action="store_true",
                     help="plain process groups: no collective trace or trace checks")
    sub.add_parser("list", help="list the catalog with what each scenario needs")
    from .report.commands import add_subcommands  # report, bench

    add_subcommands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "list":
            return list_catalog(sys.stdout)
        if args.command in ("report", "bench"):
            return int(args.handler(args, sys.stdout))
        return run(args, sys.stdout)
    except UsageError as exc:
        print(f"ddp-conformance: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PoolError as exc:
        print(f"ddp-conformance: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ddp-conformance: interrupted", file=sys.stderr)
        return EXIT_FAILED


def list_catalog(out: TextIO) -> int:
    rows = [[s.id, s.model, ", ".join(sorted(s.needs)) or "-",
             " or ".join(map(str, s.world_sizes)) if s.world_sizes
             else f">= {s.min_world_size}" if s.min_world_size > 1 else "any", s.description]
            for s in load_catalog()]
    out.write(tabulate(rows, ["scenario", "model", "needs", "world size", "description"],
                       tablefmt="simple", maxcolwidths=[None, None, 30, None, 60]) + "\n")
    return EXIT_OK


def select_cases(scenarios: list[Scenario], candidates: list[str],
                 keyword: str | None) -> list[tuple[Scenario, str]]:
    matches = keyword_matcher(keyword)
    return [(s, c) for s in scenarios for c in candidates if matches(f"{s.id}[{c}]")]


def run(args: argparse.Namespace, out: TextIO) -> int:
    config = RunConfig(candidates=args.candidate or ["torch"], backend=args.backend,
                       device=args.device, world_size=args.world_size, timeout_s=args.timeout,
                       pool=args.pool, expectations=args.expectations,
                       strict_profile=args.strict_profile, trace=not args.no_trace)
    if config.timeout_s <= 0:
        raise UsageError(f"--timeout must be positive, got {config.timeout_s:g}")
    if args.repeat < 1:
        raise UsageError(f"--repeat must be at least 1, got {args.repeat}")
    from .torchrun import torchrun_pool

    pool = torchrun_pool(config)  # under torchrun: the leader's pool, or a follower's exit code
    if isinstance(pool, int):
        return pool
    with Runner(config, pool=pool) as runner:
        cases = select_cases(load_catalog(), config.candidates, args.keyword)
        if not cases:
            raise UsageError(f"no scenario matches -k {args.keyword!r}")
        info = run_info(runner.candidates.values(), config.backend, runner.device_kind,
                        config.world_size)
        writer = ResultsWriter(args.report_dir, info)
        out.write(f"ddp-conformance: {len(cases)} cases, {config.world_size} ranks, "
                  f"{config.backend}/{runner.device_kind}, pool {config.pool}, "
                  f"torch {info['torch']}\n")
        started = time.monotonic()
        if config.pool == "persistent":
            runner.pool.start()
            out.write(f"started {config.world_size} rank processes in "
                      f"{time.monotonic() - started:.1f}s\n")
        results: list[Result] = []
        stability = Stability(args.repeat)
        try:
            for repeat in range(args.repeat):
                if args.repeat > 1:
                    out.write(f"--- repeat {repeat + 1}/{args.repeat}\n")
                for i, (scenario, spec) in enumerate(cases, 1):
                    result = runner.run_case(scenario, spec)
                    result.repeat = repeat
                    results.append(result)
                    stability.add(result)
                    writer.add(result)
                    out.write(progress_line(i, len(cases), result) + "\n")
                    out.flush()
                if args.repeat > 1 and isinstance(runner.pool, RankPool):
                    try:
                        stability.add_memory(dict(enumerate(
                            runner.pool.call("ddp_conformance.stability:rank_memory"))))
                    except RuntimeError as exc:  # a probe, not a case: say so and go on
                        first = str(exc).strip().splitlines()[-1][:200]
                        out.write(f"warning: rank memory not measured after repeat "
                                  f"{repeat + 1}: {first}\n")
        finally:
            # Stale patterns are judged on a whole catalog only (-k leaves cases out).
            complete = len(results) >= len(cases) and not args.keyword
            notes = [f"expectation {e.pattern!r} ({e.path}:{e.line}) matched no case"
                     for e in runner.expectations.stale()] if complete else []
            notes += [f"{sid}: not compared with the reference DDP ({why})"
                      for sid, why in runner.reference_notes.items()]
            unstable = stability.flaky()
            grown = stability.growth()
            notes += [f"flaky: {case}: {what}" for case, what in unstable.items()]
            notes += [f"memory growth: rank {rank}: {what}" for rank, what in grown.items()]
            writer.close(notes)
    for note in notes:
        out.write(f"warning: {note}\n")
    if args.repeat > 1:
        out.write(f"stability over {args.repeat} repeats: {len(unstable)} flaky case(s); rank "
                  "memory, resident / peak MiB after each repeat:\n")
        out.write(tabulate(stability.memory_rows(),
                           ["repeat", *(f"rank {r}" for r in range(config.world_size))],
                           tablefmt="simple") + "\n")
    out.write(summary_table(results[-len(cases):]) + "\n")
    counts = count_verdicts(results)
    out.write(", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
              + f" in {time.monotonic() - started:.1f}s; reports in "
              f"{os.path.abspath(args.report_dir)}\n")
    unexpected = any(r.verdict.unexpected for r in results)
    return EXIT_FAILED if unexpected or unstable or grown else EXIT_OK


def progress_line(i: int, total: int, result: Result) -> str:
    width = len(str(total))
    line = f"[{i:>{width}}/{total}] {result.verdict.value:<7} {result.case_id} " \
           f"({result.duration_s:.2f}s)"
    if result.verdict is not Verdict.PASS:
        line += f"\n    {result.summary_line()}"
    return line


def summary_table(results: list[Result]) -> str:
    from .results import verdict_matrix

    header, rows = verdict_matrix(results)
    return tabulate(rows, header, tablefmt="simple")


if __name__ == "__main__":
    sys.exit(main())
