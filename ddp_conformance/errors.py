"""Errors that end a run before any scenario ran: a usage or environment problem (exit 2).

SPEC.md, "Verdicts and exit codes": an unknown candidate, an unavailable backend or an
impossible world size stops the run with one clear line and exit code 2.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input or an environment that cannot run what was asked: exit 2, one line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class PoolError(RuntimeError):
    """The rank pool could not start its processes (not a verdict on a candidate)."""
