"""A candidate's diagnosis from its results, and the words of ERROR, CRASH and TIMEOUT causes."""
from __future__ import annotations

from ddp_conformance.judge.diagnose.causes import CaseCause, Cause
from ddp_conformance.judge.diagnose.endings import (
    backend_message,
    candidate_frame,
    ending_cause,
    user_words,
)
from ddp_conformance.judge.diagnose.findings import diagnose
from ddp_conformance.judge.verdict import CheckFailure, Result, Verdict
from ddp_conformance.report.diagnosis import closing_counts, closing_line, opening_lines

CAND = "pkg.mod:MyDDP"


def result(scenario: str, verdict: Verdict, code: str = "", duration: float = 1.0,
           check: str = "oracle.grad", notes: list[str] | None = None) -> Result:
    r = Result(scenario, CAND, verdict, 2, "gloo", "cpu", duration_s=duration,
               notes=notes or [])
    if verdict is Verdict.FAIL:
        r.failures = [CheckFailure(check, f"{check}: step 0, rank 0: wrong", 0, 0, "w")]
    if code:
        r.cause = CaseCause(next(c for c in Cause if c.value == code), f"{code} seen").to_json()
    return r


def test_findings_count_unexpected_verdicts_most_explanatory_first() -> None:
    results = [result("gradients/a", Verdict.FAIL, "no-division", 3.0),
               result("gradients/b", Verdict.FAIL, "no-division", 0.5),
               result("buckets/c", Verdict.FAIL, "no-division", 2.0),
               result("buffers/d", Verdict.FAIL, "buffers-not-broadcast"),
               result("join/e", Verdict.XFAIL, "join-divisor"),  # accepted: not diagnosed
               result("join/f", Verdict.PASS), result("no-sync/g", Verdict.NA)]
    (d,) = diagnose(results)
    assert [f.code for f in d.findings] == ["no-division", "buffers-not-broadcast"]
    first = d.findings[0]
    assert first.cases == 3 and d.unexpected == 4
    assert first.first_case == f"gradients/b[{CAND}]"  # the quickest case
    assert first.families == ["buckets", "gradients"]
    assert first.not_in == ["buffers", "join"]  # ran there, showed something else or nothing
    assert first.repro == f"ddp-conformance repro gradients/b --candidate {CAND} --world-size 2"
    record = d.to_json()
    assert record["type"] == "diagnosis" and record["findings"][0]["code"] == "no-division"


def test_no_unexpected_verdict_no_finding() -> None:
    (d,) = diagnose([result("gradients/a", Verdict.PASS), result("join/e", Verdict.XFAIL, "raises")])
    assert d.findings == []
    assert opening_lines([result("gradients/a", Verdict.PASS)]) == []


def test_a_case_without_a_cause_is_unexplained_with_its_line() -> None:
    (d,) = diagnose([result("gradients/a", Verdict.FAIL)])
    assert d.findings[0].code == "unexplained"
    assert "step 0, rank 0: wrong" in d.findings[0].summary


def test_the_kwargs_note_only_where_every_case_of_the_finding_has_it() -> None:
    note = "option bucket_cap_mb was taken only through **kwargs"
    (d,) = diagnose([result("buckets/a", Verdict.FAIL, "not-reduced", notes=[note]),
                     result("buckets/b", Verdict.FAIL, "not-reduced", notes=[note]),
                     result("gradients/c", Verdict.FAIL, "no-division", notes=[note]),
                     result("gradients/d", Verdict.FAIL, "no-division")])
    assert {f.code: f.note for f in d.findings} == {"not-reduced": note, "no-division": ""}


def test_closing_line_orders_failures_first() -> None:
    assert closing_counts({"PASS": 3, "N/A": 1, "FAIL": 2, "XFAIL": 1, "CRASH": 1, "ERROR": 1,
                           "TIMEOUT": 1}) == \
        "FAIL 2, ERROR 1, TIMEOUT 1, CRASH 1, N/A 1, XFAIL 1, PASS 3"
    line = closing_line([result("gradients/a", Verdict.FAIL, "no-division"),
                         result("gradients/b", Verdict.PASS)])
    assert line == f"FAIL 1, PASS 1; first cause: no-division (1 of {CAND}'s cases)"


def test_opening_lines_diagnosis_then_by_cause_then_by_check_then_na() -> None:
    text = "\n".join(opening_lines([result("gradients/a", Verdict.FAIL, "no-division"),
                                    result("no-sync/b", Verdict.NA)]))
    order = [text.index(s) for s in (f"diagnosis of {CAND}", "unexpected verdicts by cause",
                                     "check (first failed)", "not applicable")]
    assert order == sorted(order)


TRACEBACK = """Traceback (most recent call last):
  File "/x/ddp_conformance/ranks/engine.py", line 120, in run
    out = model(x)
  File "/home/u/proj/mypkg/ddp.py", line 42, in forward
    self.fail()
  File "/home/u/proj/mypkg/ddp.py", line 57, in fail
    helper()
  File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1, in helper
    raise RuntimeError("expected ProcessGroupGloo, got TracingProcessGroup")
RuntimeError: expected ProcessGroupGloo, got TracingProcessGroup
"""


def test_error_names_the_candidates_innermost_frame_and_no_harness_type() -> None:
    assert candidate_frame(TRACEBACK).endswith("mypkg/ddp.py:57 in fail")
    assert candidate_frame(TRACEBACK, ("/home/u/proj/mypkg/",)).endswith("ddp.py:57 in fail")
    r = Result("gradients/a", CAND, Verdict.ERROR, 2, "gloo", "cpu",
               reason="rank 1 raised RuntimeError: expected ProcessGroupGloo, got "
                      "TracingProcessGroup", tracebacks={1: TRACEBACK})
    cause = ending_cause(r, join=False)
    assert cause is not None and cause.code is Cause.RAISES
    assert "ddp.py:57 in fail" in cause.relation and "TracingProcessGroup" not in cause.relation
    assert user_words("a TracingProcessGroup") == \
        "a ProcessGroup (the backend's group, as the harness traces it)"


def test_crash_quotes_the_backends_last_message() -> None:
    log = ("(process died; end of its output)\nsome print\nterminate called after throwing an "
           "instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at pair.cc:446] Received "
           "data size doesn't match expected size\nFatal Python error: Aborted\n")
    assert backend_message(log).endswith("Received data size doesn't match expected size")
    assert backend_message("x\nFatal Python error: Aborted\n") == "Fatal Python error: Aborted"
    assert backend_message("just prints\n") == ""
    r = Result("gradients/a", CAND, Verdict.CRASH, 2, "gloo", "cpu",
               reason="rank 1 died with signal SIGABRT (6)", stacks={1: log})
    cause = ending_cause(r, join=False)
    assert cause is not None and cause.code is Cause.CRASH and "doesn't match" in cause.relation


def test_timeouts() -> None:
    in_c10d = ('Current thread 0x1 (most recent call first):\n  File "/t/torch/distributed/'
               'distributed_c10d.py", line 2810 in all_reduce\n  File "/p/m.py", line 3 in f\n')
    in_user = 'Current thread 0x1 (most recent call first):\n  File "/p/m.py", line 9 in spin\n'
    base = dict(scenario="gradients/a", candidate=CAND, verdict=Verdict.TIMEOUT, world_size=2,
                backend="gloo", device="cpu", reason="no progress")
    both = ending_cause(Result(**base, stacks={0: in_c10d, 1: in_c10d}), join=False)  # type: ignore[arg-type]
    assert both is not None and both.code is Cause.HANG_IN_COLLECTIVE
    one = ending_cause(Result(**base, stacks={0: in_c10d, 1: in_user}), join=False)  # type: ignore[arg-type]
    assert one is not None and one.code is Cause.HANG_OUTSIDE_COLLECTIVE and "m.py:9" in one.relation
    joined = ending_cause(Result(**base, stacks={0: in_c10d}), join=True)  # type: ignore[arg-type]
    assert joined is not None and joined.code is Cause.JOIN_NOT_SHADOWED
    raised = ending_cause(Result(**base, tracebacks={1: TRACEBACK}), join=False)  # type: ignore[arg-type]
    assert raised is not None and raised.code is Cause.RAISES


class _Report:
    def __init__(self, result: Result) -> None:
        import json

        from ddp_conformance.pytest_items import CASE_PROPERTY, case_record

        self.when = "call"
        self.user_properties = [("verdict", result.verdict.value),
                                (CASE_PROPERTY, json.dumps(case_record(result)))]


class _Terminal:
    def __init__(self, reports: list[_Report]) -> None:
        self.stats = {"failed": reports[:1], "passed": reports[1:]}
        self.lines: list[str] = []

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append(f"--- {title}")

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def test_the_pytest_summary_says_what_the_command_line_says() -> None:
    """The items' reports carry each case's verdict and cause (pytest-xdist brings them to
    the controller); the terminal summary prints the command line's opening lines."""
    from ddp_conformance.pytest_items import write_diagnosis

    results = [result("gradients/a", Verdict.FAIL, "no-division"), result("gradients/b", Verdict.PASS)]
    terminal = _Terminal([_Report(r) for r in results])
    write_diagnosis(terminal)
    assert terminal.lines[0] == "--- ddp-conformance diagnosis"
    assert terminal.lines[1:-1] == opening_lines(results)
    assert terminal.lines[-1] == closing_line(results)


def test_na_for_a_missing_capability_is_an_unsupported_feature_grouped_not_a_finding() -> None:
    lacks = Result("no-sync/a", CAND, Verdict.NA, 2, "gloo", "cpu", reason="candidate lacks no_sync")
    size = Result("groups/b", CAND, Verdict.NA, 2, "gloo", "cpu", reason="defined for world size 4")
    for r in (lacks, size):
        found = ending_cause(r, join=False)
        r.cause = found.to_json() if found else {}
    assert lacks.cause["code"] == "unsupported-feature" and not size.cause
    (d,) = diagnose([lacks, size])
    assert d.findings == []
    lines = opening_lines([lacks, size])
    assert f"  {CAND}: 1 N/A (unsupported-feature): candidate lacks no_sync" in lines
    assert f"  {CAND}: 1 N/A: defined for world size 4" in lines
