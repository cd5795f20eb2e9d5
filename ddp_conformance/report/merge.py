"""One report set from the parts of a run that several processes wrote.

pytest-xdist runs the catalog in several workers, each with its own session: with
``--ddp-report-dir DIR`` each worker streams its cases to ``DIR/.parts/<worker>/results.jsonl``
(no report set of its own), and the controller merges them here, at the end of the run,
into ``DIR/results.jsonl`` (the first part's run line, every case, the notes of all) and
renders the report set from it, as ``ddp-conformance report DIR`` would.
"""
from __future__ import annotations

import json
import os
import shutil

from ddp_conformance.report import RESULTS_FILE, write_report_set
from ddp_conformance.report.common import count_verdicts
from ddp_conformance.report.compact import record
from ddp_conformance.report.load import load_results

#: The subdirectory of the report directory holding the workers' parts.
PARTS = ".parts"


def part_dir(directory: str, worker: str) -> str:
    """Where ``worker`` (pytest-xdist's ``gw0``) streams its part of the run."""
    return os.path.join(directory, PARTS, worker)


def discard_parts(directory: str) -> None:
    """Remove the parts of an earlier run (before the workers start)."""
    shutil.rmtree(os.path.join(directory, PARTS), ignore_errors=True)


def merge_parts(directory: str) -> list[str]:
    """Merge the workers' parts into ``DIR/results.jsonl`` and render the report set;
    return the files written ([] when no worker ran a case)."""
    root = os.path.join(directory, PARTS)
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    runs = [load_results(os.path.join(root, n)) for n in names
            if os.path.exists(os.path.join(root, n, RESULTS_FILE))]
    if not runs:
        return []
    results = [r for run in runs for r in run.results]
    notes = list(dict.fromkeys(note for run in runs for note in run.notes))
    incomplete = next((run.incomplete for run in runs if run.incomplete), None)
    end: dict[str, object] = {"type": "end", "counts": dict(count_verdicts(results)),
                              "notes": notes}
    if incomplete:
        end["incomplete"] = incomplete
    lines = [runs[0].info, *({"type": "result", **record(r)} for r in results), end]
    with open(os.path.join(directory, RESULTS_FILE), "w", encoding="utf-8") as out:
        out.writelines(json.dumps(line, default=str) + "\n" for line in lines)
    written = write_report_set(directory)
    discard_parts(directory)
    return [os.path.join(directory, RESULTS_FILE), *written]
