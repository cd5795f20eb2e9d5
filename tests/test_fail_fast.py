"""Fail fast (issue 23 item 3): ``--maxfail N`` / ``-x``, and the rule that a candidate
whose every case so far ended the same way before any collective is not waited on again
(ddp_conformance/ranks/endings.py). The first tests check the rule on outcomes made by hand;
the others run the command line on real ranks."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ddp_conformance.ranks.desync import Desync
from ddp_conformance.ranks.endings import THRESHOLD, Endings, HangMatcher, ending_of
from ddp_conformance.ranks.flight import Launch, RankFlight
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.outcome import Outcome

ROOT = Path(__file__).resolve().parent.parent
STACK = ('Current thread 0x00007f (most recent call first):\n'
         '  File "/x/threading.py", line 320 in wait\n'
         '  File "/t/stuck.py", line 17 in __init__\n')
OTHER_STACK = STACK.replace("line 17", "line 18")


def _job(candidate: str = "c") -> Job:
    from ddp_conformance.catalog.loader import load_catalog

    return Job("scenario", "", 60.0, scenario=load_catalog()[0], candidate=candidate)


def _hang(stack: str = STACK) -> Outcome:
    return Outcome("timeout", stacks={0: stack, 1: stack.replace("0x00007f", "0x00007e")})


def test_an_ending_counts_only_before_any_collective_with_the_trace_on() -> None:
    assert ending_of(_hang(), 0) is not None
    assert ending_of(_hang(), 1) is None  # a collective was launched
    assert ending_of(_hang(), None) is None  # the trace was off: unknown
    assert ending_of(Outcome("done"), 0) is None
    # Thread ids differ from rank to rank and case to case: not part of the ending.
    assert ending_of(_hang(), 0) == ending_of(Outcome("timeout", stacks={
        0: STACK.replace("0x00007f", "0x1"), 1: STACK}), 0)


def test_the_rest_is_not_run_after_threshold_identical_endings() -> None:
    endings = Endings()
    for _ in range(THRESHOLD):
        assert endings.cut(_job()) is None
        endings.record(_job(), _hang(), 0)
    skipped = endings.cut(_job())
    assert skipped is not None and skipped.status == "timeout"
    assert skipped.not_run.startswith(f"the first {THRESHOLD} cases of this candidate")
    assert "TIMEOUT: rank 0 at wait (threading.py:320))" \
        in skipped.not_run
    assert skipped.stacks == _hang().stacks  # the first case's evidence
    assert endings.cut(_job("other")) is None  # per candidate
    endings.cut(_job())
    assert endings.notes() == [
        f"c: 2 cases not run: its first {THRESHOLD} cases ended the same way before any "
        "collective (TIMEOUT: rank 0 at wait (threading.py:320); "
        f"first {_job().scenario.id})"]  # type: ignore[union-attr]


def test_any_other_ending_ends_the_streak_for_good() -> None:
    for other, collectives in [(Outcome("done"), 0), (_hang(OTHER_STACK), 0), (_hang(), 3),
                               (_hang(), None),
                               (Outcome("raised", tracebacks={0: "E: x"}), 0)]:
        endings = Endings()
        endings.record(_job(), _hang(), 0)
        endings.record(_job(), other, collectives)
        for _ in range(THRESHOLD):
            endings.record(_job(), _hang(), 0)
        assert endings.cut(_job()) is None and endings.hang(_job()) is None, other
    passed_first = Endings()  # a candidate that passes its first case is never cut short
    passed_first.record(_job(), Outcome("done"), 0)
    for _ in range(2 * THRESHOLD):
        passed_first.record(_job(), _hang(), 0)
    assert passed_first.cut(_job()) is None


def test_identical_raises_are_cut_and_a_released_peer_does_not_count() -> None:
    endings = Endings()
    raised = Outcome("raised", tracebacks={0: "Traceback\nRuntimeError: no", 1: "closed by "
                                           "remote"}, released={1})
    for _ in range(THRESHOLD):
        endings.record(_job(), raised, 0)
    skipped = endings.cut(_job())
    assert skipped is not None and skipped.status == "raised"
    assert "ERROR: rank 0 raised RuntimeError: no" in skipped.not_run


class _Stacks:
    def __init__(self, stack: str) -> None:
        self.stack = stack
        self.asked = 0

    def __call__(self, ranks: list[int]) -> dict[int, str]:
        self.asked += 1
        return {r: self.stack for r in ranks}


def _streak() -> Endings:
    endings = Endings()
    endings.record(_job(), _hang(), 0)
    return endings


def test_a_second_hang_at_the_same_frames_is_ended_after_two_looks() -> None:
    streak = _streak().hang(_job())
    assert streak is not None
    matcher = HangMatcher(streak, _Stacks(STACK))
    flights = {0: RankFlight(), 1: RankFlight()}
    now = time.monotonic()
    assert matcher.poll(flights, {0, 1}, now) is None  # not before the first look
    assert matcher.poll(flights, {0, 1}, now + 1.0) is None  # one look
    found = matcher.poll(flights, {0, 1}, now + 2.0)
    assert isinstance(found, Desync) and "before any collective" in found.summary


def test_a_hang_elsewhere_or_after_a_collective_keeps_its_deadline() -> None:
    streak = _streak().hang(_job())
    assert streak is not None
    now = time.monotonic()
    elsewhere = HangMatcher(streak, _Stacks(OTHER_STACK))
    assert all(elsewhere.poll({}, {0, 1}, now + t) is None for t in range(1, 6))
    launched = RankFlight()
    launched.launches[1] = Launch(1, "g", 1, "allreduce", "float32", 4, "backward", 0, -1)
    after = HangMatcher(streak, _Stacks(STACK))
    assert all(after.poll({0: launched}, {0, 1}, now + t) is None for t in range(1, 6))
    one_rank = HangMatcher(streak, _Stacks(STACK))  # the first hang held both ranks
    assert all(one_rank.poll({}, {0}, now + t) is None for t in range(1, 6))


# -- the command line, on real ranks ------------------------------------------------------


def _cli(tmp_path: Path, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess[str],
                                                                    list[dict[str, object]], float]:
    reports = tmp_path / "reports"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ddp_conformance", "run", "--report-dir",
                           str(reports), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    took = time.monotonic() - started
    lines = [json.loads(x) for x in (reports / "results.jsonl").read_text().splitlines() if x]
    return proc, lines, took


def test_maxfail_stops_after_n_unexpected_verdicts_with_the_reports_written(
        tmp_path: Path) -> None:
    for flag in (["--maxfail", "1"], ["-x"]):
        proc, lines, _ = _cli(tmp_path, "--candidate", "tests.defective:SumsWithoutDividing",
                              "-k", "gradients/mlp", *flag)
        results = [x for x in lines if x["type"] == "result"]
        planned = int(proc.stdout.split(" cases,")[0].rsplit(" ", 1)[-1])
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert [r["verdict"] for r in results][-1] == "FAIL"
        assert sum(r["verdict"] == "FAIL" for r in results) == 1 and planned > len(results)
        line = (f"stopped after 1 unexpected verdict (--maxfail 1): "
                f"{planned - len(results)} of {planned} cases not run")
        assert f"ddp-conformance: {line}" in proc.stdout.splitlines(), proc.stdout
        assert lines[-1]["type"] == "end" and lines[-1]["incomplete"] == line
        assert line in (tmp_path / "reports" / "summary.md").read_text()
    proc = subprocess.run([sys.executable, "-m", "ddp_conformance", "run", "--maxfail", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--maxfail must be at least 1" in proc.stderr


#: The hanging constructor's deadline (the default): a pool start, two more cases and their
#: replacements must fit in one more deadline, as the acceptance asks (catalog <= 2 x --timeout).
HANG_TIMEOUT_S = 60.0


def _not_run(results: list[dict[str, object]]) -> list[dict[str, object]]:
    return [r for r in results if str(r["reason"]).startswith("not run: ")]


def test_a_hanging_constructor_costs_one_deadline_not_one_per_case(tmp_path: Path) -> None:
    proc, lines, took = _cli(tmp_path, "--candidate", "tests.stuck_constructors:HangsInConstructor",
                             "--timeout", f"{HANG_TIMEOUT_S:g}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert took <= 2 * HANG_TIMEOUT_S, (took, proc.stdout[-3000:])
    results = [x for x in lines if x["type"] == "result"]
    ran = [r for r in results if r["verdict"] != "N/A"]
    assert all(r["verdict"] == "TIMEOUT" for r in ran), {r["verdict"] for r in ran}
    first, *again = ran[:THRESHOLD]
    assert f"no progress within {HANG_TIMEOUT_S:g}s" in str(first["reason"])
    assert all("hangs where this candidate's first case" in str(r["reason"]) for r in again)
    skipped = _not_run(results)
    assert len(skipped) == len(ran) - THRESHOLD > 50  # visible, every one of them
    assert any(f"{len(skipped)} cases not run" in x for x in lines[-1]["notes"]), lines[-1]  # type: ignore[union-attr]


def test_a_constructor_that_raises_the_same_error_is_reported_once_with_the_count(
        tmp_path: Path) -> None:
    proc, lines, _ = _cli(tmp_path, "--candidate", "tests.stuck_constructors:RaisesInConstructor",
                          "-k", "gradients or buckets")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = [x for x in lines if x["type"] == "result"]
    ran = [r for r in results if r["verdict"] != "N/A"]
    assert all(r["verdict"] == "ERROR" for r in ran)
    assert all("not run" not in str(r["reason"]) for r in ran[:THRESHOLD])
    skipped = _not_run(results)
    assert len(skipped) == len(ran) - THRESHOLD > 5
    assert "ERROR: rank 0 raised RuntimeError: this DDP runs on its own accelerator only" \
        in str(skipped[0]["reason"])
    assert f"{len(skipped)} cases not run" in proc.stdout


def test_a_candidate_that_fails_only_some_cases_runs_them_all(tmp_path: Path) -> None:
    proc, lines, _ = _cli(tmp_path, "--candidate", "tests.stuck_constructors:RaisesWithBuffers",
                          "-k", "buckets or batchnorm or buffers")
    results = [x for x in lines if x["type"] == "result"]
    verdicts = {str(r["verdict"]) for r in results}
    assert {"PASS", "ERROR"} <= verdicts, proc.stdout
    assert not _not_run(results) and "not run" not in proc.stdout
