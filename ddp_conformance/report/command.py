"""``ddp-conformance report``: re-render a run's report set, or compare two runs."""
from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from ddp_conformance.errors import EXIT_FAILED, EXIT_OK, UsageError
from ddp_conformance.options import add_to_argparse, check_options, default_of


def add_parser(sub: Any) -> None:
    """``report``'s options: RESULTS_DIR (or ``--report-dir``, the table's row), ``--compare``."""
    report = sub.add_parser("report", help="re-render the report set of a run, or compare two runs")
    report.add_argument("results_dir", nargs="?", metavar="RESULTS_DIR",
                        help="directory holding results.jsonl and/or bench.json (default: "
                             "--report-dir)")
    add_to_argparse(report, "report")
    report.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"),
                        help="print changed verdicts and significant timing changes; exit 1 when "
                             "a verdict regressed or a timing got significantly slower")
    report.set_defaults(handler=report_command)


def report_command(args: argparse.Namespace, out: TextIO) -> int:
    """Compare two runs (exit 1 on a regression), or re-render RESULTS_DIR's report set
    (RESULTS_DIR, else ``--report-dir``, whose default is ``reports/``)."""
    check_options(lambda dest: getattr(args, dest), "report")
    from ddp_conformance.report import write_report_set
    from ddp_conformance.report.compare import compare_dirs, format_comparison

    if args.compare:
        if args.results_dir:
            raise UsageError("give either RESULTS_DIR or --compare OLD NEW, not both")
        comp = compare_dirs(*args.compare)
        out.write(format_comparison(comp) + "\n")
        return EXIT_FAILED if comp.failed else EXIT_OK
    if args.results_dir and args.ddp_report_dir not in (args.results_dir,
                                                        default_of("report-dir")):
        raise UsageError(f"give the run's directory once: RESULTS_DIR {args.results_dir!r} "
                         f"or --report-dir {args.ddp_report_dir!r}")
    directory = args.results_dir or args.ddp_report_dir
    if not os.path.isdir(directory):
        raise UsageError(f"{directory!r} is not a directory")
    for path in write_report_set(directory):
        out.write(f"wrote {path}\n")
    return EXIT_OK
