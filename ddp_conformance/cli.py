"""``ddp-conformance``: run the catalog against candidates, list it, report, time.

Exit codes (docs/CONTRACT.md, "Verdicts and exit codes"): 0 when nothing failed
unexpectedly, 1 when something did, 2 on a usage or environment error, said in one line
on stderr (a report directory that cannot be written, checked before the first case, or
one that fills or turns read-only mid-run).
A run interrupted by SIGTERM exits 143, by SIGINT 1: it ends every rank at once, writes
summary.md, junit.xml and report.html of the cases finished so far, marked incomplete,
and says so in one line on stderr, within 30 s of the signal (:mod:`.deadline`).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time
from typing import TYPE_CHECKING, TextIO

from tabulate import tabulate

from ddp_conformance.bench.command import add_parser as add_bench_parser
from ddp_conformance.deadline import CLOSE_DEADLINE_S
from ddp_conformance.errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    BackendInsane,
    Interrupted,
    PoolError,
    UsageError,
)
from ddp_conformance.interruption import RUN_SIGNALS, RunGuard
from ddp_conformance.judge.diagnose.findings import diagnose
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.options import (
    CLI,
    add_to_argparse,
    check_options,
    one_candidate,
    run_config,
)
from ddp_conformance.report.command import add_parser as add_report_parser
from ddp_conformance.report.common import verdict_matrix
from ddp_conformance.report.diagnosis import closing_line, opening_lines

if TYPE_CHECKING:
    # torch is imported once a command runs, never for --help or a usage error
    # (tests/test_cli.py::test_the_parser_does_not_import_torch); fuzz imports hypothesis.
    from ddp_conformance.config import RunConfig
    from ddp_conformance.fuzz import Finding, FuzzRun
    from ddp_conformance.ranks.coverage_hook import ParentCoverage
    from ddp_conformance.session import Case, Session

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """Bad usage: one line, exit 2 (argparse's own behaviour, minus the usage block)."""
        self.exit(EXIT_USAGE, f"ddp-conformance: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand and its options (:mod:`ddp_conformance.options`); imports no torch."""
    parser = _Parser(prog="ddp-conformance", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run_parser = sub.add_parser("run", help="run the catalog against one or more candidates")
    add_to_argparse(run_parser)
    run_parser.set_defaults(handler=run)
    listing = sub.add_parser("list", help="list the catalog with what each scenario needs")
    add_to_argparse(listing, "list")
    listing.add_argument("--history", action="store_true",
                         help="list torch's DDP bug history instead: each bug, the scenarios "
                              "that guard it or why none can")
    listing.add_argument("--markdown", action="store_true",
                         help="with --history: write it as the Markdown page "
                              "docs/bug-history.md")
    listing.set_defaults(handler=list_command)
    fuzzing = sub.add_parser("fuzz", help="generated scenarios against one candidate, judged where "
                                       "torch's DDP passes them; failures shrunk")
    add_to_argparse(fuzzing, "fuzz")
    fuzzing.add_argument("--budget", default="5m", metavar="TIME",
                      help="how long to generate scenarios: 90s, 5m, 1h (default 5m)")
    fuzzing.add_argument("--max-scenarios", type=int, default=None, metavar="N",
                      help="generate at most N scenarios (with --budget, whichever ends "
                           "first): the same search on any machine")
    fuzzing.add_argument("--shrink-budget", default="2m", metavar="TIME",
                      help="how long to shrink a failure (default 2m)")
    fuzzing.add_argument("--seed", type=int, default=0, metavar="N",
                      help="the same seed generates the same scenarios (default 0)")
    fuzzing.add_argument("--keep-going", action="store_true",
                      help="after a finding, shrink it and go on looking for others until the "
                           "budget is spent (default: stop at the first finding, shrunk)")
    fuzzing.set_defaults(handler=fuzz)
    script = sub.add_parser("repro", help="write a standalone script (torch and the candidate "
                                         "only, run with torchrun) that reproduces a case")
    script.add_argument("case", metavar="CASE",
                       help="a catalog scenario id, or a Scenario(...) literal as fuzz prints it")
    add_to_argparse(script, "repro")
    script.add_argument("--out", metavar="DIR",
                       help="where the script goes (default: REPORT_DIR/repro)")
    script.set_defaults(handler=repro)
    add_report_parser(sub)
    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args, sys.stdout))
    except (UsageError, PoolError) as exc:
        print(f"ddp-conformance: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BackendInsane as exc:  # the backend's sanity check, before any case: exit 1
        print(f"ddp-conformance: {exc}", file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:  # outside a run's handlers: nothing to write
        print(f"ddp-conformance: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # before the run caught SIGINT: no rank started yet
        print("ddp-conformance: interrupted", file=sys.stderr)
        return EXIT_FAILED


def list_command(args: argparse.Namespace, out: TextIO) -> int:
    """``list``: the catalog (``-k``: the scenarios whose id matches), lines of at most
    :data:`~ddp_conformance.catalog.listing.WIDTH` characters; ``--pairs``: their pair
    coverage instead (:func:`~ddp_conformance.catalog.pairs.coverage_text`)."""
    from ddp_conformance.catalog.listing import catalog_table
    from ddp_conformance.catalog.loader import keyword_matcher, load_catalog

    if args.history or args.markdown:
        return history_command(args, out)
    matches = keyword_matcher(args.ddp_keyword)
    scenarios = [s for s in load_catalog() if matches(s.id)]
    if not scenarios:
        raise UsageError(f"no scenario matches -k {args.ddp_keyword!r}")
    if args.ddp_pairs:
        from ddp_conformance.catalog.pairs import coverage_text

        out.write(coverage_text(scenarios) + "\n")
        return EXIT_OK
    out.write(catalog_table(scenarios) + "\n")
    return EXIT_OK


def history_command(args: argparse.Namespace, out: TextIO) -> int:
    """``list --history`` (``--markdown``: the page ``docs/bug-history.md``); ``-k`` keeps
    the bugs whose ref, title or scenarios match."""
    from ddp_conformance.catalog.history import HISTORY
    from ddp_conformance.catalog.history_text import history_markdown, history_table
    from ddp_conformance.catalog.loader import keyword_matcher

    if args.markdown and not args.history:
        raise UsageError("--markdown goes with --history (the bug history page)")
    matches = keyword_matcher(args.ddp_keyword)
    bugs = [b for b in HISTORY if matches(" ".join((b.ref, b.title, *b.scenarios)))]
    if not bugs:
        raise UsageError(f"no bug matches -k {args.ddp_keyword!r}")
    out.write(history_markdown(bugs) if args.markdown else history_table(bugs) + "\n")
    return EXIT_OK


def repro(args: argparse.Namespace, out: TextIO) -> int:
    """``repro``: write the script; print its path and how to run it."""
    check_options(lambda dest: getattr(args, dest), "repro")
    candidate = one_candidate(args.ddp_candidate, "repro")
    from ddp_conformance.report.files import check_writable
    from ddp_conformance.repro import failed_checks, parse_case, write_file, write_script

    directory = args.out or os.path.join(args.ddp_report_dir, "repro")
    scenario = parse_case(args.case)
    failed = failed_checks(args.ddp_report_dir, scenario.id, candidate)
    script = write_script(scenario, candidate, args.ddp_world_size, failed)
    check_writable(directory)
    path = write_file(script, scenario, directory)
    out.write(f"{path}\nrun: torchrun --standalone --nproc-per-node {args.ddp_world_size} "
              f"{path}   (--ddp torch: the same with torch's DDP)\n")
    return EXIT_OK


def fuzz(args: argparse.Namespace, out: TextIO) -> int:
    """``fuzz``: exit 1 when a torch-valid scenario fails the candidate, else 0. Every
    value is checked, and the report directory written to, before the first scenario."""
    check_options(lambda dest: getattr(args, dest), "fuzz")
    candidate = one_candidate(args.ddp_candidate, "fuzz")
    from ddp_conformance.config import RunConfig
    from ddp_conformance.fuzz import (
        Fuzzer,
        keep_hypothesis_files_in,
        parse_duration,
        parse_world_sizes,
    )
    from ddp_conformance.report.files import check_writable
    from ddp_conformance.session import Session

    budget, shrink = parse_duration(args.budget), parse_duration(args.shrink_budget)
    sizes = parse_world_sizes(str(args.ddp_world_size))
    check_writable(os.path.join(args.ddp_report_dir, "repro"))
    keep_hypothesis_files_in(args.ddp_report_dir)
    with contextlib.ExitStack() as stack:
        sessions = {}
        for size in sizes:
            config = RunConfig(candidates=list(dict.fromkeys(["torch", candidate])),
                               backend=args.ddp_backend, device=args.ddp_device,
                               world_size=size, timeout_s=args.ddp_timeout,
                               allow_oversubscribe=args.ddp_allow_oversubscribe)
            sessions[size] = stack.enter_context(Session(config))
            sessions[size].start()

        def progress(line: str) -> None:
            out.write(line + "\n")
            out.flush()

        result = Fuzzer(sessions, candidate, budget, args.seed, shrink, args.keep_going,
                        progress=progress, max_scenarios=args.max_scenarios).run()
    write_fuzz_summary(out, result, sizes, args.ddp_report_dir)
    for finding in result.findings:
        write_finding(out, finding, candidate, args.ddp_report_dir)
    return EXIT_FAILED if result.findings else EXIT_OK


def write_fuzz_summary(out: TextIO, result: FuzzRun, sizes: tuple[int, ...],
                       report_dir: str) -> None:
    """The fuzz run's counts, and one short line per verdict torch gave the scenarios set
    aside (their scenarios and torch's words in ``report_dir``/fuzz-set-aside.txt)."""
    from ddp_conformance.fuzz import write_set_aside

    aside = sum(result.set_aside.values())
    ranks = (f"{sizes[0]} ranks" if len(sizes) == 1 else "world sizes " + ", ".join(
        f"{n} ({result.ran_by_world_size[n]} scenarios)" for n in sizes))
    out.write(f"fuzz {result.candidate}, seed {result.seed}, {ranks}: {result.ran} "
              f"scenarios in {result.seconds:.0f}s ({result.cases_per_second:.2f}/s); "
              f"{result.passed} passed, {result.not_applicable} N/A, {aside} set aside, "
              f"{len(result.findings)} failing\n")
    if result.set_aside:
        counts = ", ".join(f"{verdict} on {count}" for verdict, count
                           in sorted(result.set_aside.items()))
        out.write(f"set aside (failing, and torch's DDP does not pass them either): {counts}\n"
                  f"  details: {write_set_aside(result, report_dir)}\n")


def write_finding(out: TextIO, finding: Finding, candidate: str, report_dir: str) -> None:
    """One fuzz finding: as found, as shrunk, and its reproducer (in ``report_dir``/repro)."""
    out.write(f"FAILING at {finding.world_size} ranks: {finding.id}[{candidate}]: "
              f"{finding.found.verdict.value}: "
              f"{finding.found.summary_line()}\n")
    out.write(f"shrunk in {finding.shrink_runs} runs to ({finding.shrunk_result.verdict.value}: "
              f"{finding.shrunk_result.summary_line()}):\n    {finding.literal()}\n")
    out.write(f"reproducer: {reproducer(finding, candidate, report_dir)}\n")


def reproducer(finding: Finding, candidate: str, report_dir: str) -> str:
    """Write the standalone reproducer of a fuzz finding; its path (or why there is none)."""
    from ddp_conformance.repro import write_file, write_script

    try:
        script = write_script(finding.scenario, candidate, finding.world_size,
                              [f.check for f in finding.shrunk_result.failures])
        path = write_file(script, finding.scenario, os.path.join(report_dir, "repro"))
    except UsageError as exc:
        return f"none ({exc})"
    return f"{path} (torchrun --standalone --nproc-per-node {finding.world_size} {path})"


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``run``: the catalog against the candidates; reports streamed to ``--report-dir``."""
    config = run_config(lambda dest: getattr(args, dest), CLI)
    from ddp_conformance.ranks.torchrun import torchrun_pool
    from ddp_conformance.session import Session

    follower_coverage = _torchrun_coverage(config, args.ddp_report_dir)
    pool = torchrun_pool(config)  # under torchrun: the leader's pool, or a follower's exit code
    if isinstance(pool, int):
        if follower_coverage is not None:
            follower_coverage.stop()  # saved for the leader to combine
        return pool
    session = Session(config, pool=pool, repeats=args.ddp_repeat)
    started, cases = time.monotonic(), []
    # SIGINT and SIGTERM until the reports are written; the first starts the close deadline.
    with RunGuard(session, RUN_SIGNALS, args.ddp_report_dir, CLOSE_DEADLINE_S) as guard:
        cases = session.select(args.ddp_keyword)
        session.planned = len(cases) * args.ddp_repeat
        info = session.open_reports(args.ddp_report_dir)
        out.write(f"ddp-conformance: {len(cases)} cases, {config.world_size} ranks, "
                  f"{session.runner.backend.name}/{session.runner.device_kind}, pool {config.pool}, "
                  f"torch {info['torch']}{comparison_clause(config, session)}\n")
        started = time.monotonic()
        if config.pool == "persistent":
            session.start()
            out.write(f"started {config.world_size} rank processes in "
                      f"{time.monotonic() - started:.1f}s\n")
        run_cases(session, cases, args.ddp_repeat, out,
                  maxfail=1 if args.ddp_exitfirst else args.ddp_maxfail)
        if session.writer is not None:  # the reports are written as the block ends
            out.write(f"writing reports to {os.path.abspath(args.ddp_report_dir)} ...\n")
            out.flush()
    ending = guard.ending()
    if ending is not None:  # a signal ended the run, or came while its reports were written
        print(ending[0], file=sys.stderr)
        return ending[1]
    return conclude_run(session, guard.notes, len(cases), started, args, out)


def run_cases(session: Session, cases: list[Case], repeats: int, out: TextIO,
              maxfail: int | None = None) -> None:
    """Every case ``repeats`` times, with a progress line each (and the ranks' memory
    after each repeat, when there are several); with ``maxfail``, stop once that many
    verdicts were unexpected, the run marked incomplete with how many cases were not run."""
    done = 0
    for repeat in range(repeats):
        if repeats > 1:
            out.write(f"--- repeat {repeat + 1}/{repeats}\n")
        for i, (scenario, spec) in enumerate(cases, 1):
            session.run_case(scenario, spec, repeat,
                             on_result=functools.partial(write_progress, out, i, len(cases)))
            done += 1
            failed = sum(r.verdict.unexpected for r in session.results)
            if maxfail is not None and failed >= maxfail:
                left = len(cases) * repeats - done
                session.incomplete = (f"stopped after {failed} unexpected verdict"
                                      f"{'' if failed == 1 else 's'} (--maxfail {maxfail}): "
                                      f"{left} of {len(cases) * repeats} cases not run")
                return
        if repeats > 1:
            session.probe_memory(repeat)


def conclude_run(session: Session, notes: list[str], planned: int, started: float,
                 args: argparse.Namespace, out: TextIO) -> int:
    """The end of a run that was not interrupted, in the reports' reading order: the
    diagnosis (and by cause, by check, N/A grouped), the notes, stability, the verdict
    matrix of the last repeat, the counts; exit 1 if anything failed unexpectedly, else 0."""
    repeats = args.ddp_repeat
    last = session.results[-planned:]
    diagnoses = diagnose(last)
    out.write("".join(f"{line}\n" for line in opening_lines(last, diagnoses)))
    for note in notes:
        out.write(f"warning: {note}\n")
    if repeats > 1:
        out.write(f"stability over {repeats} repeats: {len(session.stability.flaky())} flaky "
                  "case(s); rank memory, resident / peak MiB after each repeat:\n")
        out.write(tabulate(session.stability.memory_rows(),
                           ["repeat", *(f"rank {r}" for r in range(session.config.world_size))],
                           tablefmt="simple") + "\n")
    out.write(summary_table(last) + "\n")
    out.write(closing_line(session.results, diagnoses,
                           f" in {time.monotonic() - started:.1f}s; reports in "
                           f"{os.path.abspath(args.ddp_report_dir)}") + "\n")
    if session.incomplete is not None:  # --maxfail: the run stopped early
        out.write(f"ddp-conformance: {session.incomplete}\n")
    return EXIT_FAILED if session.failed() else EXIT_OK


def _torchrun_coverage(config: RunConfig, report_dir: str) -> ParentCoverage | None:
    """Under torchrun with ``--coverage``: every process measures from before its first
    job (the leader's :class:`Session` takes this measurement over and combines)."""
    from ddp_conformance.ranks.torchrun import detect

    if not config.coverage or detect() is None:
        return None
    from ddp_conformance.ranks.coverage_hook import ParentCoverage, setup_for

    coverage = ParentCoverage(setup_for(config.coverage, report_dir))
    coverage.start()
    return coverage


def comparison_clause(config: RunConfig, session: Session) -> str:
    """The header line's word on ``--compare-backend``: every scenario runs twice, so the
    header says so, and says when that is the default rather than asked for."""
    comparison = session.runner.comparison
    if comparison is None:
        return ""
    name = comparison.backend.name
    if config.compare_backend == "auto":
        return (f", every scenario also on {name} for comparison (--compare-backend default "
                f"for a custom backend; --compare-backend none skips it)")
    return f", every scenario also on {name} for comparison (--compare-backend {name})"


def write_progress(out: TextIO, i: int, total: int, result: Result) -> None:
    out.write(progress_line(i, total, result) + "\n")
    out.flush()


def progress_line(i: int, total: int, result: Result) -> str:
    width = len(str(total))
    line = f"[{i:>{width}}/{total}] {result.verdict.value:<7} {result.case_id} " \
           f"({result.duration_s:.2f}s)"
    if result.verdict is not Verdict.PASS:
        line += "".join(f"\n    {text}" for text in result.explanation_lines())
    return line


def summary_table(results: list[Result]) -> str:
    header, rows = verdict_matrix(results)
    return tabulate(rows, header, tablefmt="simple")


if __name__ == "__main__":
    sys.exit(main())
