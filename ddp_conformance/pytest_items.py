"""The catalog as pytest items: one per (scenario, candidate), named ``<id>[<candidate>]``.

Imported by :mod:`ddp_conformance.pytest_plugin` only when a test module's ``SCENARIOS``
is a list of scenarios. Items run on the same :class:`~ddp_conformance.session.Session`
as ``ddp-conformance run``, so the verdicts are the same: PASS passes; FAIL, ERROR,
TIMEOUT and CRASH fail with the evidence; N/A skips with the missing capability; an
expectations-file match is an ``xfail`` (XFAIL), or passes with an ``xpass`` property
(XPASS). Each pytest process (each pytest-xdist worker) owns one session and rank pool,
started on first use, so ``pytest -n 2`` runs two pools side by side with no shared port.
At the end of collection, expectations that match no case are warned about (a warning,
so that pytest-xdist carries it from its workers to the terminal).
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.options import PYTEST, run_config

_SESSION_KEY = pytest.StashKey["PytestSession"]()


class ConformanceWarning(UserWarning):
    """Something a conformance run says that fails nothing (a stale expectation)."""


class PytestSession:
    """One :class:`~ddp_conformance.session.Session` per pytest process, made on first use."""

    def __init__(self, config: pytest.Config) -> None:
        self.pytest_config = config
        self._session: Any = None
        self._error: str | None = None

    @property
    def session(self) -> Any:
        if self._error:
            raise pytest.UsageError(self._error)
        if self._session is None:
            from ddp_conformance.session import Session

            try:
                config = run_config(self.pytest_config.getoption, PYTEST)
                self._session = Session(config)
            except UsageError as exc:
                self._error = f"ddp-conformance: {exc}"
                raise pytest.UsageError(self._error) from None
        return self._session

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


class _Hooks:
    """Registered with pytest once the first conformance items are made."""

    def __init__(self, holder: PytestSession) -> None:
        self.holder = holder

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Bad options stop the run in one line; stale expectations are warned about."""
        if not any(isinstance(item, ConformanceItem) for item in session.items):
            return
        for note in self.holder.session.stale_expectations():
            warnings.warn(ConformanceWarning(note), stacklevel=1)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.holder.close()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        session = self.holder._session
        if session is None or not session.results:
            return
        config = session.config
        terminalreporter.write_sep("-", "ddp-conformance")
        terminalreporter.write_line(
            f"{len(session.results)} cases: candidates {', '.join(config.candidates)}, backend "
            f"{config.backend}, world size {config.world_size}")
        for note in session.run_notes():  # stale expectations were warned about at collection
            terminalreporter.write_line(f"note: {note}")


def _holder(config: pytest.Config) -> PytestSession:
    holder = config.stash.get(_SESSION_KEY, None)
    if holder is None:
        holder = config.stash[_SESSION_KEY] = PytestSession(config)
        config.pluginmanager.register(_Hooks(holder), "ddp_conformance_items")
    return holder


def make_items(collector: pytest.Collector, scenarios: list[Scenario]) -> list[pytest.Item]:
    """The items of one ``SCENARIOS`` list, validated as the loader validates the catalog."""
    from ddp_conformance.catalog.loader import validate

    _holder(collector.config)
    for scenario in scenarios:
        validate(scenario)
    candidates = collector.config.getoption("ddp_candidate") or ["torch"]
    return [ConformanceItem.from_parent(collector, name=f"{s.id}[{c}]", scenario=s, candidate=c)
            for s in scenarios for c in candidates]


class ScenarioFailed(Exception):
    """A verdict other than PASS, carrying the result for the report."""

    def __init__(self, result: Result) -> None:
        super().__init__(result.summary_line())
        self.result = result


class ConformanceItem(pytest.Item):
    def __init__(self, *, scenario: Scenario, candidate: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.candidate = candidate

    def runtest(self) -> None:
        result = _holder(self.config).session.run_case(self.scenario, self.candidate)
        self.user_properties.append(("verdict", result.verdict.value))
        if result.verdict is Verdict.PASS:
            return
        if result.verdict is Verdict.NA:
            pytest.skip(f"N/A: {result.reason}")
        if result.verdict is Verdict.XFAIL:
            pytest.xfail(f"{result.summary_line()} (expected: {result.expectation})")
        if result.verdict is Verdict.XPASS:
            # Reported, not failed: the expectations file names a case that now passes.
            self.user_properties.append(("xpass", result.expectation or ""))
            return
        raise ScenarioFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException],
                     style: Any = None) -> str:
        if isinstance(excinfo.value, ScenarioFailed):
            return "\n".join(describe(excinfo.value.result))
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.scenario.id}[{self.candidate}]"


def describe(result: Result) -> Iterator[str]:
    """A failed case's evidence block, as pytest shows it."""
    yield f"{result.verdict.value}: {result.case_id}: {result.summary_line()}"
    for failure in result.failures[1:10]:
        yield f"  {failure.message}"
    for rank, tb in sorted(result.tracebacks.items()):
        yield f"--- rank {rank} traceback ---\n{tb}"
    for rank, stack in sorted(result.stacks.items()):
        yield f"--- rank {rank} stack ---\n{stack}"
