"""Results as they arrive, and the end-of-run summary files.

``results.jsonl`` is written line by line and flushed after every case, so nothing is lost
if the run dies: the first line is the run information, each further line one case with
its verdict, failures and per-step per-parameter error figures. At the end come
``summary.md`` (Markdown tables) and ``junit.xml`` for CI.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable
from typing import IO, Any

import torch
from tabulate import tabulate

from .candidate import Candidate
from .verdict import Result, Verdict

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.md"
JUNIT_FILE = "junit.xml"


def run_info(candidates: Iterable[Candidate], backend: str, device: str, world_size: int,
             argv: list[str] | None = None) -> dict[str, Any]:
    """What a reader needs to trust or reproduce the run."""
    return {
        "type": "run",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "backend": backend,
        "device": device,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if device == "cuda" else ["cpu"],
        "world_size": world_size,
        "candidates": [{"name": c.name, "version": c.version, "description": c.description}
                       for c in candidates],
        "argv": argv if argv is not None else sys.argv,
    }


class ResultsWriter:
    """Streams results to ``DIR/results.jsonl``; writes the summaries on :meth:`close`."""

    def __init__(self, directory: str, info: dict[str, Any]) -> None:
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.info = info
        self.results: list[Result] = []
        self._stream: IO[str] = open(os.path.join(directory, RESULTS_FILE), "w", encoding="utf-8")
        self._write(info)

    def _write(self, obj: dict[str, Any]) -> None:
        self._stream.write(json.dumps(obj, default=str) + "\n")
        self._stream.flush()

    def add(self, result: Result) -> None:
        self.results.append(result)
        self._write({"type": "result", **result.to_json()})

    def close(self, notes: list[str] | None = None) -> None:
        self._write({"type": "end", "counts": dict(count_verdicts(self.results)),
                     "notes": notes or []})
        self._stream.close()
        with open(os.path.join(self.directory, SUMMARY_FILE), "w", encoding="utf-8") as f:
            f.write(markdown_summary(self.info, self.results, notes or []))
        write_junit(os.path.join(self.directory, JUNIT_FILE), self.results)


def count_verdicts(results: Iterable[Result]) -> Counter[str]:
    return Counter(r.verdict.value for r in results)


def verdict_matrix(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """Scenario x candidate table of verdicts."""
    candidates = list(dict.fromkeys(r.candidate for r in results))
    scenarios = list(dict.fromkeys(r.scenario for r in results))
    cell = {(r.scenario, r.candidate): r.verdict.value for r in results}
    rows = [[s, *(cell.get((s, c), "") for c in candidates)] for s in scenarios]
    return ["scenario", *candidates], rows


def markdown_summary(info: dict[str, Any], results: list[Result], notes: list[str]) -> str:
    counts = count_verdicts(results)
    lines = ["# ddp-conformance summary", ""]
    lines += [f"torch {info['torch']}, backend {info['backend']}, device {info['device']}, "
              f"world size {info['world_size']}, {info['cpu_count']} CPUs, started "
              f"{info['started']}", ""]
    lines += ["Verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), ""]
    header, rows = verdict_matrix(results)
    lines += [tabulate(rows, header, tablefmt="github"), ""]
    bad = [r for r in results if r.verdict is not Verdict.PASS]
    if bad:
        lines += ["## Not passed", ""]
        for r in bad:
            lines.append(f"- **{r.verdict.value}** `{r.case_id}`: {r.summary_line()}")
            if r.expectation:
                lines.append(f"  - expected: {r.expectation}")
            for failure in r.failures[1:5]:
                lines.append(f"  - {failure.message}")
        lines.append("")
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def write_junit(path: str, results: list[Result]) -> None:
    counts = count_verdicts(results)
    suite = ET.Element("testsuite", name="ddp-conformance", tests=str(len(results)),
                       failures=str(counts["FAIL"]),
                       errors=str(counts["ERROR"] + counts["TIMEOUT"] + counts["CRASH"]),
                       skipped=str(counts["N/A"] + counts["XFAIL"]),
                       time=f"{sum(r.duration_s for r in results):.3f}")
    for r in results:
        case = ET.SubElement(suite, "testcase", classname=r.scenario.split("/")[0],
                             name=r.case_id, time=f"{r.duration_s:.3f}")
        detail = "\n".join([f.message for f in r.failures]
                           + [f"rank {k}:\n{v}" for k, v in sorted(r.tracebacks.items())]
                           + [f"rank {k} stack:\n{v}" for k, v in sorted(r.stacks.items())])
        if r.verdict is Verdict.FAIL:
            ET.SubElement(case, "failure", message=r.summary_line(), type="FAIL").text = detail
        elif r.verdict in (Verdict.ERROR, Verdict.TIMEOUT, Verdict.CRASH):
            ET.SubElement(case, "error", message=r.summary_line(), type=r.verdict.value).text = detail
        elif r.verdict in (Verdict.NA, Verdict.XFAIL):
            ET.SubElement(case, "skipped", message=f"{r.verdict.value}: {r.summary_line()}"
                          + (f" ({r.expectation})" if r.expectation else ""))
        elif r.verdict is Verdict.XPASS:
            ET.SubElement(case, "system-out").text = f"XPASS: expected to fail ({r.expectation})"
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)
