"""The run loop shared by ``ddp-conformance run`` and the pytest plugin.

A :class:`Session` is one run: the :class:`~ddp_conformance.runner.Runner` (transport,
candidates, oracle and reference caches), every result as it arrives (streamed to
``results.jsonl`` when a report directory is given), stability over ``--repeat``, and what
the run has to say at its end (:meth:`Session.notes`): expectations that match no case,
scenarios the reference DDP could not run, flaky cases, rank memory growth. The command
line and the plugin differ only in how they present it.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ddp_conformance.catalog.loader import keyword_matcher, load_catalog
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.config import RunConfig
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.stability import Stability
from ddp_conformance.judge.verdict import Result
from ddp_conformance.ranks.pool import Pool, RankPool
from ddp_conformance.report.stream import ResultsWriter, run_info
from ddp_conformance.runner import Runner

Case = tuple[Scenario, str]


class Session:
    """One conformance run (see the module docstring)."""

    def __init__(self, config: RunConfig, pool: Pool | None = None, repeats: int = 1) -> None:
        self.config = config
        self.runner = Runner(config, pool=pool)
        self.stability = Stability(repeats)
        self.results: list[Result] = []
        self.writer: ResultsWriter | None = None
        self.memory_warnings: list[str] = []
        self._catalog: list[Scenario] | None = None
        self._closed = False

    # -- cases ------------------------------------------------------------------------

    @property
    def catalog(self) -> list[Scenario]:
        if self._catalog is None:
            self._catalog = load_catalog()
        return self._catalog

    def select(self, keyword: str | None = None) -> list[Case]:
        """Every (scenario, candidate spec) whose case id ``-k keyword`` matches."""
        matches = keyword_matcher(keyword)
        cases = [(s, c) for s in self.catalog for c in self.config.candidates
                 if matches(f"{s.id}[{c}]")]
        if not cases:
            raise UsageError(f"no scenario matches -k {keyword!r}")
        return cases

    def case_ids(self) -> Iterable[tuple[str, str]]:
        """(scenario id, candidate name) of every case of the whole catalog."""
        names = [self.runner.candidate_name(spec) for spec in self.config.candidates]
        return ((s.id, name) for s in self.catalog for name in names)

    # -- running ----------------------------------------------------------------------

    def open_reports(self, directory: str) -> dict[str, Any]:
        """Stream results to ``directory`` from now on; return the run information."""
        info = run_info(self.runner.candidates.values(), self.config.backend,
                        self.runner.device_kind, self.config.world_size)
        self.writer = ResultsWriter(directory, info)
        return info

    def start(self) -> None:
        """Start the ranks now (else the first case does)."""
        if self.config.pool == "persistent":
            self.runner.pool.start()

    def run_case(self, scenario: Scenario, spec: str, repeat: int = 0) -> Result:
        result = self.runner.run_case(scenario, spec)
        result.repeat = repeat
        self.results.append(result)
        self.stability.add(result)
        if self.writer is not None:
            self.writer.add(result)
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
        notes += [f"flaky: {case}: {what}" for case, what in self.stability.flaky().items()]
        notes += [f"memory growth: rank {rank}: {what}"
                  for rank, what in self.stability.growth().items()]
        return notes + self.memory_warnings

    def failed(self) -> bool:
        """Whether the run fails: a verdict was unexpected, a case flaky, or ranks grew."""
        return (any(r.verdict.unexpected for r in self.results)
                or bool(self.stability.flaky()) or bool(self.stability.growth()))

    def close(self) -> list[str]:
        """End the ranks and write the report set (once); return the notes."""
        notes = self.notes()
        if self._closed:
            return notes
        self._closed = True
        try:
            if self.writer is not None:
                self.writer.close(notes)
                self.writer = None
        finally:
            self.runner.close()
        return notes

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
