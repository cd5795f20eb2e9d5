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

Signals: pytest turns SIGINT into KeyboardInterrupt itself; the ranks are then ended at
once. SIGTERM is caught only from the first conformance item on, until the session
finishes (so the plugin never changes another project's pytest run): it ends the ranks
and becomes ``pytest.exit(..., returncode=143)``, so that pytest still finishes its
session (``--junitxml`` and the like are written with the items finished so far). Should
pytest swallow that exit (an ``except Exception`` on its way), the next conformance item
raises it again, and the session still ends with 143.
"""
from __future__ import annotations

import json
import signal
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from ddp_conformance.catalog.collective import CollectiveCase
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.errors import Interrupted, UsageError
from ddp_conformance.judge.verdict import RULE_LABEL, Result, Verdict
from ddp_conformance.options import PYTEST, run_config

if TYPE_CHECKING:
    from ddp_conformance.interruption import RunGuard

_SESSION_KEY = pytest.StashKey["PytestSession"]()
#: The user property that carries a case's verdict and cause to the terminal summary.
CASE_PROPERTY = "ddp_case"


class ConformanceWarning(UserWarning):
    """Something a conformance run says that fails nothing (a stale expectation)."""


class PytestSession:
    """One :class:`~ddp_conformance.session.Session` per pytest process, made on first use."""

    def __init__(self, config: pytest.Config) -> None:
        self.pytest_config = config
        self._session: Any = None
        self._error: str | None = None
        #: The session's end: SIGTERM, interruption, closing (made with the session).
        self.guard: RunGuard | None = None
        #: Whether a conformance item is running (a signal then interrupts its case).
        self.in_case = False

    @property
    def session(self) -> Any:
        if self._error:
            raise pytest.UsageError(self._error)
        if self._session is None:
            from ddp_conformance.interruption import RunGuard
            from ddp_conformance.session import Session

            try:
                config = run_config(self.pytest_config.getoption, PYTEST)
                self._session = Session(config)
                self._open_reports()
                # SIGTERM only (pytest turns SIGINT into KeyboardInterrupt itself), from the
                # first conformance item on; no close deadline: pytest ends its own session.
                self.guard = RunGuard(self._session, (signal.SIGTERM,), handler=self._on_sigterm)
                if config.coverage:  # before any rank starts; the controller combines
                    from ddp_conformance.pytest_coverage import report_dir

                    self._session.measure_coverage(report_dir(self.pytest_config),
                                                   combine=False)
            except UsageError as exc:
                self._error = f"ddp-conformance: {exc}"
                raise pytest.UsageError(self._error) from None
        return self._session

    def _open_reports(self) -> None:
        """``--ddp-report-dir DIR``: stream this process's cases there; a pytest-xdist
        worker streams its part (:mod:`ddp_conformance.report.merge`), which the
        controller merges and renders at the end."""
        directory = self.pytest_config.getoption("ddp_report_dir")
        if not directory:
            return
        worker = getattr(self.pytest_config, "workerinput", {}).get("workerid")
        if worker is None:
            self._session.open_reports(directory)
        else:
            from ddp_conformance.report.merge import part_dir

            self._session.open_reports(part_dir(directory, worker), render_set=False)

    def close(self) -> None:
        if self.guard is not None:
            self.guard.restore()
            self.guard.close()

    def catch_sigterm(self) -> None:
        """From now until the session finishes, SIGTERM ends the run (see the module
        docstring); idempotent."""
        if self.session is not None and self.guard is not None:
            self.guard.catch()

    def restore_signals(self) -> None:
        if self.guard is not None:
            self.guard.restore()

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        assert self.guard is not None
        try:
            self.guard.on_signal(signum, frame)
        except Interrupted as exc:
            if self.in_case:
                raise  # the item ends the run, once its case is out of the ranks' hands
            self.stop(exc)

    def stop(self, exc: Interrupted) -> NoReturn:
        """End the ranks at once and the pytest run with ``exc``'s exit code."""
        assert self.guard is not None
        self.guard.interrupt(exc)
        self.exit()

    def exit(self) -> NoReturn:
        """End the pytest run of an interrupted session (again, if pytest went on)."""
        assert self.guard is not None
        received = self.guard.received
        code = received.exit_code if received is not None else 1
        pytest.exit(f"ddp-conformance: {self.session.incomplete}", returncode=code)

    def finish(self, session: pytest.Session) -> None:
        """At pytest's session end: SIGTERM is pytest's own again; if one came and its
        exit was lost, the ranks end now and pytest exits 143 all the same."""
        self.restore_signals()
        ours, guard = self._session, self.guard
        if ours is None or guard is None:
            return
        if (ours.coverage is not None or ours.writer is not None) and guard.received is None:
            # ranks exit and save before the controller combines; the report set is
            # rendered before pytest's terminal summary, which names it
            guard.close()
        received = guard.received
        if received is None or received.signum != signal.SIGTERM:
            return
        if guard.taken is None:
            guard.interrupt(received)
        session.exitstatus = received.exit_code


class _Hooks:
    """Registered with pytest once the first conformance items are made."""

    def __init__(self, holder: PytestSession) -> None:
        self.holder = holder

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Bad options stop the run in one line; stale expectations are warned about."""
        planned = sum(isinstance(item, ConformanceItem) for item in session.items)
        if not planned:
            return
        self.holder.session.planned = planned
        for note in self.holder.session.stale_expectations():
            warnings.warn(ConformanceWarning(note), stacklevel=1)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.holder.finish(session)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.holder.close()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write_diagnosis(terminalreporter)
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
        directory = self.holder.pytest_config.getoption("ddp_report_dir")
        if directory and not hasattr(self.holder.pytest_config, "workerinput"):
            terminalreporter.write_line(f"reports: {directory}/ (summary.md, junit.xml, "
                                        f"report.html, results.jsonl)")


def write_diagnosis(terminalreporter: Any) -> None:
    """The diagnosis section of the terminal summary: the same lines as the command line's
    closing block (diagnosis, by cause, by check, N/A grouped) and its closing counts,
    read from the items' reports (so pytest-xdist's controller has them too)."""
    from ddp_conformance.report.diagnosis import closing_line, opening_lines
    from ddp_conformance.report.load import result_from_json

    results = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", "") != "call":
                continue
            for key, value in getattr(report, "user_properties", ()):
                if key == CASE_PROPERTY:
                    results.append(result_from_json(json.loads(value)))
    if not results:
        return
    terminalreporter.write_sep("-", "ddp-conformance diagnosis")
    for line in opening_lines(results):
        terminalreporter.write_line(line)
    terminalreporter.write_line(closing_line(results))


def case_record(result: Result) -> dict[str, Any]:
    """The little of a result the diagnosis needs: verdict, cause, first failure, notes."""
    return {"scenario": result.scenario, "candidate": result.candidate,
            "verdict": result.verdict.value, "world_size": result.world_size,
            "duration_s": round(result.duration_s, 3), "reason": result.reason,
            "cause": result.cause, "notes": [n for n in result.notes if "**kwargs" in n],
            "failures": [{"check": f.check, "message": f.message} for f in result.failures[:1]]}


def _holder(config: pytest.Config) -> PytestSession:
    holder = config.stash.get(_SESSION_KEY, None)
    if holder is None:
        holder = config.stash[_SESSION_KEY] = PytestSession(config)
        config.pluginmanager.register(_Hooks(holder), "ddp_conformance_items")
    return holder


class ReportMerger:
    """pytest-xdist's controller with ``--ddp-report-dir``: the workers' parts merged into
    one report set at the end (:mod:`ddp_conformance.report.merge`)."""

    def __init__(self, directory: str) -> None:
        from ddp_conformance.report.merge import discard_parts

        self.directory = directory
        self.written: list[str] = []
        discard_parts(directory)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        from ddp_conformance.report.merge import merge_parts

        self.written = merge_parts(self.directory)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for path in self.written:
            terminalreporter.write_line(f"ddp-conformance: wrote {path}")


def check_options(config: pytest.Config) -> None:
    """Raise :class:`pytest.UsageError` (exit 4, one line) unless a session of these options
    can be made: the checks, candidates, backend, world size and expectations files of
    :class:`~ddp_conformance.session.Session`, no rank started."""
    from ddp_conformance.session import Session

    try:
        Session(run_config(config.getoption, PYTEST)).close()
        directory = config.getoption("ddp_report_dir")
        if directory:
            from ddp_conformance.report.files import check_writable

            check_writable(directory)
            config.pluginmanager.register(ReportMerger(directory), "ddp_conformance_reports")
    except UsageError as exc:
        raise pytest.UsageError(f"ddp-conformance: {exc}") from None


def make_items(collector: pytest.Collector, scenarios: list[Scenario]) -> list[pytest.Item]:
    """The items of one ``SCENARIOS`` list, validated as the loader validates the catalog."""
    from ddp_conformance.catalog.loader import validate

    _holder(collector.config)
    for scenario in scenarios:
        validate(scenario)
    if collector.config.getoption("ddp_collectives") == "only":
        return []
    candidates = collector.config.getoption("ddp_candidate") or ["torch"]
    return [ConformanceItem.from_parent(collector, name=f"{s.id}[{c}]", scenario=s, candidate=c)
            for s in scenarios for c in candidates]


def make_collective_items(collector: pytest.Collector,
                          cases: list[CollectiveCase]) -> list[pytest.Item]:
    """The items of one ``COLLECTIVES`` list, named ``<id>[<backend>]``, when the run checks
    the backend's collectives (none otherwise). Read from the options alone: a bad
    ``--backend`` is said in one line when the session starts, at the end of collection."""
    from ddp_conformance.config import RunConfig
    from ddp_conformance.contract.backend import BUILTIN, name_of

    _holder(collector.config)
    spec = collector.config.getoption("ddp_backend") or "gloo"
    collectives = collector.config.getoption("ddp_collectives") or "auto"
    backend = name_of(spec)
    if not RunConfig(collectives=collectives).runs_collectives(backend not in BUILTIN):
        return []
    return [ConformanceItem.from_parent(collector, name=f"{c.id}[{backend}]", scenario=c,
                                        candidate=backend) for c in cases]


class ScenarioFailed(Exception):
    """A verdict other than PASS, carrying the result for the report."""

    def __init__(self, result: Result) -> None:
        said = result.explanation_lines(10**6)
        super().__init__(said[0] if said else result.summary_line())
        self.result = result


class ConformanceItem(pytest.Item):
    def __init__(self, *, scenario: Scenario | CollectiveCase, candidate: str,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario = scenario
        self.candidate = candidate

    def runtest(self) -> None:
        holder = _holder(self.config)
        holder.catch_sigterm()
        if holder.guard is not None and holder.guard.taken is not None:
            holder.exit()  # interrupted, and pytest went on: its exit was lost
        holder.in_case = True
        try:
            result = holder.session.run_case(self.scenario, self.candidate)
        except Interrupted as exc:
            holder.stop(exc)
        except KeyboardInterrupt:  # pytest's SIGINT: end the ranks now, pytest does the rest
            assert holder.guard is not None
            holder.guard.interrupt(Interrupted(signal.SIGINT))
            raise
        finally:
            holder.in_case = False
        self.user_properties.append(("verdict", result.verdict.value))
        # What the terminal summary's diagnosis reads (pytest-xdist carries it to the controller).
        self.user_properties.append((CASE_PROPERTY, json.dumps(case_record(result))))
        if result.verdict is Verdict.PASS:
            return
        if result.verdict is Verdict.NA:
            pytest.skip(f"N/A: {result.reason}")
        if result.verdict is Verdict.XFAIL:
            pytest.xfail(f"{result.summary_line()} (expected: {result.expectation})")
        if result.verdict is Verdict.XPASS:
            # pytest's own XPASS, strict: the item fails with "[XPASS(strict)] passed,
            # though expected to fail (...): the expectation is stale".
            self.user_properties.append(("xpass", result.expectation or ""))
            self.add_marker(pytest.mark.xfail(reason=result.explanation_lines()[0],
                                              strict=True))
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
    """A failed case's evidence block, as pytest shows it: the command line's lines (the
    cause and why, the DDP rule), then one line per check for the failures the first
    line does not show (its first message, and how many more at which steps and ranks),
    then the ranks' tracebacks and stacks."""
    said = result.explanation_lines() or [""]
    rule_at = next((i for i, line in enumerate(said) if line.startswith(RULE_LABEL)), len(said))
    yield f"{result.verdict.value}: {result.case_id}: {said[0]}"
    yield from (f"  {line}" for line in said[1:rule_at])
    yield from said[max(rule_at, 1):]
    yield from _other_failures(result)
    for rank, tb in sorted(result.tracebacks.items()):
        yield f"--- rank {rank} traceback ---\n{tb}"
    for rank, stack in sorted(result.stacks.items()):
        yield f"--- rank {rank} stack ---\n{stack}"


def _other_failures(result: Result) -> Iterator[str]:
    """One line per check beyond what :meth:`Result.summary_line` said: its first message
    (unless already said) and how many more at which steps, ranks and tensors."""
    shown = result.summary_line()
    by_check: dict[str, list[Any]] = {}
    for failure in result.failures:
        by_check.setdefault(failure.check, []).append(failure)
    for check, failures in by_check.items():
        said = failures[0].message in shown
        rest = failures[1:]
        more = f"{len(rest)} more ({_spread(rest)})" if rest else ""
        if said and more:
            yield f"  {check}: {more}"
        elif not said:
            yield f"  {failures[0].message}" + (f"; {more}" if more else "")


def _spread(failures: list[Any]) -> str:
    """``steps 0-2, ranks 0-1, 2 tensors``: where ``failures`` lie."""
    parts = []
    for label, values in (("step", {f.step for f in failures if f.step is not None}),
                          ("rank", {f.rank for f in failures if f.rank is not None})):
        if values:
            low, high = min(values), max(values)
            parts.append(f"{label} {low}" if low == high else f"{label}s {low}-{high}")
    names = {f.name for f in failures if f.name}
    if names:
        parts.append(f"{len(names)} tensor{'s' if len(names) > 1 else ''}")
    return ", ".join(parts) or "same check"
