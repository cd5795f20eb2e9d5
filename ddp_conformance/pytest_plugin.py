"""The pytest plugin (entry point ``pytest11``): the catalog as pytest items.

Every test module that defines ``SCENARIOS`` (the files of ``suites/``) yields one item per
(scenario, candidate), named ``<scenario-id>[<candidate>]``, run by the same
:class:`~ddp_conformance.runner.Runner` as ``ddp-conformance run``, so the verdicts are
the same: PASS passes; FAIL, ERROR, TIMEOUT and CRASH fail with the evidence; N/A skips
with the missing capability; an expectations-file match is an ``xfail`` (XFAIL, or XPASS
when it passes). Each pytest process (each pytest-xdist worker) owns one rank pool,
started on first use, so ``pytest -n 2`` runs two pools side by side with no shared port.

Options: ``--candidate`` (repeatable, default ``torch``), ``--backend``, ``--device``,
``--world-size``, ``--scenario-timeout``, ``--pool``, ``--expectations``,
``--strict-profile``, ``--no-trace``.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .errors import UsageError
from .runner import RunConfig, Runner
from .scenario import Scenario
from .verdict import Result, Verdict

_RUNNER_KEY = pytest.StashKey["ConformanceSession"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddp-conformance", "DDP conformance suite")
    group.addoption("--candidate", action="append", metavar="SPEC",
                    help="candidate DDP: torch, reference or package.module:attr (repeatable)")
    group.addoption("--backend", default="gloo", help="process-group backend (gloo, nccl)")
    group.addoption("--device", default="cpu", help="tensor device for gloo (cpu, cuda)")
    group.addoption("--world-size", type=int, default=2, metavar="N", help="ranks per scenario")
    group.addoption("--scenario-timeout", type=float, default=60.0, metavar="S",
                    help="deadline per scenario in seconds")
    group.addoption("--pool", choices=("persistent", "fresh"), default="persistent",
                    help="reuse rank processes or start new ones per scenario")
    group.addoption("--expectations", metavar="FILE", help="known deviations of the candidate")
    group.addoption("--strict-profile", action="store_true",
                    help="hold every candidate to torch's bucket layout (trace.buckets)")
    group.addoption("--no-trace", action="store_true",
                    help="plain process groups: no collective trace or trace checks")


class ConformanceSession:
    """One runner per pytest process, created when the first item runs."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = RunConfig(
            candidates=config.getoption("candidate") or ["torch"],
            backend=config.getoption("backend"), device=config.getoption("device"),
            world_size=config.getoption("world_size"),
            timeout_s=config.getoption("scenario_timeout"), pool=config.getoption("pool"),
            expectations=config.getoption("expectations"),
            strict_profile=config.getoption("strict_profile"),
            trace=not config.getoption("no_trace"))
        self._runner: Runner | None = None
        self._error: str | None = None

    @property
    def runner(self) -> Runner:
        if self._error:
            raise pytest.UsageError(self._error)
        if self._runner is None:
            try:
                self._runner = Runner(self.config)
            except UsageError as exc:
                self._error = f"ddp-conformance: {exc}"
                raise pytest.UsageError(self._error) from None
        return self._runner

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ddp_conformance: a conformance (scenario, candidate) case")
    config.stash[_RUNNER_KEY] = ConformanceSession(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_RUNNER_KEY, None)
    if session is not None:
        session.close()


def pytest_pycollect_makeitem(collector: pytest.Collector, name: str,
                              obj: Any) -> list[pytest.Item] | None:
    if name != "SCENARIOS" or not isinstance(collector, pytest.Module):
        return None
    candidates = collector.config.getoption("candidate") or ["torch"]
    return [ConformanceItem.from_parent(collector, name=f"{s.id}[{c}]", scenario=s, candidate=c)
            for s in obj for c in candidates]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Bad options (unknown candidate, unavailable backend) stop the session in one line."""
    if any(isinstance(item, ConformanceItem) for item in items):
        config.stash[_RUNNER_KEY].runner  # noqa: B018 - validates; the pool starts lazily


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
        self.add_marker(pytest.mark.ddp_conformance)

    def runtest(self) -> None:
        runner = self.config.stash[_RUNNER_KEY].runner
        result = runner.run_case(self.scenario, self.candidate)
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
            return "\n".join(_describe(excinfo.value.result))
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"{self.scenario.id}[{self.candidate}]"


def _describe(result: Result) -> Iterator[str]:
    yield f"{result.verdict.value}: {result.case_id}: {result.summary_line()}"
    for failure in result.failures[1:10]:
        yield f"  {failure.message}"
    for rank, tb in sorted(result.tracebacks.items()):
        yield f"--- rank {rank} traceback ---\n{tb}"
    for rank, stack in sorted(result.stacks.items()):
        yield f"--- rank {rank} stack ---\n{stack}"


def pytest_report_header(config: pytest.Config) -> str:
    return (f"ddp-conformance: candidates {config.getoption('candidate') or ['torch']}, "
            f"backend {config.getoption('backend')}, world size {config.getoption('world_size')}")
