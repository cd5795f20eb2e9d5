"""Results as they arrive, and the end-of-run report set.

``results.jsonl`` is written line by line, each line whole in one unbuffered write, so
nothing is lost if the run dies: the first line is the run information (with the git state of this
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
from typing import Any

import torch

from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.errors import ReportDirError
from ddp_conformance.judge.verdict import Result
from ddp_conformance.report import RESULTS_FILE, render
from ddp_conformance.report.common import count_verdicts
from ddp_conformance.report.compact import record
from ddp_conformance.report.coverage import load_coverage
from ddp_conformance.report.files import ReportFiles, make_dir, write_failed
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
    """Streams results to ``DIR/results.jsonl``; renders the report set on :meth:`close`.

    Each record is one line written whole (unbuffered, one ``write`` per line, repeated
    only if the system writes part of it): a run that dies leaves whole lines, and at
    most its last line cut. A write that fails (a full or read-only disk) cuts the file
    back to its last whole line, where the file system allows it, and raises
    :class:`~ddp_conformance.errors.ReportDirError` (exit 2, one line); the writer is
    then :attr:`failed`: :meth:`close` writes nothing more.
    """

    def __init__(self, directory: str, info: dict[str, Any],
                 files: ReportFiles | None = None, render_set: bool = True) -> None:
        """``render_set=False``: :meth:`close` writes the end line only (a part of a run
        whose report set another process renders: pytest-xdist's workers)."""
        make_dir(directory)
        self.render_set = render_set
        self.directory = directory
        self.info = info
        self.results: list[Result] = []
        #: The report set's files as they are written (whole or not at all).
        self.files = files if files is not None else ReportFiles()
        #: The error that stopped the writing, if one did.
        self.failed: ReportDirError | None = None
        self.path = os.path.join(directory, RESULTS_FILE)
        try:
            self._stream = open(self.path, "wb", buffering=0)
        except OSError as exc:
            raise write_failed(self.path, exc) from None
        self._size = 0  # bytes of whole lines written
        self._write(info)

    def _write(self, obj: dict[str, Any]) -> None:
        if self.failed is not None:
            raise self.failed
        line = (json.dumps(obj, default=str) + "\n").encode("utf-8")
        try:
            view = memoryview(line)
            while view:
                view = view[self._stream.write(view) or 0:]
        except OSError as exc:
            kept = len(self.results) - 1 if obj.get("type") == "result" else len(self.results)
            self.failed = ReportDirError(
                f"{write_failed(self.path, exc)}; it keeps {kept} whole case"
                f"{'' if kept == 1 else 's'}; no other report written")
            self._cut_back()
            raise self.failed from None
        self._size += len(line)

    def _cut_back(self) -> None:
        """After a failed write: the file back to its last whole line (a read-only file
        system may refuse; the reader then drops the cut line, :func:`.load.load_results`)."""
        try:
            os.ftruncate(self._stream.fileno(), self._size)
        except OSError:
            pass  # the reader copes with one cut last line

    def add(self, result: Result) -> None:
        self.results.append(result)
        self._write({"type": "result", **record(result)})

    def close(self, notes: list[str] | None = None, incomplete: str | None = None) -> None:
        """Write the end line and render the report set; ``incomplete``: why the run holds
        only the cases finished so far (e.g. "interrupted by SIGTERM after 12 of 128
        cases"), None for a complete run. After a failed write, only close the file."""
        try:
            if self.failed is not None:
                return
            from ddp_conformance.judge.diagnose.findings import diagnose

            for diagnosis in diagnose(self.results):  # one record per candidate, cases first
                self._write(diagnosis.to_json())
            end: dict[str, Any] = {"type": "end", "counts": dict(count_verdicts(self.results)),
                                   "notes": notes or []}
            if incomplete is not None:
                end["incomplete"] = incomplete
            self._write(end)
        finally:
            self._stream.close()
        if not self.render_set:
            return
        # Timing results already in the directory (ddp-conformance bench) stay in the report.
        render(self.directory, self.info, self.results, notes or [], load_bench(self.directory),
               incomplete=incomplete, coverage=load_coverage(self.directory), files=self.files)
