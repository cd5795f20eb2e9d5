"""The deadline of an interrupted run: after SIGTERM or SIGINT, ``ddp-conformance run``
ends within :data:`CLOSE_DEADLINE_S` of the first signal, whatever it was doing.

:class:`CloseDeadline` is the watchdog the run's
:class:`~ddp_conformance.interruption.RunGuard` starts on the first signal (which then
interrupts the case, or lets the reports being written finish). The guard cancels it once
the ranks are ended and the reports written. Otherwise, at the deadline, the watchdog
abandons the report set (:meth:`ReportFiles.abandon
<ddp_conformance.report.files.ReportFiles.abandon>`: the file being written is removed,
nothing more is renamed into place, so every report file is whole or absent), says in
one line which files were written and which were not, and ends the process with the
signal's exit code (its ranks die with it: ``die_with_parent``).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING

from ddp_conformance.errors import Interrupted
from ddp_conformance.report import HTML_FILE, JUNIT_FILE, RESULTS_FILE, SUMMARY_FILE

if TYPE_CHECKING:
    from ddp_conformance.session import Session

#: After SIGTERM or SIGINT, how long ending the ranks and writing the reports may take
#: before the process exits without the reports not yet written (a further signal
#: meanwhile is ignored). The report set of a 100-FAIL run takes a few seconds.
CLOSE_DEADLINE_S = 30.0
#: The report set, in the order it is written (results.jsonl is streamed all along).
REPORT_FILES = (SUMMARY_FILE, JUNIT_FILE, HTML_FILE)


class CloseDeadline:
    """The watchdog of an interrupted run (see the module docstring)."""

    def __init__(self, session: Session, report_dir: str,
                 deadline_s: float = CLOSE_DEADLINE_S) -> None:
        self.session = session
        self.report_dir = os.path.abspath(report_dir)
        self.deadline_s = deadline_s
        self.signal: Interrupted | None = None
        self._timer: threading.Timer | None = None

    def start(self, signal: Interrupted) -> None:
        """Start the watchdog (on the first signal only: later calls change nothing)."""
        if self._timer is None:
            self.signal = signal
            self._timer = threading.Timer(self.deadline_s, self.give_up)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        """The run ended in time: no watchdog (idempotent)."""
        if self._timer is not None:
            self._timer.cancel()

    def give_up(self) -> None:
        """At the deadline: abandon the reports, say what was written, exit."""
        assert self.signal is not None
        sys.stderr.write(self.message() + "\n")
        sys.stderr.flush()
        os._exit(self.signal.exit_code)

    def message(self) -> str:
        """E.g. "ddp-conformance: interrupted by SIGTERM after 12 of 128 cases; ending the
        run took longer than 30s: exiting with results.jsonl (12 cases), summary.md,
        junit.xml in /r; not written: report.html" (abandons the report set)."""
        assert self.signal is not None
        reason = self.session.incomplete or f"{self.signal} at the end of the run"
        files = self.session.report_files
        head = f"ddp-conformance: {reason}; ending the run took longer than " \
               f"{self.deadline_s:.0f}s: exiting"
        if files is None:
            return f"{head} with no reports"
        written = {os.path.basename(p) for p in files.abandon()}
        cases = len(self.session.results)
        have = [f"{RESULTS_FILE} ({cases} case{'' if cases == 1 else 's'})",
                *(f for f in REPORT_FILES if f in written)]
        missing = [f for f in REPORT_FILES if f not in written]
        return (f"{head} with {', '.join(have)} in {self.report_dir}"
                + (f"; not written: {', '.join(missing)}" if missing else ""))
