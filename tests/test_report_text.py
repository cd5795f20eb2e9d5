"""Golden texts of issue 24's report part: the rule under a failure (terminal, summary.md,
report.html), the check that explains a failure first, the desync line naming where the
ranks went out of step, no empty line after an XPASS, the line while reports are written;
and report.html: its size for a large failing run, anchors that exist, readable plots.

The expected texts are inline (``assertExpectedInline``); after an intended change::

    EXPECTTEST_ACCEPT=1 python -m pytest tests/test_report_text.py

and review the diff. Inputs are hand-built or normalised (durations, paths), so the texts
are deterministic.
"""
# The golden texts below are verbatim lines of output, however long they are.
# ruff: noqa: E501
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import expecttest

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.cli import progress_line
from ddp_conformance.judge.verdict import CheckFailure, Figure, Result, Verdict
from ddp_conformance.ranks.desync import diagnose
from ddp_conformance.ranks.flight import RankFlight
from ddp_conformance.report.errorplot import error_per_step
from ddp_conformance.report.html import render_html
from ddp_conformance.report.markdown import case_markdown

REPO = Path(__file__).resolve().parent.parent
DEFECTIVE = "tests.defective:SumsWithoutDividing"
RULES = {s.id: s.rule for s in load_catalog()}
#: How long the CLI run of four cases may take on a loaded machine.
RUN_DEADLINE_S = 300


def result(scenario: str, candidate: str, verdict: Verdict, **kwargs: Any) -> Result:
    """A result as the runner makes it: 2 ranks, gloo on the CPU, the scenario's rule."""
    return Result(scenario, candidate, verdict, world_size=2, backend="gloo", device="cpu",
                  rule=RULES.get(scenario, ""), **kwargs)


def fp16_failure() -> Result:
    """gradients/exact-fp16-near-range as a DDP that sums before dividing fails it."""
    return result(
        "gradients/exact-fp16-near-range", DEFECTIVE, Verdict.FAIL, duration_s=0.04,
        failures=[CheckFailure(
            "oracle.grad", "oracle.grad: step 0, rank 0, 'weight': 8 element(s) non-finite on "
            "one side only or with another value (NaN, +inf, -inf must match the oracle's "
            "position by position)", 0, 0, "weight")],
        figures=[Figure(f"{who}.grad", s, r, "weight", False, float("inf"), float("inf"),
                        float("inf"), 0.0)
                 for who in ("oracle", "reference") for s in range(2) for r in range(2)])


class TestTerminal(expecttest.TestCase):
    def test_a_failure_is_followed_by_its_rule(self) -> None:
        self.assertExpectedInline(progress_line(4, 4, fp16_failure()), """\
[4/4] FAIL    gradients/exact-fp16-near-range[tests.defective:SumsWithoutDividing] (0.04s)
    oracle.grad: step 0, rank 0, 'weight': 8 element(s) non-finite on one side only or with another value (NaN, +inf, -inf must match the oracle's position by position)
    rule: torch divides each gradient by the world size before summing over ranks, so the float16
          sum stays in range; summing first and dividing after overflows to inf.""")

    def test_an_xpass_says_the_expectation_is_stale_and_no_empty_line(self) -> None:
        xpass = result("gradients/mlp-sgd", "mine", Verdict.XPASS, duration_s=0.3,
                       expectation="sums before dividing (issue 12)")
        self.assertExpectedInline(progress_line(1, 2, xpass), """\
[1/2] XPASS   gradients/mlp-sgd[mine] (0.30s)
    passed, though expected to fail (sums before dividing (issue 12)): the expectation is stale""")

    def test_na_has_its_reason_and_no_rule(self) -> None:
        na = result("no-sync/window-of-3", "mine", Verdict.NA, duration_s=0.01,
                    reason="needs no_sync (the candidate has no no_sync method)")
        self.assertExpectedInline(progress_line(2, 2, na), """\
[2/2] N/A     no-sync/window-of-3[mine] (0.01s)
    needs no_sync (the candidate has no no_sync method)""")

    def test_a_run_prints_cause_first_rules_and_a_line_while_reports_are_written(self) -> None:
        """A real run: NeverBroadcastsBuffers leads with the missing broadcast (the cause),
        not the buffer drift it causes; every failure carries its rule; a line says the
        reports are being written before the matrix."""
        reports = tempfile.mkdtemp(prefix="report-text-")
        self.addCleanup(shutil.rmtree, reports, True)
        proc = subprocess.run(
            [sys.executable, "-m", "ddp_conformance", "run", "--timeout", "120",
             "--candidate", "tests.defective:NeverBroadcastsBuffers", "--candidate", DEFECTIVE,
             "-k", "exact-fp16-near-range or buffers/conv-bn-broadcast",
             "--report-dir", reports],
            cwd=REPO, capture_output=True, text=True, timeout=RUN_DEADLINE_S)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        text = re.sub(r"\(\d+\.\d+s\)", "(#s)", proc.stdout)
        text = re.sub(r"in \d+\.\d+s", "in #s", text).replace(reports, "REPORTS")
        text = re.sub(r"torch \S+$", "torch #", text, count=1, flags=re.M)
        self.assertExpectedInline(text, """\
ddp-conformance: 4 cases, 2 ranks, gloo/cpu, pool persistent, torch #
started 2 rank processes in #s
[1/4] FAIL    buffers/conv-bn-broadcast[tests.defective:NeverBroadcastsBuffers] (#s)
    [buffers-not-broadcast] rank 1 starts step 1's forward with its own buffers, expected rank 0's (not broadcast)
    replica.buffer_broadcast: step 1, rank 1, 'bn.running_mean': max abs error 0.0351 against rank 0's buffers at the same forward (max rel 6.13, 2.031e+09 ulp) exceeds bitwise equality
    rule: With broadcast_buffers=True (the default) DDP broadcasts rank 0's buffers, such as
          BatchNorm running statistics, to every rank before each forward that follows a synced one.
[2/4] FAIL    buffers/conv-bn-broadcast[tests.defective:SumsWithoutDividing] (#s)
    [no-division] every wrong gradient at step 0 is 2.000x the expected (= world size 2): summed without dividing
    oracle.grad: step 0, rank 0, 'conv.weight': max abs error 0.447 against the oracle (max rel 1, 8.389e+06 ulp) exceeds tolerance 1e-05 x max|expected| 0.493
    rule: After a synced backward every rank holds the average over ranks of the local gradients.
[3/4] PASS    gradients/exact-fp16-near-range[tests.defective:NeverBroadcastsBuffers] (#s)
[4/4] FAIL    gradients/exact-fp16-near-range[tests.defective:SumsWithoutDividing] (#s)
    [no-division] every wrong gradient at step 0 is 2.000x the expected (or overflowed to inf) (= world size 2): summed without dividing
    oracle.grad: step 0, rank 0, 'weight': 8 element(s) non-finite on one side only or with another value (NaN, +inf, -inf must match the oracle's position by position)
    rule: torch divides each gradient by the world size before summing over ranks, so the float16
          sum stays in range; summing first and dividing after overflows to inf.
writing reports to REPORTS ...
diagnosis of tests.defective:NeverBroadcastsBuffers: 1 cause for 1 unexpected verdict
  1. buffers-not-broadcast (1 case): rank 1 starts step 1's forward with its own buffers, expected rank 0's (not broadcast)
     shows in buffers; not in gradients
     look first at buffers/conv-bn-broadcast[tests.defective:NeverBroadcastsBuffers]: ddp-conformance repro buffers/conv-bn-broadcast --candidate tests.defective:NeverBroadcastsBuffers --world-size 2
diagnosis of tests.defective:SumsWithoutDividing: 1 cause for 2 unexpected verdicts
  1. no-division (2 cases): every wrong gradient at step 0 is 2.000x the expected (or overflowed to inf) (= world size 2): summed without dividing
     shows in buffers, gradients
     look first at gradients/exact-fp16-near-range[tests.defective:SumsWithoutDividing]: ddp-conformance repro gradients/exact-fp16-near-range --candidate tests.defective:SumsWithoutDividing --world-size 2

unexpected verdicts by cause:
  buffers-not-broadcast (1): buffers/conv-bn-broadcast[tests.defective:NeverBroadcastsBuffers]
  no-division (2): buffers/conv-bn-broadcast[tests.defective:SumsWithoutDividing], gradients/exact-fp16-near-range[tests.defective:SumsWithoutDividing]

check (first failed)      cases    causes
------------------------  -------  -----------------------
oracle.grad               2        no-division 2
replica.buffer_broadcast  1        buffers-not-broadcast 1

scenario                         tests.defective:NeverBroadcastsBuffers    tests.defective:SumsWithoutDividing
-------------------------------  ----------------------------------------  -------------------------------------
buffers/conv-bn-broadcast        FAIL                                      FAIL
gradients/exact-fp16-near-range  PASS                                      FAIL
FAIL 3, PASS 1 in #s; reports in REPORTS; first cause: buffers-not-broadcast (1 of tests.defective:NeverBroadcastsBuffers's cases); no-division (2 of tests.defective:SumsWithoutDividing's cases)
""")
        summary = Path(reports, "summary.md").read_text()
        assert "**Rule:** torch divides each gradient by the world size before summing" in summary
        html = Path(reports, "report.html").read_text()
        assert '<p class="rule"><b>Rule:</b> torch divides each gradient' in html


class TestSummaryMarkdown(expecttest.TestCase):
    def test_a_failure_section_has_its_rule(self) -> None:
        self.assertExpectedInline("\n".join(case_markdown(fp16_failure())), """\
#### FAIL `gradients/exact-fp16-near-range[tests.defective:SumsWithoutDividing]`

oracle.grad: step 0, rank 0, 'weight': 8 element(s) non-finite on one side only or with another value (NaN, +inf, -inf must match the oracle's position by position)

**Rule:** torch divides each gradient by the world size before summing over ranks, so the float16 sum stays in range; summing first and dividing after overflows to inf.

| check       |   first step | rank(s)   | parameter(s)   |   max abs |   max rel |   max ULP | tolerance (rtol)   |
|-------------|--------------|-----------|----------------|-----------|-----------|-----------|--------------------|
| oracle.grad |            0 | 0, 1      | weight         |       inf |       inf |       inf | bitwise            |
""")


def _flights(streams: dict[int, list[tuple[str, int, str, int, bool]]]) -> dict[int, RankFlight]:
    """Every rank's flight from (kind, numel, stage, step, done) per collective of group 0."""
    flights = {}
    for rank, launches in streams.items():
        flight = RankFlight()
        flight.feed(f"G 0 {','.join(map(str, sorted(streams)))}")
        for seq, (kind, numel, stage, step, done) in enumerate(launches, 1):
            flight.feed(f"L {seq} 0 {seq} {kind} float32 {numel} {stage} {step} "
                        f"{-1 if step < 0 else 0}")
            if done:
                flight.feed(f"D {seq} 0")
        flights[rank] = flight
    return flights


class TestDesyncLine(expecttest.TestCase):
    def test_it_names_where_the_ranks_went_out_of_step(self) -> None:
        """procedures/forward-twice-unused with a tutorial DDP (tests/newcomers.py): a hook
        per parameter, so rank 1, whose branch is unused, issues one allreduce fewer a
        step; the streams still pair up, a step apart, until rank 1 finishes and rank 0
        waits in #11. The line leads with #7, where they went out of step."""
        wrap = [("broadcast", 4, "wrap", -1, True)] * 4
        rank0 = wrap + [("allreduce", 4, "backward", 0, True), ("allreduce", 32, "backward", 0, True)] * 2 \
            + [("allreduce", 4, "backward", 1, True), ("allreduce", 32, "backward", 1, True),
               ("allreduce", 4, "backward", 1, False)]
        rank1 = wrap + [("allreduce", 4, "backward", s, True) if i % 2 == 0 else
                        ("allreduce", 32, "backward", s, True)
                        for s in range(3) for i in range(2)]
        found = diagnose(_flights({0: rank0, 1: rank1}), [0], {1: "finished the job"})
        assert found is not None
        self.assertExpectedInline(found.summary, """desync: the ranks went out of step at #7 of group 0 (rank 0 at step 0, microbatch 0, backward; rank 1 at step 1, microbatch 0, backward); rank 0 waits in allreduce(4 x float32) #11 of group 0 (step 1, microbatch 0, backward); rank 1 never issued #11: it finished the job""")
        self.assertExpectedInline(found.detail, """\
group 0 (ranks 0, 1), collectives #4-#11 of 11:
        rank 0                                                        | rank 1 (finished the job)
     4  broadcast(4 x float32) wrap                                   | broadcast(4 x float32) wrap
     5  allreduce(4 x float32) step 0, microbatch 0, backward         | allreduce(4 x float32) step 0, microbatch 0, backward
     6  allreduce(32 x float32) step 0, microbatch 0, backward        | allreduce(32 x float32) step 0, microbatch 0, backward
>>   7  allreduce(4 x float32) step 0, microbatch 0, backward         | allreduce(4 x float32) step 1, microbatch 0, backward
     8  allreduce(32 x float32) step 0, microbatch 0, backward        | allreduce(32 x float32) step 1, microbatch 0, backward
     9  allreduce(4 x float32) step 1, microbatch 0, backward         | allreduce(4 x float32) step 2, microbatch 0, backward
    10  allreduce(32 x float32) step 1, microbatch 0, backward        | allreduce(32 x float32) step 2, microbatch 0, backward
    11  allreduce(4 x float32) step 1, microbatch 0, backward [waits] | (nothing)

rank 1 finished the job (issues nothing more)""")

    def test_streams_in_step_keep_the_first_difference(self) -> None:
        stream = [("allreduce", 4, "backward", 0, True)]
        found = diagnose(_flights({0: stream + [("allreduce", 4, "backward", 1, False)],
                                   1: stream + [("broadcast", 4, "backward", 1, False)]}),
                         [0, 1], {})
        assert found is not None
        self.assertExpectedInline(found.summary, """desync: rank 0 waits in allreduce(4 x float32) #2 of group 0 (step 1, microbatch 0, backward); rank 1 waits in broadcast(4 x float32) #2 of group 0 (step 1, microbatch 0, backward); the streams differ first at #2 of group 0""")


RUN_INFO: dict[str, Any] = {
    "type": "run", "started": "2026-01-02T03:04:05+00:00", "torch": "2.13.0+cpu",
    "world_size": 2, "backend": "gloo", "device": "cpu",
    "candidates": [{"name": "torch", "version": "2.13.0+cpu", "description": ""},
                   {"name": "mine", "version": "", "description": ""}]}


def test_report_html_anchors_exist_and_the_run_table_has_no_empty_row() -> None:
    na = result("no-sync/window-of-3", "mine", Verdict.NA, reason="needs no_sync")
    html = render_html(RUN_INFO, [result("no-sync/window-of-3", "torch", Verdict.PASS), na,
                                  fp16_failure()], [])
    targets = set(re.findall(r'href="#([^"]+)"', html))
    ids = set(re.findall(r'id="([^"]+)"', html))
    assert targets and targets <= ids, targets - ids
    info = html[html.index('<table class="info">'):]
    assert info.split("\n")[1].startswith("<tr><td>torch<td>2.13.0+cpu"), info[:200]
    assert "<th></th>" not in html and "<tr><th><th>" not in html
    # A candidate without a description of its own shows none (not " — ").
    assert re.search(r"<tr><td>candidate mine<td>\(no version\)(\n|</table>)", html)


def test_a_plot_of_infinite_errors_says_so_and_its_text_is_readable() -> None:
    svg = error_per_step(fp16_failure())
    assert svg is not None
    assert "every error is inf: nothing to draw on a log scale" in svg
    sizes = [float(x) for x in re.findall(r'font-size="([\d.]+)"', svg)]
    assert sizes and min(sizes) >= 10, sizes
    assert "<polyline" not in svg  # nothing finite to draw


def test_the_candidate_description_is_its_own_docstring_or_none() -> None:
    from ddp_conformance.contract.ddp_like import ddp_like_candidate
    from tests.defective import SumsWithoutDividing
    from tests.newcomers import NewcomerDDP

    assert ddp_like_candidate("n", NewcomerDDP).description == ""  # not nn.Module's
    assert ddp_like_candidate("s", SumsWithoutDividing).description == (
        "Reduces gradients with a sum and never divides by the world size.")


#: The recorded run the size test models: ``ddp-conformance run --candidate torch
#: --candidate tests.defective:SumsWithoutDividing`` (336 cases: 188 PASS, 122 FAIL, 15
#: ERROR, 10 N/A, 1 XFAIL; a failing case averages 355 figures and 81 failure messages, a
#: passing one 220 figures). Its report.html was 4.47 MB before issue 24, 1.46 MB after.
REPORT_LIMIT_BYTES = 2_000_000
#: How many of the defective DDP's cases failed in that run (the catalog has grown since:
#: the rest of its scenarios are modelled passing).
FAILING = 123


def _modelled_case(scenario: str, candidate: str, failing: bool) -> Result:
    names = [f"layers.{p}.{w}" for p in range(3) for w in ("weight", "bias")]
    err = 0.0644 if failing else 2.3e-8
    figures = [Figure(f"{who}.{q}", s, r, n, not failing, err * (s + 1), err * 15,
                      8.4e6 if failing else 3.0, 1e-5)
               for who in ("oracle", "reference") for q in ("grad", "param")
               for s in range(4) for r in range(2) for n in names]
    figures += [Figure(c, s, r, n, True, 0.0, 0.0, 0.0, 0.0)
                for c in ("init.param", "replica.param", "replica.final") for n in names
                for s in range(4 if c == "replica.param" else 1) for r in range(2)]
    failures = [CheckFailure(f"{who}.{q}", f"{who}.{q}: step {s}, rank {r}, '{n}': max abs error "
                             f"{err * (s + 1):.3g} against the {who} (max rel 1, 8.389e+06 ulp) "
                             "exceeds tolerance 1e-05 x max|expected| 0.0926", s, r, n)
                for who in ("oracle", "reference") for q in ("grad", "param")
                for s in range(4) for r in range(2) for n in names][:81] if failing else []
    return result(scenario, candidate, Verdict.FAIL if failing else Verdict.PASS,
                  duration_s=0.3, figures=figures, failures=failures,
                  checks_run=["init.param", "oracle.grad", "oracle.param", "replica.param",
                              "replica.final", "reference.grad", "reference.param"])


def test_the_report_of_a_large_failing_run_stays_under_2_mb() -> None:
    """A run modelled on the recorded one (figures, failure messages, verdicts): every
    scenario of the catalog for torch (passing) and for a DDP that forgets to divide
    (failing where it did, 123 of 168), rendered in-process."""
    results = []
    for i, scenario in enumerate(sorted(RULES)):
        results.append(_modelled_case(scenario, "torch", failing=False))
        results.append(_modelled_case(scenario, DEFECTIVE, failing=i < FAILING))
    html = render_html(RUN_INFO, results, [])
    assert len(html.encode()) <= REPORT_LIMIT_BYTES, len(html.encode())
    assert html.count("<svg") == FAILING and html.count('<p class="rule">') == FAILING


def test_list_shows_each_scenario_with_its_rule() -> None:
    """``list`` prints the rule under the description, within the command's width (its
    layout is the command line's: the words are checked, not the columns)."""
    from ddp_conformance.catalog.listing import WIDTH, catalog_table

    text = catalog_table(load_catalog())
    assert max(map(len, text.splitlines())) <= WIDTH
    words = " ".join(text.split())
    for s in load_catalog():
        assert " ".join(f"rule: {s.rule}".split()[:6]) in words, s.id
