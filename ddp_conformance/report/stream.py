"""Results as they arrive, and the end-of-run report set.

``results.jsonl`` is written line by line and flushed after every case, so nothing is lost
if the run dies: the first line is the run information (with the git state of this
project and of each candidate's package), each further line one case with its verdict,
failures and per-step per-parameter error figures, the last line the counts and notes
(and ``incomplete``: why, when the run was interrupted; a file without its end line is
read back as incomplete too).
At the end the report set is rendered from it (:mod:`ddp_conformance.report`):
``summary.md``, ``junit.xml`` and the self-contained ``report.html``;
``ddp-conformance report DIR`` renders them again from the files.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import sys
from collections.abc import Iterable
from typing import IO, Any

import torch

from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.judge.verdict import Result
from ddp_conformance.report import RESULTS_FILE, render
from ddp_conformance.report.common import count_verdicts
from ddp_conformance.report.coverage import load_coverage
from ddp_conformance.report.gitstate import candidate_git_state, project_git_state
from ddp_conformance.report.load import load_bench


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
        "project_git": project_git_state(),
        "candidates": [{"name": c.name, "version": c.version, "description": c.description,
                        "git": candidate_git_state(c.name)} for c in candidates],
        "argv": argv if argv is not None else sys.argv,
    }


class ResultsWriter:
    """Streams results to ``DIR/results.jsonl``; renders the report set on :meth:`close`."""

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

    def close(self, notes: list[str] | None = None, incomplete: str | None = None) -> None:
        """Write the end line and render the report set; ``incomplete``: why the run holds
        only the cases finished so far (e.g. "interrupted by SIGTERM after 12 of 128
        cases"), None for a complete run."""
        end: dict[str, Any] = {"type": "end", "counts": dict(count_verdicts(self.results)),
                               "notes": notes or []}
        if incomplete is not None:
            end["incomplete"] = incomplete
        self._write(end)
        self._stream.close()
        # Timing results already in the directory (ddp-conformance bench) stay in the report.
        render(self.directory, self.info, self.results, notes or [], load_bench(self.directory),
               incomplete=incomplete, coverage=load_coverage(self.directory))
