"""Errors that end a run early: a usage or environment problem (exit 2), or a signal.

docs/CONTRACT.md, "Verdicts and exit codes": an unknown candidate, an unavailable backend or an
impossible world size stops the run with one clear line and exit code 2, and so does a
report directory that cannot be written (:class:`ReportDirError`). SIGTERM and
SIGINT during a run become :class:`Interrupted` (docs/CONTRACT.md, "Hangs and faults"): the run
writes the reports of the cases finished so far, marked incomplete, ends every rank and
exits 143 (SIGTERM, 128 + 15, what a shell reports for a process SIGTERM ended) or 1
(SIGINT).
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: SIGINT (Ctrl-C) during a run: partial reports written, exit 1 (the run did not pass).
EXIT_SIGINT = 1
#: SIGTERM during a run (a CI runner's cancel): partial reports written, exit 128 + 15.
EXIT_SIGTERM = 143


class UsageError(Exception):
    """Bad input or an environment that cannot run what was asked: exit 2, one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ReportDirError(UsageError):
    """The report directory cannot be written (read-only, full, no permission), before
    the first case or mid-run: exit 2, one line naming the path and the error."""


class PoolError(RuntimeError):
    """The rank pool could not start its processes (not a verdict on a candidate)."""


class BackendInsane(Exception):
    """The backend disagrees with what the harness set up (:mod:`ddp_conformance.ranks.sanity`):
    the run ends, exit code 1. Here, with the other run-ending errors, so that the command
    line catches it without importing torch."""

    exit_code = EXIT_FAILED

    def __init__(self, backend: str, world_size: int, lines: list[str]) -> None:
        self.lines = lines
        super().__init__(f"backend {backend} disagrees with the {world_size}-rank job the "
                         f"harness set up; no case ran:\n" + "\n".join(lines))


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived during a run (raised in the main thread by the handler).

    A :class:`BaseException`, as :class:`KeyboardInterrupt` is, so that no ``except
    Exception`` on the way (a case's error handling) takes it for a verdict.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        """The signal's name, e.g. ``SIGTERM``."""
        import signal

        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        """143 for SIGTERM, 1 for SIGINT (and 128 + N for any other signal N)."""
        import signal

        if self.signum == signal.SIGINT:
            return EXIT_SIGINT
        return EXIT_SIGTERM if self.signum == signal.SIGTERM else 128 + self.signum

    def __str__(self) -> str:
        return f"interrupted by {self.name}"
