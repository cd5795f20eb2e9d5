"""One run's end, whatever ends it: signals, the interruption they cause, the ranks ended,
the reports closed, and the deadline on all of it (docs/CONTRACT.md, "Hangs and faults":
SIGINT/SIGTERM leave partial reports and no process behind).

:class:`RunGuard` is the context manager ``ddp-conformance run`` wraps its run in, and the
object the pytest plugin drives step by step (pytest's session spans several hooks). Every
:class:`~ddp_conformance.session.Session` has one: an inert one (no signal caught, no
deadline) until a front end makes its own for it.

- While caught (:meth:`RunGuard.catch`, on entering), a signal raises
  :class:`~ddp_conformance.errors.Interrupted` in the main thread, wherever it is (usually
  waiting for the ranks), except while a finished case is being recorded
  (:meth:`RunGuard.deferring`): then it is raised once the case is recorded, so that the
  reports hold whole cases only.
- :meth:`RunGuard.interrupt` takes it: the run is marked incomplete ("interrupted by
  SIGTERM after 12 of 128 cases") and the ranks are ended at once. Further signals are
  ignored: ending must not be cut short. An exception raised by a handler can be lost
  (Python only prints one raised while a finalizer, ``__del__``, runs): so until it is
  taken, the next case raises it again (:meth:`RunGuard.check`), and so does a further
  signal :data:`REPEAT_GRACE_S` after it was raised.
- :meth:`RunGuard.close` writes the report set of the finished cases (marked incomplete
  after an interruption) and ends the ranks; leaving the ``with`` block takes an
  :class:`Interrupted` that ends it, closes, restores the handlers and cancels the
  deadline, and :meth:`RunGuard.ending` says what to print and exit with.
- With ``deadline_s``, the first signal starts the close deadline
  (:class:`~ddp_conformance.deadline.CloseDeadline`): the run ends within it, with every
  report file whole or absent.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ddp_conformance.deadline import CloseDeadline
from ddp_conformance.errors import Interrupted

if TYPE_CHECKING:
    from ddp_conformance.session import Session

#: A further signal this soon after :class:`Interrupted` was raised is the same request
#: (the exception is on its way out); later, the first is taken for lost and raised again.
REPEAT_GRACE_S = 5.0
#: What ``ddp-conformance run`` catches.
RUN_SIGNALS = (signal.SIGINT, signal.SIGTERM)

Handler = Callable[[int, Any], None]


def interrupted_reason(exc: Interrupted, done: int, planned: int | None) -> str:
    """E.g. "interrupted by SIGTERM after 12 of 128 cases"."""
    if planned is not None:
        return f"{exc} after {done} of {planned} cases"
    return f"{exc} after {done} case{'' if done == 1 else 's'}"


class RunGuard:
    """The end of one session's run (see the module docstring).

    ``signals``: what to catch; ``handler`` replaces :meth:`on_signal` as the handler (it
    should call it: the pytest plugin turns the exception into pytest's exit outside a
    case); ``report_dir`` and ``deadline_s``: the close deadline (none if ``deadline_s`` is
    None)."""

    def __init__(self, session: Session, signals: Iterable[int] = (),
                 report_dir: str | None = None, deadline_s: float | None = None,
                 handler: Handler | None = None) -> None:
        self.session = session
        session.guard = self
        self.signals = tuple(signals)
        self.report_dir = os.path.abspath(report_dir) if report_dir else None
        self.handler = handler
        self.deadline = CloseDeadline(session, self.report_dir or os.getcwd(), deadline_s) \
            if deadline_s is not None else None
        #: The first signal received while caught (None: none).
        self.received: Interrupted | None = None
        #: What :meth:`interrupt` took (None: the run was not interrupted).
        self.taken: Interrupted | None = None
        #: Whether the reports were open when the run ended (set on leaving the block).
        self.reporting = False
        #: The run's notes, once closed.
        self.notes: list[str] = []
        self._recording = False
        self._raised_at = float("-inf")
        self._handlers: dict[int, Any] = {}

    # -- signals ------------------------------------------------------------------------

    def catch(self) -> bool:
        """Until :meth:`restore`, the guard's signals raise :class:`Interrupted`.
        Returns False, changing nothing, outside the main thread (Python delivers signals
        there only); idempotent."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in self.signals:
            if signum not in self._handlers:
                self._handlers[signum] = signal.signal(signum, self.handler or self.on_signal)
        return True

    def restore(self) -> None:
        """Put back the handlers :meth:`catch` replaced (idempotent)."""
        while self._handlers:
            signum, previous = self._handlers.popitem()
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    def on_signal(self, signum: int, frame: Any = None) -> None:
        """The handler: the first signal starts the close deadline and raises
        :class:`Interrupted` (held back while a finished case is recorded or the reports
        are written); a later one is ignored, unless the first was lost."""
        if self.deadline is not None:
            self.deadline.start(Interrupted(signum))
        if self.taken is not None:
            return  # the run is ending
        if self.received is None:
            self.received = Interrupted(signum)
        elif time.monotonic() - self._raised_at < REPEAT_GRACE_S:
            return  # the first is on its way out
        self._raise_received()

    def check(self) -> None:
        """Raise :class:`Interrupted` if a caught signal has not been taken by
        :meth:`interrupt` yet (a checkpoint: the run went on, so its exception was lost)."""
        if self.received is not None and self.taken is None:
            self._raise_received()

    def _raise_received(self) -> None:
        if self._recording or self.received is None:
            return  # raised by the next checkpoint, once the case is recorded
        self._raised_at = time.monotonic()
        raise Interrupted(self.received.signum)

    @contextmanager
    def deferring(self) -> Iterator[None]:
        """While inside, a caught signal is held back (see :meth:`on_signal`)."""
        outer, self._recording = self._recording, True
        try:
            yield
        finally:
            self._recording = outer

    # -- ending ---------------------------------------------------------------------------

    def interrupt(self, exc: Interrupted) -> None:
        """After ``exc``: mark the run incomplete and end the ranks at once (the reports of
        the finished cases follow in :meth:`close`)."""
        if self.received is None:
            self.received = exc
        self.taken = exc
        session = self.session
        session.incomplete = interrupted_reason(exc, len(session.results), session.planned)
        session.end_ranks_now()

    def close(self) -> list[str]:
        """End the ranks and write the report set (once; a signal meanwhile does not cut
        it short); return the run's notes."""
        self.notes = self.session.close()
        return self.notes

    def __enter__(self) -> RunGuard:
        self.catch()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        """Take an :class:`Interrupted` that ends the block, close, restore the handlers,
        cancel the deadline. Any other exception goes on (after closing)."""
        interrupted = isinstance(exc, Interrupted)
        if isinstance(exc, Interrupted) and self.taken is None:
            self.interrupt(exc)
        self.reporting = self.session.writer is not None
        try:
            self.close()
        finally:
            self.restore()
            if self.deadline is not None:
                self.deadline.cancel()
        return interrupted

    def ending(self) -> tuple[str, int] | None:
        """The line to print and the exit code of a run a signal ended, or that a signal
        reached while its reports were written (they are complete then); None otherwise."""
        where = self.report_dir or "."
        if self.taken is not None:
            said = f"partial reports in {where}" if self.reporting else "no reports written"
            return f"ddp-conformance: {self.session.incomplete}; {said}", self.taken.exit_code
        if self.received is not None:
            return (f"ddp-conformance: {self.received} at the end of the run; reports in "
                    f"{where}", self.received.exit_code)
        return None
