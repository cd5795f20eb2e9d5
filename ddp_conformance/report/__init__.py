"""The report set: ``summary.md``, ``junit.xml``, ``report.html`` from a run's
``results.jsonl`` (and the timing results ``bench.json``), and the regression comparison.

``write_report_set(directory)`` re-renders everything from the files, so that
``ddp-conformance report DIR`` gives the same files as the end of the run.
"""
from __future__ import annotations

import os
from typing import Any

from ddp_conformance.judge.verdict import Result

from .files import ReportFiles, make_dir
from .load import BENCH_FILE, RESULTS_FILE, RunData, load_bench, load_results

SUMMARY_FILE = "summary.md"
JUNIT_FILE = "junit.xml"
HTML_FILE = "report.html"

__all__ = ["BENCH_FILE", "HTML_FILE", "JUNIT_FILE", "RESULTS_FILE", "SUMMARY_FILE", "RunData",
           "load_bench", "load_results", "render", "write_report_set"]


def render(directory: str, info: dict[str, Any] | None, results: list[Result], notes: list[str],
           bench: dict[str, Any] | None = None, incomplete: str | None = None,
           coverage: dict[str, Any] | None = None, files: ReportFiles | None = None) -> list[str]:
    """Write the summaries of one run into ``directory``; return the paths written.

    ``incomplete``: why ``results`` are only the cases finished (an interrupted run);
    every file then says so at its top (JUnit: an ``incomplete`` property of the suite).
    ``coverage``: the ``--coverage`` summary (:mod:`.coverage`), a section of its own.
    Each file is written whole or not at all (:class:`.files.ReportFiles`, ``files``
    when the caller wants to follow or abandon the writing), the cheap ones first; a
    directory that cannot be written raises :class:`~ddp_conformance.errors.ReportDirError`.
    """
    from .html import render_html
    from .junit import write_junit
    from .markdown import markdown_summary

    files = files if files is not None else ReportFiles()
    make_dir(directory)
    written = []
    if info is not None or bench:
        path = os.path.join(directory, SUMMARY_FILE)
        files.write_text(path, lambda: markdown_summary(info or {}, results, notes, bench,
                                                        incomplete=incomplete, coverage=coverage))
        written.append(path)
    if info is not None:
        path = os.path.join(directory, JUNIT_FILE)
        with files.writing(path) as temp:
            write_junit(temp, results, incomplete=incomplete)
        written.append(path)
    path = os.path.join(directory, HTML_FILE)
    files.write_text(path, lambda: render_html(info, results, notes, bench, incomplete=incomplete,
                                               coverage=coverage))
    written.append(path)
    return written


def write_report_set(directory: str) -> list[str]:
    """Re-render the report set from ``DIR/results.jsonl`` and/or ``DIR/bench.json``."""
    from ddp_conformance.errors import UsageError

    from .coverage import load_coverage

    has_results = os.path.exists(os.path.join(directory, RESULTS_FILE))
    bench = load_bench(directory)
    if not has_results and bench is None:
        raise UsageError(f"{directory!r} holds neither {RESULTS_FILE} nor {BENCH_FILE}")
    run = load_results(directory) if has_results else None
    return render(directory, run.info if run else None, run.results if run else [],
                  run.notes if run else [], bench, run.incomplete if run else None,
                  coverage=load_coverage(directory) if run else None)
