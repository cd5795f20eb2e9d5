"""The coverage section of the reports: per file of the ``--coverage`` targets, statement
and branch coverage and the functions the run never entered.

:func:`combine_and_summarise` runs once at the end of a run, after every rank has exited:
it combines the data files of the parent and of every rank (coverage.py's ``combine``),
writes coverage.py's own JSON report (``coverage/coverage.json``, for tools) and the
summary the report set renders (``coverage/summary.json``), so ``ddp-conformance report
DIR`` renders the section again. A function is *never entered* when none of its
statements ran (coverage.py's per-function figures; nested functions count on their own).
"""
from __future__ import annotations

import json
import os
from typing import Any

from ddp_conformance.ranks.coverage_hook import DATA_DIR, CoverageSetup

from .files import ReportFiles

SUMMARY_FILE = os.path.join(DATA_DIR, "summary.json")
JSON_REPORT = os.path.join(DATA_DIR, "coverage.json")


def combine_and_summarise(setup: CoverageSetup, report_dir: str) -> dict[str, Any]:
    """Combine every process's data, write the JSON report and the summary; the summary."""
    import coverage

    data_dir = os.path.dirname(setup.data_file)
    parts = [n for n in os.listdir(data_dir) if n.startswith(".coverage.")] \
        if os.path.isdir(data_dir) else []
    cov = coverage.Coverage(data_file=setup.data_file, branch=True,
                            include=list(setup.files), config_file=False)
    if parts:
        cov.combine([data_dir], keep=False)
        cov.save()
    else:
        cov.get_data()  # an empty data file: every file then shows as never run
    raw = os.path.join(report_dir, JSON_REPORT)
    cov.json_report(morfs=list(setup.files), outfile=raw, ignore_errors=True)
    with open(raw, encoding="utf-8") as f:
        data = json.load(f)
    summary = summarise(data, setup.targets, len(parts))
    ReportFiles().write_text(os.path.join(report_dir, SUMMARY_FILE),
                             lambda: json.dumps(summary, indent=1))
    return summary


def summarise(report: dict[str, Any], targets: tuple[str, ...], processes: int) -> dict[str, Any]:
    """The summary of coverage.py's JSON report: one row per file, with its functions
    never entered."""
    files = []
    for path, entry in sorted(report.get("files", {}).items()):
        s = entry["summary"]
        never = sorted(name for name, fn in entry.get("functions", {}).items()
                       if name and fn["summary"]["num_statements"] > 0
                       and fn["summary"]["covered_lines"] == 0)
        files.append({"file": path, "statements": s["num_statements"],
                      "covered": s["covered_lines"], "branches": s.get("num_branches", 0),
                      "covered_branches": s.get("covered_branches", 0),
                      "missing_lines": entry.get("missing_lines", []),
                      "never_entered": never})
    return {"targets": list(targets), "processes": processes, "files": files}


def totals(summary: dict[str, Any]) -> tuple[int, int, int, int]:
    """(statements, covered, branches, covered branches) over every file."""
    rows = summary["files"]
    return (sum(r["statements"] for r in rows), sum(r["covered"] for r in rows),
            sum(r["branches"] for r in rows), sum(r["covered_branches"] for r in rows))


def percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def short_path(path: str) -> str:
    """A path as a reader recognises it: from its ``site-packages`` on, else as given."""
    marker = f"site-packages{os.sep}"
    return path.split(marker, 1)[1] if marker in path else os.path.relpath(path) \
        if not os.path.relpath(path).startswith("..") else path


def rows(summary: dict[str, Any]) -> list[list[str]]:
    """One row per file: file, statements, covered, statement %, branches, branch %,
    functions never entered."""
    out = []
    for r in summary["files"]:
        out.append([short_path(r["file"]), str(r["statements"]), str(r["covered"]),
                    percent(r["covered"], r["statements"]), str(r["branches"]),
                    percent(r["covered_branches"], r["branches"]),
                    ", ".join(r["never_entered"]) or "-"])
    return out


HEADER = ["file", "statements", "run", "statements %", "branches", "branches %",
          "functions never entered"]


def intro(summary: dict[str, Any]) -> str:
    st, cov, br, cbr = totals(summary)
    return (f"Targets {', '.join(summary['targets'])}: {cov} of {st} statements run "
            f"({percent(cov, st)}), {cbr} of {br} branches ({percent(cbr, br)}), combined "
            f"from {summary['processes']} process data files (the parent and every rank; a "
            "rank killed outright after a TIMEOUT or CRASH loses its data).")


def load_coverage(directory: str) -> dict[str, Any] | None:
    """The coverage summary in a report directory, or None."""
    path = os.path.join(directory, SUMMARY_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def discard_stale(directory: str) -> None:
    """Remove an earlier run's summary from ``directory`` (a run without ``--coverage``
    must not render it)."""
    path = os.path.join(directory, SUMMARY_FILE)
    if os.path.exists(path):
        os.remove(path)
