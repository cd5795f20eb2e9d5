"""The report set: loading results back, rendering (Markdown, JUnit, HTML), the
failure evidence a person needs, the regression comparison, and the bandwidth arithmetic."""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from ddp_conformance.bench.stats import busbw as bus_bandwidth
from ddp_conformance.bench.stats import quartiles, round_ratios
from ddp_conformance.cli import main
from ddp_conformance.judge.verdict import CheckFailure, Figure, Result, Verdict
from ddp_conformance.report import load_results, write_report_set
from ddp_conformance.report.common import divergences, per_parameter
from ddp_conformance.report.compact import figures_from, worst
from ddp_conformance.report.compare import classify_timing, classify_verdict, compare_dirs
from ddp_conformance.report.load import NO_END_RECORD
from ddp_conformance.report.stream import ResultsWriter

INFO: dict[str, Any] = {"type": "run", "started": "2026-01-01T00:00:00+00:00", "torch": "2.13.0",
                        "python": "3.11", "platform": "linux", "host": "h", "cpu_count": 2,
                        "backend": "gloo", "device": "cpu", "devices": ["cpu"], "world_size": 2,
                        "project_git": {"commit": "a" * 40, "dirty": True, "root": "/x"},
                        "candidates": [{"name": "torch", "version": "2.13", "description": "d",
                                        "git": None}], "argv": ["ddp-conformance", "run"]}
TRACE_DETAIL = "step 1   candidate            reference\n  #0   allreduce f32 96   allreduce f32 96\n" \
               "> #1   allreduce f32 96   (none)"


def fig(check: str, step: int, rank: int, name: str, err: float, tol: float = 1e-5) -> Figure:
    return Figure(check, step, rank, name, err <= tol, err, err * 10, err * 1e7, tol)


def sample_results() -> list[Result]:
    ok = Result("gradients/mlp", "torch", Verdict.PASS, 2, "gloo", "cpu", 0.1,
                figures=[fig("oracle.grad", s, r, "0.weight", 1e-8) for s in range(3) for r in range(2)],
                checks_run=["oracle.grad"])
    figures = [fig("oracle.grad", s, r, n, 0.0 if s < 2 else 0.5 * (s - 1) * (r + 1))
               for s in range(4) for r in range(2) for n in ("0.weight", "0.bias")]
    figures += [fig("reference.grad", s, r, "0.weight", 0.0 if s < 2 else 0.25)
                for s in range(4) for r in range(2)]
    bad = Result("gradients/mlp", "bad", Verdict.FAIL, 2, "gloo", "cpu", 0.2, figures=figures,
                 failures=[CheckFailure("oracle.grad",
                                        "oracle.grad: step 2, rank 1, '0.weight': max abs error 1",
                                        2, 1, "0.weight"),
                           CheckFailure("trace.order", "trace.order: step 1 differs", 1, 0, None,
                                        **({"detail": TRACE_DETAIL} if _has_detail() else {}))],
                 checks_run=["oracle.grad", "reference.grad", "trace.order"])
    err = Result("join/uneven", "bad", Verdict.ERROR, 2, "gloo", "cpu", 0.3,
                 reason="rank 1 raised RuntimeError: boom",
                 tracebacks={1: "Traceback (most recent call last):\n  File \"x.py\", line 3\n"
                                "RuntimeError: boom"})
    hang = Result("join/hang", "bad", Verdict.TIMEOUT, 2, "gloo", "cpu", 8.0, reason="no progress",
                  stacks={0: "File \"ddp.py\", line 9 in wait", 1: "File \"join.py\", line 4 in main_hook"})
    na = Result("join/hang", "torch", Verdict.NA, 2, "gloo", "cpu", reason="needs join")
    return [ok, bad, err, hang, na]


def _has_detail() -> bool:
    import dataclasses

    return "detail" in {f.name for f in dataclasses.fields(CheckFailure)}


def write_run(directory: Path, results: list[Result], bench: dict[str, Any] | None = None) -> Path:
    if bench is not None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "bench.json").write_text(json.dumps(bench))
    writer = ResultsWriter(str(directory), dict(INFO))
    for r in results:
        writer.add(r)
    writer.close(["a note"])
    return directory


def test_results_round_trip_through_jsonl(tmp_path: Path) -> None:
    results = sample_results()
    run = load_results(str(write_run(tmp_path, results)))
    assert run.complete and run.notes == ["a note"] and run.info["world_size"] == 2
    # Every case whole, but a passing one's figures: the worst per check and tensor, over
    # steps and ranks (step and rank -1: report/compact.py; tests/test_compact_records.py).
    passed = [r for r in results if r.verdict is Verdict.PASS and r.figures]
    assert passed
    for r in passed:
        r.figures = figures_from(worst(r.figures))
        assert {(g.step, g.rank) for g in r.figures} == {(-1, -1)}
    assert [r.to_json() for r in run.results] == [r.to_json() for r in results]
    assert run.results[2].tracebacks[1].endswith("boom")  # rank keys are ints again


def test_a_run_that_died_loads_what_it_wrote(tmp_path: Path) -> None:
    lines = [json.dumps(INFO), json.dumps({"type": "result", **sample_results()[0].to_json()}),
             '{"type": "result", "scen']  # cut in the middle of a line
    (tmp_path / "results.jsonl").write_text("\n".join(lines))
    run = load_results(str(tmp_path))
    assert not run.complete and len(run.results) == 1
    assert run.incomplete == NO_END_RECORD
    write_report_set(str(tmp_path))
    assert_marked_incomplete(tmp_path, NO_END_RECORD, cases=1)


def assert_marked_incomplete(directory: Path, reason: str, cases: int) -> None:
    """summary.md says it first, junit.xml as a suite property with the finished cases'
    counts, report.html in a banner."""
    summary = (directory / "summary.md").read_text().splitlines()
    assert summary[0] == "# ddp-conformance summary"
    assert summary[2].startswith("**Incomplete run**: " + reason), summary[:4]
    suite = ET.parse(directory / "junit.xml").getroot()
    marks = [p.get("value") for p in suite.iter("property") if p.get("name") == "incomplete"]
    assert marks == [reason]
    assert suite.get("tests") == str(cases) and len(suite.findall("testcase")) == cases
    html = (directory / "report.html").read_text()
    assert "Incomplete run</b>: " + reason in html


def test_an_interrupted_run_is_marked_incomplete_and_stays_so(tmp_path: Path) -> None:
    results = sample_results()[:2]
    writer = ResultsWriter(str(tmp_path), dict(INFO))
    for r in results:
        writer.add(r)
    reason = "interrupted by SIGTERM after 2 of 9 cases"
    writer.close(["a note"], incomplete=reason)
    assert_marked_incomplete(tmp_path, reason, cases=2)
    run = load_results(str(tmp_path))
    assert run.incomplete == reason and not run.complete and len(run.results) == 2
    for name in ("summary.md", "junit.xml", "report.html"):
        (tmp_path / name).unlink()
    write_report_set(str(tmp_path))  # `ddp-conformance report DIR` keeps the mark
    assert_marked_incomplete(tmp_path, reason, cases=2)


def test_a_complete_run_has_no_incomplete_mark(tmp_path: Path) -> None:
    write_run(tmp_path, sample_results())
    assert load_results(str(tmp_path)).incomplete is None
    assert "Incomplete" not in (tmp_path / "summary.md").read_text()
    assert "Incomplete" not in (tmp_path / "report.html").read_text()
    assert not [p for p in ET.parse(tmp_path / "junit.xml").getroot().iter("property")
                if p.get("name") == "incomplete"]


def test_divergence_names_check_first_step_ranks_parameters_and_figures() -> None:
    divs = {d.check: d for d in divergences(sample_results()[1])}
    grad = divs["oracle.grad"]
    assert grad.first_step == 2 and grad.ranks == [0, 1] and grad.names == ["0.weight", "0.bias"]
    assert grad.max_abs == pytest.approx(2.0) and grad.max_rel == pytest.approx(20.0)  # worst: step 3
    assert grad.tolerance == 1e-5 and grad.failing_figures == 8
    trace = divs["trace.order"]
    assert trace.first_step == 1 and trace.ranks == [0] and trace.max_abs is None
    if _has_detail():
        assert trace.details == [TRACE_DETAIL]
    rows = {(r[0], r[1]): r for r in per_parameter(sample_results()[1].figures)}
    assert rows[("reference.grad", "0.weight")][-1] == "4/8 failed"


def test_report_set_has_matrix_failure_evidence_and_is_self_contained(tmp_path: Path) -> None:
    write_run(tmp_path, sample_results())
    names = sorted(os.listdir(tmp_path))
    assert names == ["junit.xml", "report.html", "results.jsonl", "summary.md"]
    html = (tmp_path / "report.html").read_text()
    assert "<script" not in html and not re.search(r"""(src|href)=["']?(https?:)?//""", html)
    # The failing case's error-per-step plot, inline SVG: oracle solid, reference dashed.
    assert html.count("<svg") == 1 and "data:image/png" not in html
    svg = html[html.index("<svg"):html.index("</svg>")]
    assert svg.count("<polyline") == 3 and svg.count('stroke-dasharray="4 3"><title>0.weight '
                                                     "vs reference") == 1
    assert "grad: error per step" in svg and "param: error" not in svg
    for text in ("gradients/mlp[bad]", "0.weight", "oracle.grad", "RuntimeError: boom",
                 "join.py", "main_hook", "needs join", "aaaaaaaaaaaa (dirty)"):
        assert text in html, text
    if _has_detail():
        assert "&gt; #1   allreduce f32 96   (none)" in html  # the trace side by side, verbatim
    assert 'href="#case-gradients-mlp-bad-"' in html  # matrix cell links to the evidence
    md = (tmp_path / "summary.md").read_text()
    assert re.search(r"\| oracle.grad +\| +2 +\| 0, 1 +\| 0.weight, 0.bias", md), md
    assert "RuntimeError: boom" in md
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert suite.get("tests") == "5" and suite.get("failures") == "1" and suite.get("errors") == "2"
    failure = suite.find("testcase[@name='gradients/mlp[bad]']/failure")
    assert failure is not None and "first at step 2, rank(s) 0, 1" in (failure.text or "")


def test_report_command_rerenders_the_same_set(tmp_path: Path) -> None:
    write_run(tmp_path, sample_results())
    before = {n: (tmp_path / n).read_text() for n in ("summary.md", "junit.xml")}
    for n in ("summary.md", "junit.xml", "report.html"):
        (tmp_path / n).unlink()
    assert main(["report", str(tmp_path)]) == 0
    assert {n: (tmp_path / n).read_text() for n in before} == before
    assert (tmp_path / "report.html").exists()
    assert main(["report", str(tmp_path / "nowhere")]) == 2


@pytest.mark.parametrize("old, new, kind", [
    ("PASS", "FAIL", "regressed"), ("XFAIL", "CRASH", "regressed"), (None, "ERROR", "regressed"),
    ("FAIL", "PASS", "improved"), ("PASS", "N/A", "changed"), ("FAIL", "ERROR", "changed"),
    ("PASS", None, "gone"), (None, "PASS", "new"), ("PASS", "PASS", None),
])
def test_verdict_changes(old: str | None, new: str | None, kind: str | None) -> None:
    assert classify_verdict(old, new) == kind


def test_timing_change_must_exceed_the_combined_iqrs() -> None:
    assert classify_timing((10.0, 9.0, 11.0), (13.0, 12.5, 13.5)) == "within noise"  # 3 <= 2 + 1
    assert classify_timing((10.0, 9.5, 10.5), (12.1, 11.6, 12.6)) == "slower"       # 2.1 > 2
    assert classify_timing((10.0, 9.5, 10.5), (7.0, 6.9, 7.1)) == "faster"


def bench_json(step: float, spread: float) -> dict[str, Any]:
    rounds = [[step - spread, step, step + spread] for _ in range(4)]
    cand = {"rounds": rounds, "phases": {"forward": [0.1], "backward": [0.2], "optimizer": [0.1]},
            "collectives": {"allreduce": {"calls": 2.0, "bytes": 800.0}}}
    return {"type": "bench", "timing": {"info": {"world_size": 2}, "config": {}, "models": {"m": {
        "model": "m", "description": "d", "params": 200, "tensors": 2, "grad_bytes": 800,
        "candidates": {"torch": cand}, "raw_allreduce_s": [0.001, 0.002]}}}}


def test_compare_exits_1_on_a_regressed_verdict_or_a_significant_slowdown(tmp_path: Path) -> None:
    results = sample_results()
    old = write_run(tmp_path / "old", results, bench_json(1.0, 0.01))
    same = write_run(tmp_path / "same", results, bench_json(1.01, 0.01))
    fixed = [r for r in results if r.candidate != "bad"]
    improved = write_run(tmp_path / "improved", fixed, bench_json(1.0, 0.01))
    regressed = [Result(r.scenario, r.candidate, Verdict.FAIL if r.verdict is Verdict.PASS else r.verdict,
                        2, "gloo", "cpu") for r in results]
    worse = write_run(tmp_path / "worse", regressed, bench_json(1.0, 0.01))
    slower = write_run(tmp_path / "slower", results, bench_json(1.2, 0.01))
    assert not compare_dirs(str(old), str(same)).failed
    assert not compare_dirs(str(old), str(improved)).failed
    comp = compare_dirs(str(old), str(worse))
    assert [c.case for c in comp.regressed] == ["gradients/mlp[torch]"]
    assert [t.kind for t in compare_dirs(str(old), str(slower)).timings] == ["slower"]
    out = io.StringIO()
    from ddp_conformance.cli import build_parser
    from ddp_conformance.report.command import report_command

    args = build_parser().parse_args(["report", "--compare", str(old), str(slower)])
    assert report_command(args, out) == 1
    assert "slower" in out.getvalue() and "+20.0%" in out.getvalue()
    assert main(["report", "--compare", str(old), str(same)]) == 0
    assert main(["report", "--compare", str(old), str(tmp_path / "missing")]) == 2


def test_bus_bandwidth_as_nccl_tests_define_it() -> None:
    from ddp_conformance.bench.stats import algbw, busbw, busy_time

    assert algbw(1e9, 0.5) == 2e9
    assert busbw(1e9, 1.0, 2) == pytest.approx(1e9)      # 2 (n-1)/n = 1 for n = 2
    assert busbw(1e9, 1.0, 4) == pytest.approx(1.5e9)
    assert busbw(1e9, 1.0, 1) == 0.0                     # nothing crosses a wire
    assert bus_bandwidth(1e9, 1.0, 8) == pytest.approx(1.75e9)
    with pytest.raises(ValueError):
        busbw(1.0, 0.0, 2)
    assert busy_time([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)
    assert busy_time([]) == 0.0


def test_ratio_spread_is_over_per_round_ratios() -> None:
    assert round_ratios([[2.0, 2.0], [3.0, 3.0]], [[1.0, 1.0], [2.0, 2.0]]) == [2.0, 1.5]
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0, 4.0)
    assert quartiles([7.0]) == (7.0, 7.0, 7.0)


def test_html_screenshot_in_headless_chromium(tmp_path: Path) -> None:
    import shutil

    if not shutil.which("chromium"):
        pytest.skip("chromium not installed (apt-get install -y chromium)")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "screenshot_report", Path(__file__).resolve().parent.parent / "benchmarks" / "screenshot_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    screenshot = module.screenshot

    write_run(tmp_path, sample_results(), bench_json(1.0, 0.01))
    try:
        proc = screenshot(str(tmp_path / "report.html"), str(tmp_path / "shot.png"), 1000, 1200, 60)
    except subprocess.TimeoutExpired:
        pytest.skip("chromium too slow on this machine now")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "shot.png").stat().st_size > 20_000


def test_without_matplotlib_the_timing_tables_stay_and_the_plots_are_left_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib is the ``plots`` extra, not a runtime dependency: a run's report set is
    written without it, the timing section's tables included, its PNG plots left out."""
    pytest.importorskip("matplotlib")
    from ddp_conformance.report import plots

    bench = bench_json(1.0, 0.01)
    with_plots = write_run(tmp_path / "with", sample_results(), bench)
    assert plots.step_times(bench) is not None
    assert 'alt="step times"' in (with_plots / "report.html").read_text()

    monkeypatch.setattr(plots, "plt", None)
    assert plots.step_times(bench) is None
    html = (write_run(tmp_path / "without", sample_results(), bench) / "report.html").read_text()
    assert "data:image/png" not in html and 'alt="step times"' not in html
    assert "step ms median [IQR]" in html  # the timing table
