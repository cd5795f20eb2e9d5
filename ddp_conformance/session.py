"""The run loop shared by ``ddp-conformance run`` and the pytest plugin.

A :class:`Session` is one run: the :class:`~ddp_conformance.runner.Runner` (transport,
candidates, oracle and reference caches), every result as it arrives (streamed to
``results.jsonl`` when a report directory is given), stability over ``--repeat``, and what
the run has to say at its end (:meth:`Session.notes`): expectations that match no case,
scenarios the reference DDP could not run, flaky cases, rank memory growth. The command
line and the plugin differ only in how they present it.

Signals (SPEC.md, "Hangs and faults": SIGINT/SIGTERM leave partial reports and no process
behind): between :meth:`Session.catch_signals` and :meth:`Session.restore_signals`, a
signal raises :class:`~ddp_conformance.errors.Interrupted` in the main thread, wherever it
is (usually waiting for the ranks), except while a finished case is being recorded: then
it is raised once the case is recorded, so that the reports hold whole cases only. The
caller then calls :meth:`Session.interrupt` (the run is marked incomplete and the ranks
are ended at once) and :meth:`Session.close` (the report set of the finished cases).
Further signals are ignored: ending must not be cut short. An exception raised by a
handler can be lost (Python only prints one raised while a finalizer, ``__del__``, runs):
so until :meth:`Session.interrupt` took it, the next case raises it again, and so does a
further signal :data:`REPEAT_GRACE_S` after it was raised.
"""
from __future__ import annotations

import functools
import inspect
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from ddp_conformance.backend_comparison import runner_for
from ddp_conformance.catalog.collective import CollectiveCase
from ddp_conformance.catalog.loader import keyword_matcher, load_catalog, load_collectives
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.config import RunConfig
from ddp_conformance.errors import Interrupted, UsageError
from ddp_conformance.judge.stability import Stability
from ddp_conformance.judge.verdict import Result
from ddp_conformance.ranks.coverage_hook import ParentCoverage, clear_data, setup_for
from ddp_conformance.ranks.pool import Pool, RankPool
from ddp_conformance.ranks.sanity import BackendInsane, check_backend
from ddp_conformance.report.coverage import discard_stale
from ddp_conformance.report.files import ReportFiles, check_writable
from ddp_conformance.report.stream import ResultsWriter, run_info

#: (scenario, candidate spec), or (collective check, backend name).
Case = tuple[Scenario | CollectiveCase, str]

#: A further signal this soon after :class:`Interrupted` was raised is the same request
#: (the exception is on its way out); later, the first is taken for lost and raised again.
REPEAT_GRACE_S = 5.0


def interrupted_reason(exc: Interrupted, done: int, planned: int | None) -> str:
    """E.g. "interrupted by SIGTERM after 12 of 128 cases"."""
    if planned is not None:
        return f"{exc} after {done} of {planned} cases"
    return f"{exc} after {done} case{'' if done == 1 else 's'}"


class Session:
    """One conformance run (see the module docstring)."""

    def __init__(self, config: RunConfig, pool: Pool | None = None, repeats: int = 1) -> None:
        self.config = config
        self.runner = runner_for(config, pool=pool)
        self.stability = Stability(repeats)
        self.results: list[Result] = []
        self.writer: ResultsWriter | None = None
        self.memory_warnings: list[str] = []
        self._catalog: list[Scenario] | None = None
        self._collectives: list[CollectiveCase] | None = None
        self._closed = False
        #: How many cases the run means to run (for "after 12 of 128 cases"), if known.
        self.planned: int | None = None
        #: Why the reports hold fewer cases than planned (None: a complete run).
        self.incomplete: str | None = None
        #: The first signal received while caught (None: none).
        self.received: Interrupted | None = None
        self._recording = False
        self._raised_at = float("-inf")
        self._handlers: dict[int, Any] = {}
        self._end_warnings: list[str] = []
        #: ``--coverage``: this process's measurement (ranks inherit it), once reports open.
        self.coverage: ParentCoverage | None = None
        self._report_dir: str | None = None
        #: The backend's sanity check (:mod:`ddp_conformance.ranks.sanity`): not run yet
        #: (None), passed (True), or what it found (raised again for every case).
        self._backend_sane: bool | BackendInsane | None = None
        #: The report set's files as they are written, once reports open (they stay
        #: after :meth:`close`: which were written).
        self.report_files: ReportFiles | None = None

    # -- cases ------------------------------------------------------------------------

    @property
    def catalog(self) -> list[Scenario]:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    @property
    def collectives(self) -> list[CollectiveCase]:
        """The backend's collective checks, when the run includes them (else none)."""
        if not self.config.runs_collectives(self.runner.backend.custom):
            return []
        if self._collectives is None:
            self._collectives = load_collectives()
        return self._collectives

    def select(self, keyword: str | None = None) -> list[Case]:
        """The backend's collective checks, then every (scenario, candidate spec), whose
        case id ``-k keyword`` matches."""
        matches = keyword_matcher(keyword)
        backend = self.runner.backend.name
        cases: list[Case] = [(c, backend) for c in self.collectives
                             if matches(f"{c.id}[{backend}]")]
        if self.config.runs_scenarios():
            cases += [(s, c) for s in self.catalog for c in self.config.candidates
                      if matches(f"{s.id}[{c}]")]
        if not cases:
            raise UsageError(f"no scenario matches -k {keyword!r}")
        self.planned = len(cases)
        return cases

    def case_ids(self) -> Iterable[tuple[str, str]]:
        """(scenario id, candidate name) of every case of the whole catalog, and (case id,
        backend) of the collective checks."""
        names = [self.runner.candidate_name(spec) for spec in self.config.candidates]
        backend = self.runner.backend.name
        yield from ((c.id, backend) for c in self.collectives)
        yield from ((s.id, name) for s in self.catalog for name in names)

    # -- running ----------------------------------------------------------------------

    def open_reports(self, directory: str) -> dict[str, Any]:
        """Stream results to ``directory`` from now on; return the run information.
        A directory that cannot be written raises
        :class:`~ddp_conformance.errors.ReportDirError` now, before any case runs."""
        check_writable(directory)
        info = run_info(self.runner.candidates.values(), self.runner.backend.name,
                        self.runner.device_kind, self.config.world_size)
        if self.runner.backend.custom:
            info["backend_spec"] = self.runner.backend.spec
        if self.runner.comparison is not None:
            info["compare_backend"] = self.runner.comparison.backend.name
        info["durations"] = self.config.durations  # summary.md's slowest cases (0: all)
        discard_stale(directory)
        if self.config.coverage:
            info["coverage"] = list(self.config.coverage)
            self.measure_coverage(directory, combine=True)
        self.writer = ResultsWriter(directory, info)
        self.report_files = self.writer.files
        return info

    def measure_coverage(self, directory: str, combine: bool) -> None:
        """``--coverage``: measure this process and (through the environment) every rank
        started from now on; ``combine``: this session also combines everyone's data into
        ``directory`` at :meth:`close` (pytest-xdist: the controller does, once)."""
        setup = setup_for(self.config.coverage, directory)
        if combine:
            clear_data(setup)
            self._report_dir = directory
        self.coverage = ParentCoverage(setup)
        self.coverage.start()

    def start(self) -> None:
        """Start the ranks now (else the first case does)."""
        if self.config.pool == "persistent":
            self.runner.pool.start()

    def run_case(self, scenario: Scenario | CollectiveCase, spec: str, repeat: int = 0,
                 on_result: Callable[[Result], object] | None = None) -> Result:
        """Run one case and record it (then ``on_result(result)``, e.g. a progress line).

        A caught signal interrupts the case itself; one that arrives while the result is
        recorded is raised after ``on_result``: a case is either in every record or in none.
        """
        self.check_interrupted()
        if self._backend_sane is None:  # before the first case: BackendInsane ends the run
            try:
                check_backend(self.runner.pool, self.runner.backend.name,
                              self.config.world_size, self.runner.device_kind)
                self._backend_sane = True
            except BackendInsane as exc:
                self._backend_sane = exc
        if isinstance(self._backend_sane, BackendInsane):
            raise self._backend_sane
        result = self.runner.run_case(scenario, spec)
        result.repeat = repeat
        with self._deferring_signals():
            self.results.append(result)
            self.stability.add(result)
            if self.writer is not None:
                self.writer.add(result)
            if on_result is not None:
                on_result(result)
        self.check_interrupted()
        return result

    def probe_memory(self, repeat: int) -> None:
        """After a repeat: every rank's memory (a probe, not a case: a failure is a note)."""
        if not isinstance(self.runner.pool, RankPool):
            return
        try:
            self.stability.add_memory(dict(enumerate(
                self.runner.pool.call("ddp_conformance.ranks.memory:rank_memory"))))
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[-1][:200]
            self.memory_warnings.append(f"rank memory not measured after repeat {repeat + 1}: "
                                        f"{first}")

    # -- signals ----------------------------------------------------------------------

    def catch_signals(self, signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM),
                      handler: Callable[[int, Any], None] | None = None) -> bool:
        """Until :meth:`restore_signals`, ``signals`` raise :class:`Interrupted` (see the
        module docstring); ``handler`` replaces :meth:`on_signal` (it should call it).
        Returns False, changing nothing, outside the main thread (Python delivers signals
        there only)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in signals:
            if signum not in self._handlers:
                self._handlers[signum] = signal.signal(signum, handler or self.on_signal)
        return True

    def restore_signals(self) -> None:
        """Put back the handlers :meth:`catch_signals` replaced (idempotent)."""
        while self._handlers:
            signum, previous = self._handlers.popitem()
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)

    def on_signal(self, signum: int, frame: Any = None) -> None:
        """The handler: the first signal raises :class:`Interrupted` (held back while a
        finished case is recorded or the reports are written); a later one is ignored,
        unless the first was lost (see the module docstring)."""
        if self.incomplete is not None:
            return  # interrupt() took it: the run is ending
        if self.received is None:
            self.received = Interrupted(signum)
        elif time.monotonic() - self._raised_at < REPEAT_GRACE_S:
            return  # the first is on its way out
        self._raise_received()

    def check_interrupted(self) -> None:
        """Raise :class:`Interrupted` if a caught signal has not been taken by
        :meth:`interrupt` yet (a checkpoint: the run went on, so its exception was lost)."""
        if self.received is not None and self.incomplete is None:
            self._raise_received()

    def _raise_received(self) -> None:
        if self._recording or self.received is None:
            return  # raised by the next checkpoint, once the case is recorded
        self._raised_at = time.monotonic()
        raise Interrupted(self.received.signum)

    @contextmanager
    def _deferring_signals(self) -> Iterator[None]:
        """While inside, a caught signal is held back (see :meth:`on_signal`)."""
        outer, self._recording = self._recording, True
        try:
            yield
        finally:
            self._recording = outer

    def interrupt(self, exc: Interrupted) -> None:
        """After ``exc``: mark the run incomplete and end the ranks at once (the reports of
        the finished cases follow in :meth:`close`)."""
        if self.received is None:
            self.received = exc
        self.incomplete = interrupted_reason(exc, len(self.results), self.planned)
        self.end_ranks_now()

    def end_ranks_now(self) -> None:
        """Kill the ranks without the polite goodbye (a pool without ``force`` closes as it
        can: torchrun's tells its followers to stop)."""
        close = self.runner.pool.close
        if "force" in inspect.signature(close).parameters:
            self._quietly(functools.partial(close, force=True))
        else:
            self._quietly(close)

    def _quietly(self, end: Callable[[], object]) -> None:
        """``end()`` while ending an interrupted run: a failure becomes a note. (A pool
        interrupted half-started may fail to close; its ranks still die with this process,
        ``die_with_parent``.)"""
        try:
            end()
        except Exception as exc:  # noqa: BLE001 - ending anyway: say it, do not stop
            self._end_warnings.append(f"the ranks could not be ended cleanly: "
                                      f"{type(exc).__name__}: {exc}")

    # -- the end ----------------------------------------------------------------------

    def stale_expectations(self) -> list[str]:
        """Expectations that match no case of the whole catalog for these candidates (so a
        ``-k`` selection never makes a pattern look stale)."""
        expectations = self.runner.expectations
        if not expectations.entries:
            return []
        ids = list(self.case_ids())
        return [f"expectation {e.pattern!r} ({e.path}:{e.line}) matches no case"
                for e in expectations.entries
                if not any(e.matches(f"{sid}[{name}]") or e.matches(sid) for sid, name in ids)]

    def notes(self) -> list[str]:
        """What the run says beyond its verdicts; :meth:`failed` says whether it fails."""
        return self.stale_expectations() + self.run_notes()

    def run_notes(self) -> list[str]:
        """What the cases run so far say beyond their verdicts (stale expectations apart:
        they are known before any case runs)."""
        notes = [f"{sid}: not compared with the reference DDP ({why})"
                 for sid, why in self.runner.reference_notes.items()]
        notes += self.runner.reference_summary()
        notes += [f"flaky: {case}: {what}" for case, what in self.stability.flaky().items()]
        notes += [f"memory growth: rank {rank}: {what}"
                  for rank, what in self.stability.growth().items()]
        notes += self.runner.leaks.notes()
        return notes + self.memory_warnings + self._end_warnings

    def failed(self) -> bool:
        """Whether the run fails: a verdict was unexpected, a case flaky, or ranks grew."""
        return (any(r.verdict.unexpected for r in self.results)
                or bool(self.stability.flaky()) or bool(self.stability.growth()))

    def close(self) -> list[str]:
        """End the ranks and write the report set (once), marked incomplete after
        :meth:`interrupt`; return the notes. A signal caught meanwhile does not cut it
        short (it stays in :attr:`received`). After a failed write to ``results.jsonl``
        (:class:`~ddp_conformance.errors.ReportDirError`) only the ranks are ended."""
        notes = self.notes()
        if self._closed:
            return notes
        self._closed = True
        with self._deferring_signals():
            if self.coverage is not None:
                self._close_coverage()
            try:
                if self.writer is not None:
                    self.writer.close(notes, incomplete=self.incomplete)
                    self.writer = None
            finally:
                if self.incomplete is None:
                    self.runner.close()
                else:
                    self._quietly(self.runner.close)
        return notes

    def _close_coverage(self) -> None:
        """End the ranks (each saves its data as it exits), stop measuring here, and
        combine everything into the report directory's coverage section. An interrupted
        run only saves: combining is left out of its deadline."""
        coverage, self.coverage = self.coverage, None
        assert coverage is not None
        if self.incomplete is None:
            self.runner.close()
        else:
            self._quietly(self.runner.close)
        coverage.stop()
        if self.incomplete is None and self._report_dir is not None:
            from ddp_conformance.report.coverage import combine_and_summarise

            combine_and_summarise(coverage.setup, self._report_dir)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
