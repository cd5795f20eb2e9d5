"""The run loop shared by ``ddp-conformance run`` and the pytest plugin.

A :class:`Session` is one run: the :class:`~ddp_conformance.runner.Runner` (transport,
candidates, oracle and reference caches), every result as it arrives (streamed to
``results.jsonl`` when a report directory is given), stability over ``--repeat``, and what
the run has to say at its end (:meth:`Session.notes`): expectations that match no case,
scenarios the reference DDP could not run, flaky cases, rank memory growth. The command
line and the plugin differ only in how they present it.

Signals, interruption and the end of the run are the session's
:class:`~ddp_conformance.interruption.RunGuard` (:attr:`Session.guard`): a recorded case
is whole in every record or in none, and an interrupted run ends its ranks at once.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from ddp_conformance.backend_comparison import runner_for
from ddp_conformance.catalog.collective import CollectiveCase
from ddp_conformance.catalog.loader import keyword_matcher, load_catalog, load_collectives
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.config import RunConfig
from ddp_conformance.errors import UsageError
from ddp_conformance.interruption import RunGuard
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
        #: Signals, interruption and the end of the run (an inert guard until a front end
        #: makes its own: :class:`~ddp_conformance.interruption.RunGuard`).
        self.guard = RunGuard(self)
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

    def open_reports(self, directory: str, render_set: bool = True) -> dict[str, Any]:
        """Stream results to ``directory`` from now on; return the run information.
        ``render_set=False``: only ``results.jsonl`` (a part another process merges).
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
        self.writer = ResultsWriter(directory, info, render_set=render_set)
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
        self.guard.check()
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
        with self.guard.deferring():
            self.results.append(result)
            self.stability.add(result)
            if self.writer is not None:
                self.writer.add(result)
            if on_result is not None:
                on_result(result)
        self.guard.check()
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

    def end_ranks_now(self) -> None:
        """Kill the ranks without the polite goodbye (an interrupted run: a failure to
        end them becomes a note; torchrun's pool tells its followers to stop)."""
        self._quietly(functools.partial(self.runner.pool.close, force=True))

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
        endings = getattr(self.runner.pool, "endings", None)  # the fail-fast rule's count
        notes += endings.notes() if endings is not None else []
        notes += getattr(self.runner.pool, "notes", [])  # how its ranks start, if it says
        return notes + self.memory_warnings + self._end_warnings

    def failed(self) -> bool:
        """Whether the run fails: a verdict was unexpected, a case flaky, or ranks grew."""
        return (any(r.verdict.unexpected for r in self.results)
                or bool(self.stability.flaky()) or bool(self.stability.growth()))

    def close(self) -> list[str]:
        """End the ranks and write the report set (once), marked incomplete after an
        interruption (:attr:`incomplete`); return the notes. A signal caught meanwhile does
        not cut it short (the guard holds it). After a failed write to ``results.jsonl``
        (:class:`~ddp_conformance.errors.ReportDirError`) only the ranks are ended."""
        notes = self.notes()
        if self._closed:
            return notes
        self._closed = True
        with self.guard.deferring():
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
