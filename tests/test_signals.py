"""SIGTERM and SIGINT during a run leave partial reports and no process (docs/CONTRACT.md, "Hangs
and faults"; issue 10): the reports hold exactly the cases finished, marked incomplete,
every rank is gone, and the exit code is 143 (SIGTERM) or 1 (SIGINT). A parent killed with
SIGKILL leaves no rank either, and its results.jsonl renders as an incomplete run.

The process tests run the real command line (or pytest) as a subprocess on the whole
catalog, wait until a few cases have finished and at least 5 s have passed, signal it, and
check what it left. Every wait has a deadline. The first tests check the session's signal
logic itself, without ranks.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddp_conformance.config import RunConfig
from ddp_conformance.deadline import CLOSE_DEADLINE_S
from ddp_conformance.errors import EXIT_SIGINT, EXIT_SIGTERM, Interrupted
from ddp_conformance.interruption import REPEAT_GRACE_S, RUN_SIGNALS, RunGuard
from ddp_conformance.session import Session

ROOT = Path(__file__).resolve().parent.parent
WORKER = "ddp_conformance.ranks.worker"
ZYGOTE = "ddp_conformance.ranks.zygote_server"
#: The acceptance criterion: the signal comes at least this long into the run.
SIGNAL_AFTER_S = 5.0
#: Cases that must have finished before the signal (so "the finished cases" is not empty).
FINISHED_BEFORE_SIGNAL = 3
#: How long the run may take to get there (a loaded machine starts ranks slowly).
START_DEADLINE_S = 90.0
#: How long the interrupted run may take to write its reports and exit.
EXIT_DEADLINE_S = 20.0
#: How long the ranks may outlive the run's exit (the kernel reaps them at once).
RANKS_GONE_DEADLINE_S = 5.0
PROGRESS = re.compile(r"^\[\s*\d+/(\d+)\] (\S+)\s+(\S+) \(")
PYTEST_PASSED = re.compile(r"::(\S+) PASSED")


@pytest.fixture
def guard() -> Iterator[RunGuard]:
    """The guard of a session whose ranks never start (the pool starts on the first case)."""
    made = RunGuard(Session(RunConfig()), RUN_SIGNALS)
    try:
        yield made
    finally:
        made.restore()
        made.close()


def test_signals_are_caught_for_the_run_only(guard: RunGuard) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert guard.session.guard is guard
    assert guard.catch()
    assert all(signal.getsignal(s) == guard.on_signal for s in before)
    guard.restore()
    assert {s: signal.getsignal(s) for s in before} == before
    caught: list[bool] = []
    thread = threading.Thread(target=lambda: caught.append(guard.catch()))
    thread.start()
    thread.join(10)
    assert caught == [False]  # Python delivers signals to the main thread only


def test_an_interrupt_is_raised_until_taken_then_further_signals_are_ignored(
        guard: RunGuard) -> None:
    with pytest.raises(Interrupted) as first:
        guard.on_signal(signal.SIGTERM)
    assert first.value.exit_code == EXIT_SIGTERM == 143 and str(first.value) == \
        "interrupted by SIGTERM"
    guard.on_signal(signal.SIGINT)  # right after: the same request, on its way out
    # Lost (raised inside a finalizer, say): the next case raises it again ...
    with pytest.raises(Interrupted):
        guard.check()
    # ... and so does a further signal once the grace has passed.
    guard._raised_at -= REPEAT_GRACE_S
    with pytest.raises(Interrupted) as again:
        guard.on_signal(signal.SIGINT)
    assert again.value.signum == signal.SIGTERM  # the first signal decides the exit code
    guard.session.planned = 128
    guard.interrupt(again.value)
    assert guard.session.incomplete == "interrupted by SIGTERM after 0 of 128 cases"
    guard._raised_at -= REPEAT_GRACE_S
    guard.on_signal(signal.SIGTERM)  # taken: the run is ending, nothing cuts it short
    guard.check()


def test_a_signal_while_a_case_is_recorded_comes_after_it(guard: RunGuard) -> None:
    with guard.deferring():
        guard.on_signal(signal.SIGINT)  # held back: the case is half recorded
    with pytest.raises(Interrupted) as info:
        guard.check()
    assert info.value.exit_code == EXIT_SIGINT == 1


def test_the_guard_takes_the_interruption_that_ends_its_block_and_closes(
        tmp_path: Path) -> None:
    session = Session(RunConfig())
    with RunGuard(session, RUN_SIGNALS, str(tmp_path)) as guard:
        session.planned = 3
        assert signal.getsignal(signal.SIGTERM) == guard.on_signal
        guard.on_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) != guard.on_signal  # restored
    assert guard.taken is not None and session._closed
    assert guard.ending() == ("ddp-conformance: interrupted by SIGTERM after 0 of 3 cases; "
                              "no reports written", 143)
    quiet = RunGuard(Session(RunConfig()), RUN_SIGNALS, str(tmp_path))
    with pytest.raises(ValueError), quiet:
        raise ValueError("not an interruption: it goes on, after closing")
    assert quiet.session._closed and quiet.ending() is None


def rank_pids(parent: int) -> list[int]:
    """The rank processes the run with pid ``parent`` started (alive or zombie), and its
    zygote."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        # A rank forked from the zygote has the zygote's command line: both are the run's.
        if (WORKER in args or ZYGOTE in args) and "--parent-pid" in args:
            i = args.index("--parent-pid")
            if i + 1 < len(args) and args[i + 1] == str(parent):
                pids.append(int(entry))
    return pids


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie is dead: it only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_until(condition: Callable[[], bool], deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Run:
    """A subprocess whose stdout lines are collected as they come (by a thread, so that
    no read blocks the test past a deadline); stderr goes to a file."""

    def __init__(self, args: list[str], tmp_path: Path) -> None:
        self.stderr_path = tmp_path / "stderr.txt"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=err, text=True)
        self.started = time.monotonic()
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for_cases(self, count: Callable[[list[str]], int]) -> None:
        """Until ``count(lines)`` cases finished and :data:`SIGNAL_AFTER_S` passed."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                return True
            return (count(list(self.lines)) >= FINISHED_BEFORE_SIGNAL
                    and time.monotonic() - self.started >= SIGNAL_AFTER_S)

        assert wait_until(ready, START_DEADLINE_S), \
            f"fewer than {FINISHED_BEFORE_SIGNAL} cases in {START_DEADLINE_S}s: {self.lines}"
        assert self.proc.poll() is None, f"the run ended early ({self.proc.returncode}): " \
            f"{self.lines}\n{self.stderr()}"

    def exit_code(self) -> int:
        try:
            return self.proc.wait(timeout=EXIT_DEADLINE_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within {EXIT_DEADLINE_S}s of the signal: {self.stderr()}")

    def output(self) -> list[str]:
        """stdout, once the process ended."""
        self._reader.join(timeout=5.0)
        return list(self.lines)

    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def end(self) -> None:
        """Whatever happened: no process of this test outlives it."""
        ranks = rank_pids(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def assert_no_rank_left(parent: int, ranks: list[int]) -> None:
    """``ranks`` (seen while the run was alive), and any rank of ``parent`` started later,
    are gone (or zombies) shortly after the run ended."""
    def gone() -> bool:
        return not any(alive(p) for p in {*ranks, *rank_pids(parent)})

    survivors = [] if wait_until(gone, RANKS_GONE_DEADLINE_S) else \
        [p for p in {*ranks, *rank_pids(parent)} if alive(p)]
    assert not survivors, f"rank processes {survivors} outlived the run"


def cli_progress(lines: list[str]) -> list[str]:
    """The case ids of the progress lines ``[  3/128] PASS    case (0.92s)``."""
    return [m.group(3) for m in map(PROGRESS.match, lines) if m]


def results_lines(directory: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in (directory / "results.jsonl").read_text().splitlines() if x]


def junit_cases(path: Path) -> tuple[ET.Element, list[str]]:
    suite = ET.parse(path).getroot()
    if suite.tag == "testsuites":  # pytest's
        suite = suite.find("testsuite")  # type: ignore[assignment]
    return suite, [c.get("name", "") for c in suite.iter("testcase")]


def start_cli(tmp_path: Path) -> tuple[Run, Path]:
    reports = tmp_path / "reports"
    run = Run(["-m", "ddp_conformance", "run", "--report-dir", str(reports),
               "--candidate", "torch", "--candidate", "reference"], tmp_path)
    return run, reports


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 1)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_leaves_the_finished_cases_reported_and_no_rank(
        signum: int, code: int, tmp_path: Path) -> None:
    run, reports = start_cli(tmp_path)
    try:
        run.wait_for_cases(lambda lines: len(cli_progress(lines)))
        ranks = rank_pids(run.proc.pid)
        assert len(ranks) >= 2 and all(alive(p) for p in ranks), ranks  # world size 2
        run.proc.send_signal(signum)
        time.sleep(0.3)  # a second signal, while the reports are written: ignored
        run.proc.send_signal(signum)
        assert run.exit_code() == code, run.stderr()
        assert_no_rank_left(run.proc.pid, ranks)
    finally:
        run.end()
    seen = cli_progress(run.output())
    planned = next(int(m[1]) for m in map(PROGRESS.match, run.output()) if m)
    name = signal.Signals(signum).name

    lines = results_lines(reports)
    recorded = [f"{x['scenario']}[{x['candidate']}]" for x in lines if x["type"] == "result"]
    reason = f"interrupted by {name} after {len(recorded)} of {planned} cases"
    stderr = run.stderr()
    assert "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == \
        f"ddp-conformance: {reason}; partial reports in {reports}", stderr
    # Exactly the finished cases: a case is recorded and its progress line printed before
    # a signal that comes meanwhile is raised.
    assert recorded == seen and FINISHED_BEFORE_SIGNAL <= len(recorded) < planned
    assert lines[-1]["type"] == "end" and lines[-1]["incomplete"] == reason

    suite, names = junit_cases(reports / "junit.xml")
    assert names == recorded and suite.get("tests") == str(len(recorded))
    assert [(p.get("name"), p.get("value")) for p in suite.iter("property")] == \
        [("incomplete", reason)]
    summary = (reports / "summary.md").read_text()
    assert f"**Incomplete run**: {reason}; the verdicts below are the finished cases only." \
        in summary.splitlines()[:4]
    assert f"Incomplete run</b>: {reason}" in (reports / "report.html").read_text()


def test_a_killed_run_leaves_no_rank_and_its_results_render_as_incomplete(
        tmp_path: Path) -> None:
    run, reports = start_cli(tmp_path)
    try:
        run.wait_for_cases(lambda lines: len(cli_progress(lines)))
        ranks = rank_pids(run.proc.pid)
        assert len(ranks) >= 2, ranks
        run.proc.kill()
        assert run.exit_code() == -signal.SIGKILL
        assert_no_rank_left(run.proc.pid, ranks)
    finally:
        run.end()
    assert not (reports / "summary.md").exists()
    recorded = [x for x in results_lines(reports) if x["type"] == "result"]
    proc = subprocess.run([sys.executable, "-m", "ddp_conformance", "report", str(reports)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    reason = "the run ended without its end record"
    assert f"**Incomplete run**: {reason};" in (reports / "summary.md").read_text()
    suite, names = junit_cases(reports / "junit.xml")
    assert len(names) == len(recorded) >= FINISHED_BEFORE_SIGNAL
    assert [p.get("value") for p in suite.iter("property")] == [reason]


def test_sigterm_ends_a_pytest_run_with_143_and_its_junit(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    run = Run(["-m", "pytest", "suites", "-v", "-p", "no:cacheprovider", "-p", "no:xdist",
               "-p", "no:randomly", f"--junitxml={junit}", "--rootdir", str(ROOT)], tmp_path)
    try:
        run.wait_for_cases(lambda lines: sum(bool(PYTEST_PASSED.search(x)) for x in lines))
        ranks = rank_pids(run.proc.pid)
        assert len(ranks) >= 2, ranks
        run.proc.send_signal(signal.SIGTERM)
        assert run.exit_code() == 143, run.output()[-20:]
        assert_no_rank_left(run.proc.pid, ranks)
    finally:
        run.end()
    output = run.output()
    seen = [m[1] for m in map(PYTEST_PASSED.search, output) if m]
    assert any("ddp-conformance: interrupted by SIGTERM after" in x for x in output), output[-10:]
    assert not any("INTERNALERROR" in x for x in output), output[-30:]
    _, names = junit_cases(junit)
    # pytest's terminal and JUnit each log an item; SIGTERM may come between the two.
    assert len(names) >= FINISHED_BEFORE_SIGNAL and len(set(seen) ^ set(names)) <= 1, \
        (seen, names)


#: The defective DDP that fails most of the catalog (116 FAIL at 2 ranks on torch 2.13).
FAILING_EVERYWHERE = "tests.defective:SumsWithoutDividing"
#: How long its whole catalog may take on a loaded machine (about 80 s on 2 busy cores).
CATALOG_DEADLINE_S = 600.0
#: The exit after the deadline's own exit: the kernel ends the process at once.
EXIT_MARGIN_S = 5.0


def end_line_written(reports: Path) -> bool:
    """Whether results.jsonl ends with its end record: the run has begun writing the
    report set (:meth:`ResultsWriter.close` writes it first). Reads the tail only."""
    try:
        with open(reports / "results.jsonl", "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        return False
    return tail.endswith("\n") and '"type": "end"' in tail.rstrip("\n").rsplit("\n", 1)[-1]


def assert_whole_report_set(reports: Path) -> list[dict[str, object]]:
    """Every report file there and complete, no temporary file left; the records."""
    assert sorted(os.listdir(reports)) == ["junit.xml", "report.html", "results.jsonl",
                                           "summary.md"], os.listdir(reports)
    lines = results_lines(reports)
    recorded = [x for x in lines if x["type"] == "result"]
    assert lines[-1]["type"] == "end"
    suite, names = junit_cases(reports / "junit.xml")
    assert len(names) == len(recorded) and suite.get("tests") == str(len(recorded))
    assert (reports / "report.html").read_text().rstrip().endswith("</body></html>")
    summary = (reports / "summary.md").read_text()
    assert summary.startswith("# ") and summary.endswith("\n"), summary[-200:]
    return recorded


def test_sigterm_while_a_large_failing_run_writes_its_reports_ends_it_in_time(
        tmp_path: Path) -> None:
    """Issue 29: the reports of a 90-FAIL run took 56-142 s, and a signal meanwhile
    waited for them (or the watchdog left a 0-byte report.html). The signal comes once
    results.jsonl has its end line and before report.html exists: while the report set
    is written. The run still exits within the deadline with every file whole."""
    reports = tmp_path / "reports"
    run = Run(["-m", "ddp_conformance", "run", "--report-dir", str(reports), "--candidate",
               FAILING_EVERYWHERE, "--timeout", "120"], tmp_path)
    try:
        assert wait_until(lambda: end_line_written(reports) or run.proc.poll() is not None,
                          CATALOG_DEADLINE_S), "the catalog did not end in time"
        ranks = rank_pids(run.proc.pid)
        run.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        assert not (reports / "report.html").exists(), \
            "report.html was written before the signal: the window was missed"
        assert run.proc.poll() is None or run.proc.returncode == 143, run.stderr()
        try:
            code = run.proc.wait(timeout=CLOSE_DEADLINE_S + EXIT_MARGIN_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"no exit within {CLOSE_DEADLINE_S}s of SIGTERM: {run.stderr()}")
        took = time.monotonic() - signalled
        assert code == 143 and took <= CLOSE_DEADLINE_S + EXIT_MARGIN_S, (code, took)
        assert_no_rank_left(run.proc.pid, ranks)
    finally:
        run.end()
    stderr = run.stderr()
    assert "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == \
        f"ddp-conformance: interrupted by SIGTERM at the end of the run; reports in {reports}"
    recorded = assert_whole_report_set(reports)
    assert sum(x["verdict"] == "FAIL" for x in recorded) >= 90


#: A run whose report set outlasts a 1 s deadline: one report is written, the next never
#: ends (a stand-in for a report too slow for the deadline, which the report set itself no
#: longer is). Real signal, real watchdog, real files; no rank.
SLOW_REPORT = """
import os, signal, sys, time
from ddp_conformance.errors import Interrupted
from ddp_conformance.config import RunConfig
from ddp_conformance.interruption import RUN_SIGNALS, RunGuard
from ddp_conformance.report.files import ReportFiles
from ddp_conformance.session import Session

directory = sys.argv[1]
session = Session(RunConfig())
session.planned = 7
session.report_files = files = ReportFiles()
guard = RunGuard(session, RUN_SIGNALS, directory, deadline_s=1.0)
guard.catch()
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
except Interrupted as exc:
    guard.interrupt(exc)
files.write_text(os.path.join(directory, "summary.md"), lambda: "# done\\n")
with files.writing(os.path.join(directory, "junit.xml")) as temp:
    with open(temp, "w") as f:
        f.write("<testsuite")
        f.flush()
        time.sleep(60)
print("not reached")
"""


def test_the_deadline_abandons_the_report_being_written_and_says_what_was_written(
        tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SLOW_REPORT, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143 and "not reached" not in proc.stdout, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ddp-conformance: interrupted by SIGTERM after 0 of 7 cases; ending the run took "
        f"longer than 1s: exiting with results.jsonl (0 cases), summary.md in {tmp_path}; "
        "not written: junit.xml, report.html"], proc.stderr
    assert os.listdir(tmp_path) == ["summary.md"]  # no half junit.xml, no temporary file
