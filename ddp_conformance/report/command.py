"""``ddp-conformance report``: re-render a run's report set, or compare two runs."""
from __future__ import annotations

import argparse
import os
from typing import Any, TextIO

from ddp_conformance.errors import EXIT_FAILED, EXIT_OK, UsageError


def add_parser(sub: Any) -> None:
    report = sub.add_parser("report", help="re-render the report set of a run, or compare two runs")
    report.add_argument("results_dir", nargs="?", metavar="RESULTS_DIR",
                        help="directory holding results.jsonl and/or bench.json")
    report.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"),
                        help="print changed verdicts and significant timing changes; exit 1 when "
                             "a verdict regressed or a timing got significantly slower")
    report.set_defaults(handler=report_command)


def report_command(args: argparse.Namespace, out: TextIO) -> int:
    from ddp_conformance.report import write_report_set
    from ddp_conformance.report.compare import compare_dirs, format_comparison

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
