"""The report contract on the file system (issue 29, points 3 and 4): every report file
is whole or absent, results.jsonl holds whole lines only, a report directory that cannot
be written is one clear error (before the first case, or when the disk fills mid-run),
and the report set of a large failing run is written in seconds (its long lists capped,
its plots cheap). Real file systems: tmpfs mounts, read-only or filled (tests/tmpfs.py).
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_conformance.deadline import CLOSE_DEADLINE_S
from ddp_conformance.errors import ReportDirError, UsageError
from ddp_conformance.judge.verdict import CheckFailure, Figure, Result, Verdict
from ddp_conformance.report import render
from ddp_conformance.report.errorplot import MAX_LINES
from ddp_conformance.report.files import ReportFiles, check_writable
from ddp_conformance.report.html import MAX_FIGURE_ROWS, MAX_MESSAGES, case_html
from ddp_conformance.report.stream import ResultsWriter
from tests.test_signals import Run, assert_no_rank_left, rank_pids
from tests.tmpfs import fill, tmpfs

INFO = {"type": "run", "torch": "2.13.0", "world_size": 2, "backend": "gloo", "device": "cpu"}


def failing_case(i: int, steps: int = 4, params: int = 40, messages: int = 60) -> Result:
    """A FAIL as a defective DDP leaves it everywhere: every parameter off at every step."""
    figures = [Figure(f"{who}.{q}", s, r, f"layers.{p}.weight", False, 0.5 * (s + 1), 1.0,
                      1e7, 1e-5)
               for who in ("oracle", "reference") for q in ("grad", "param")
               for s in range(steps) for r in range(2) for p in range(params)]
    failures = [CheckFailure("oracle.grad", f"oracle.grad: step {k % steps}, rank 0, "
                             f"'layers.{k}.weight': max abs error 0.5", k % steps, 0,
                             f"layers.{k}.weight") for k in range(messages)]
    return Result(f"values/case-{i}", "bad", Verdict.FAIL, 2, "gloo", "cpu", 0.5,
                  figures=figures, failures=failures, checks_run=["oracle.grad"])


def test_a_report_file_is_replaced_whole_or_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "summary.md"
    files = ReportFiles()
    files.write_text(str(path), lambda: "first\n")
    assert path.read_text() == "first\n" and files.written == [str(path)]
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()  # as open() makes it

    def boom() -> str:
        raise RuntimeError("rendering failed")

    with pytest.raises(RuntimeError):
        files.write_text(str(path), boom)
    with pytest.raises(RuntimeError), files.writing(str(path)) as temp:
        Path(temp).write_text("half")
        raise RuntimeError("writing failed")
    assert path.read_text() == "first\n" and os.listdir(tmp_path) == ["summary.md"]


def test_an_abandoned_report_set_renames_nothing_more_and_leaves_no_temporary_file(
        tmp_path: Path) -> None:
    files = ReportFiles()
    files.write_text(str(tmp_path / "summary.md"), lambda: "done\n")
    with files.writing(str(tmp_path / "report.html")) as temp:
        Path(temp).write_text("<html>half")
        assert files.pending() == [str(tmp_path / "report.html")]
        assert files.abandon() == [str(tmp_path / "summary.md")]  # the watchdog, meanwhile
        assert not os.path.exists(temp)
    assert sorted(os.listdir(tmp_path)) == ["summary.md"]
    with pytest.raises(ReportDirError, match="not written"):
        files.write_text(str(tmp_path / "junit.xml"), lambda: "<x/>")
    assert sorted(os.listdir(tmp_path)) == ["summary.md"]


def test_an_unwritable_report_directory_is_one_error_naming_path_and_cause(
        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", 64, read_only=True) as ro:
        with pytest.raises(ReportDirError) as info:
            check_writable(str(ro / "reports"))
        assert str(info.value) == f"cannot write {ro / 'reports'}: [Errno 30] Read-only file " \
                                  "system" and isinstance(info.value, UsageError)  # exit 2
    with tmpfs(tmp_path / "full", 64) as full:
        fill(full)
        with pytest.raises(ReportDirError) as info:
            check_writable(str(full))
        assert str(info.value) == f"cannot write {full}: [Errno 28] No space left on device"
        assert os.listdir(full) == ["filler"]  # the probe did not stay
    (tmp_path / "file").write_text("")
    with pytest.raises(ReportDirError) as info:  # a parent that is a file (issue 24.1)
        check_writable(str(tmp_path / "file" / "reports"))
    assert str(info.value) == (f"cannot write {tmp_path / 'file' / 'reports'}: "
                               f"{tmp_path / 'file'} is a file, not a directory")


def test_a_disk_that_fills_leaves_whole_lines_and_one_error(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", 256) as small:
        writer = ResultsWriter(str(small), dict(INFO))
        added = 0
        with pytest.raises(ReportDirError) as info:
            for i in range(1000):  # a FAIL line is about 200 KB: the disk fills within 2
                writer.add(failing_case(i))
                added += 1
        assert 1 <= added < 1000
        path = small / "results.jsonl"
        assert str(info.value) == f"cannot write {path}: [Errno 28] No space left on device; " \
                                  f"it keeps {added} whole case{'' if added == 1 else 's'}; " \
                                  "no other report written"
        text = path.read_text()
        assert text.endswith("\n")  # cut back to its last whole line
        lines = [json.loads(x) for x in text.splitlines()]
        assert [x["type"] for x in lines] == ["run"] + ["result"] * added
        with pytest.raises(ReportDirError):
            writer.add(failing_case(added))  # it stays failed
        writer.close(["a note"])  # ends nothing more: no end line, no report
        assert path.read_text() == text and sorted(os.listdir(small)) == ["results.jsonl"]


def test_a_disk_that_fills_while_reports_render_leaves_no_partial_file(tmp_path: Path) -> None:
    results = [failing_case(i) for i in range(3)]
    with tmpfs(tmp_path / "small", 64) as small:
        (small / "summary.md").write_text("the previous run's\n")
        fill(small)
        with pytest.raises(ReportDirError, match=r"cannot write .*summary.md: \[Errno 28\]"):
            render(str(small), dict(INFO), results, [])
        assert sorted(os.listdir(small)) == ["filler", "summary.md"]
        assert (small / "summary.md").read_text() == "the previous run's\n"


def test_long_evidence_is_capped_and_says_where_the_rest_is() -> None:
    html = case_html(failing_case(0, params=MAX_FIGURE_ROWS, messages=MAX_MESSAGES + 30))
    shown = html[html.index(f"failure messages ({MAX_MESSAGES + 30})</summary>"):]
    shown = shown[:shown.index("</pre>")]
    assert shown.count("max abs error 0.5") == MAX_MESSAGES
    assert shown.endswith("... and 30 more failure messages (every one is in results.jsonl)")
    # 2 checks against 2 quantities... per parameter: 4 rows a parameter, the first 60 shown.
    assert f"... and {4 * MAX_FIGURE_ROWS - MAX_FIGURE_ROWS} more rows (every one is in " \
           "results.jsonl)" in html
    # One panel (grad: param, its effect, is left out beside it), oracle and reference
    # lines of the MAX_LINES worst parameters.
    assert html.count("<svg") == 1 and html.count("<polyline") == 2 * MAX_LINES
    assert "grad: error per step" in html and "param: error per step" not in html
    short = case_html(failing_case(0, params=2, messages=MAX_MESSAGES))
    assert "more failure messages" not in short and "more rows" not in short


def test_the_report_set_of_a_large_failing_run_is_written_well_within_the_deadline(
        tmp_path: Path) -> None:
    """120 FAILs, each with 384 failing figures (4 steps x 12 parameters x 2 ranks x
    grad and param x oracle and reference; the catalog's 116 FAILs of
    ``tests.defective:SumsWithoutDividing`` have 42,000 figures in all, whose report.html
    took 56-142 s, most of it 116 matplotlib plots): a third of the deadline at most, so
    that an interrupted run writes its reports and exits in time."""
    results = [failing_case(i, params=12) for i in range(120)]
    started = time.monotonic()
    written = render(str(tmp_path), dict(INFO), results, [])
    took = time.monotonic() - started
    assert took < CLOSE_DEADLINE_S / 3, f"{took:.1f}s"
    html = (tmp_path / "report.html").read_text()
    assert html.count("<svg") == 120 and html.rstrip().endswith("</html>")
    assert [os.path.basename(p) for p in written] == ["summary.md", "junit.xml", "report.html"]


ROOT = Path(__file__).resolve().parent.parent
#: How long a CLI run of a few cases may take on a loaded machine.
RUN_DEADLINE_S = 300.0


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddp_conformance", "run", "--timeout", "120",
                           *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=RUN_DEADLINE_S)


def test_an_unwritable_report_directory_stops_the_run_before_its_first_case(
        tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", 64, read_only=True) as ro:
        proc = cli("--candidate", "torch", "-k", "mlp-sgd", "--report-dir",
                   str(ro / "reports"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"ddp-conformance: error: cannot write {ro / 'reports'}: [Errno 30] Read-only file "
        "system"], proc.stderr
    assert "started" not in proc.stdout and "[1/" not in proc.stdout  # no rank, no case


def test_a_disk_that_fills_mid_run_ends_it_with_exit_2_one_line_and_whole_lines(
        tmp_path: Path) -> None:
    """512 KiB: the run line and the first case's result fit, a later one does not (a
    FAIL of the defective DDP is 60-500 KB of figures)."""
    with tmpfs(tmp_path / "small", 512) as small:
        run = Run(["-m", "ddp_conformance", "run", "--timeout", "120", "--candidate",
                   "tests.defective:SumsWithoutDividing", "-k", "buckets", "--report-dir",
                   str(small)], tmp_path)
        ranks: list[int] = []
        try:
            deadline = time.monotonic() + RUN_DEADLINE_S
            while run.proc.poll() is None and time.monotonic() < deadline:
                ranks = sorted({*ranks, *rank_pids(run.proc.pid)})
                time.sleep(0.05)
            code = run.proc.wait(timeout=1.0)
            assert_no_rank_left(run.proc.pid, ranks)
        finally:
            run.end()
        stderr = run.stderr().splitlines()
        text = (small / "results.jsonl").read_text()
        names = sorted(os.listdir(small))
    kept = text.count('"type": "result"')
    path = small / "results.jsonl"
    assert code == 2 and stderr == [
        f"ddp-conformance: error: cannot write {path}: [Errno 28] No space left on device; it "
        f"keeps {kept} whole case{'' if kept == 1 else 's'}; no other report written"], stderr
    assert kept >= 1 and len(ranks) >= 2
    assert text.endswith("\n") and [json.loads(x)["type"] for x in text.splitlines()] == \
        ["run"] + ["result"] * kept
    assert names == ["results.jsonl"]  # no report, no temporary file


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
