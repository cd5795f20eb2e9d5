"""The pytest route: same items, same verdicts as ``ddp-conformance run``, under xdist too."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parent.parent


def pytest_run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=deadline(timeout))


def junit_outcomes(path: Path) -> dict[str, str]:
    """Item name -> passed / failed / skipped / xfailed, from pytest's JUnit XML."""
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        skipped = case.find("skipped")
        if "failure" in kinds or "error" in kinds:
            outcome = "failed"
        elif skipped is not None:
            outcome = "xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"
        else:
            outcome = "passed"
        outcomes[case.get("name", "")] = outcome
    return outcomes


def test_pytest_xdist_agrees_with_the_command_line(tmp_path: Path) -> None:
    # A slice of the catalog that holds every outcome (passed, failed, skipped, xfailed:
    # torch's deepcopy defect), selected by the same -k in both routes (a case's id is its
    # test's name): the whole catalog took 100 s of the suite for no more evidence.
    candidates = ["--candidate", "torch", "--candidate", "tests.defective:SumsWithoutDividing",
                  "--candidate", "tests.limited:ForwardOnly",
                  "-k", "gradients/ or errors/ or surface/copy"]
    proc = pytest_run("suites", "-n", "2", "-q", f"--junitxml={tmp_path / 'j.xml'}",
                      *candidates)
    assert proc.returncode == 1, proc.stdout[-3000:]  # the defective candidate fails
    by_pytest = junit_outcomes(tmp_path / "j.xml")
    cli = subprocess.run([sys.executable, "-m", "ddp_conformance", "run", "--report-dir",
                          str(tmp_path / "cli"), *candidates], cwd=ROOT, capture_output=True,
                         text=True, timeout=deadline(600))
    assert cli.returncode == 1
    rows = [json.loads(x) for x in (tmp_path / "cli" / "results.jsonl").read_text().splitlines()]
    expected = {"PASS": "passed", "FAIL": "failed", "ERROR": "failed", "N/A": "skipped",
                "XFAIL": "xfailed"}
    by_cli = {f"{r['scenario']}[{r['candidate']}]": expected[r["verdict"]]
              for r in rows if r["type"] == "result"}
    assert by_pytest == by_cli
    # xfailed: torch's own defects, expected in builtins/expectations/torch.txt.
    assert set(by_cli.values()) == {"passed", "failed", "skipped", "xfailed"}


def test_failures_show_the_evidence_and_na_the_missing_capability() -> None:
    proc = pytest_run("suites/test_gradients.py", "suites/test_no_sync.py", "-rs", "-q",
                      "--candidate", "tests.defective:SumsWithoutDividing",
                      "--candidate", "tests.limited:ForwardOnly", "-k",
                      "exact-dyadic and not microbatches or window")
    assert proc.returncode == 1
    # The cause first, as on the command line, then why.
    assert "FAIL: gradients/exact-dyadic[tests.defective:SumsWithoutDividing]: [no-division] " \
           in proc.stdout
    assert re.search(r"^  oracle\.grad: step 0, rank 0", proc.stdout, re.M)
    assert "N/A: candidate lacks no_sync" in proc.stdout
    # The failures beyond the first line: one line per check, not one per step.
    assert re.search(r"^  oracle\.grad: \d+ more \(steps 0-\d, ranks 0-1", proc.stdout, re.M)
    assert "oracle.grad: step 1, rank 0" not in proc.stdout


def test_bad_options_stop_pytest_with_one_line() -> None:
    proc = pytest_run("suites", "--candidate", "nosuch.module:X", timeout=120)
    assert proc.returncode == 4
    assert "unknown candidate 'nosuch.module:X'" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_expectations_are_xfail_under_pytest(tmp_path: Path) -> None:
    exp = tmp_path / "e.txt"
    exp.write_text("gradients/exact-dyadic  # this candidate sums without dividing\n")
    proc = pytest_run("suites/test_gradients.py", "-q", "-k", "exact-dyadic and not microbatches",
                      f"--expectations={exp}",
                      "--candidate", "tests.defective:SumsWithoutDividing", "-rx")
    assert proc.returncode == 0, proc.stdout
    assert "1 xfailed" in proc.stdout


def test_stale_expectations_are_warned_about_under_pytest(tmp_path: Path) -> None:
    """The run loop is shared (session.py): what the command line warns about, pytest too."""
    exp = tmp_path / "e.txt"
    exp.write_text("gradients/exact-dyadic  # this candidate sums without dividing\n"
                   "nothing/matches-this  # stale\n")
    proc = pytest_run("suites/test_gradients.py", "-q", "-k", "exact-dyadic and not microbatches",
                      f"--expectations={exp}",
                      "--candidate", "tests.defective:SumsWithoutDividing")
    assert proc.returncode == 0, proc.stdout
    assert "expectation 'nothing/matches-this'" in proc.stdout, proc.stdout
    assert "matches no case" in proc.stdout
    assert "expectation 'gradients/exact-dyadic'" not in proc.stdout


@pytest.mark.parametrize("option, says", [
    (("--candidate", "nosuch.module:X"),
     "cannot import 'nosuch.module' (No module named 'nosuch'); 'nosuch' is not in {cwd}: run "
     "from the directory that holds it, or add that directory to PYTHONPATH"),
    (("--candidate", "tests.defective:SumsWithoutDividng"),
     "'tests.defective' has no attribute 'SumsWithoutDividng'"),
    (("--backend", "nosuch:x"), "unknown backend 'nosuch:x'"),
])
def test_bad_options_under_xdist_stop_pytest_with_one_line(option: tuple[str, str], says: str,
                                                           tmp_path: Path) -> None:
    """Under -n the controller checks the options (candidates, backend, values) before any
    worker starts: no worker crash, no INTERNALERROR, pytest's usage exit code; a module
    not found says how to make it importable (run from the repository root for tests.*,
    from elsewhere for the others)."""
    cwd = ROOT if option[1].startswith("tests.") else tmp_path
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           str(ROOT / "suites" / "test_models.py"), "-n", "2", *option],
                          cwd=cwd, capture_output=True, text=True, timeout=deadline(120))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 4, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and says.format(cwd=cwd) in errors[0], output[-3000:]
    assert "INTERNALERROR" not in output and "Traceback" not in output


def test_stale_expectation_is_an_xpass_and_reports_are_merged_under_xdist(
        tmp_path: Path) -> None:
    """A case expected to fail that passes is pytest's strict XPASS, a failure saying the
    expectation is stale; with --ddp-report-dir the workers' parts become one report set."""
    exp = tmp_path / "e.txt"
    exp.write_text("gradients/exact-dyadic  # expected to fail, but torch passes it\n")
    proc = pytest_run("suites/test_gradients.py", "-n", "2", "-k",
                      "exact-dyadic and not microbatches or mlp-sgd and not momentum",
                      f"--expectations={exp}",
                      f"--ddp-report-dir={tmp_path / 'r'}")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-3000:]
    assert "[XPASS(strict)] passed, though expected to fail" in proc.stdout
    assert "the expectation is stale" in proc.stdout
    rows = [json.loads(x) for x in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    assert sorted(r["verdict"] for r in rows if r["type"] == "result") == ["PASS", "XPASS"]
    assert rows[-1]["type"] == "end"
    assert {"summary.md", "junit.xml", "report.html"} <= {p.name for p in (tmp_path / "r").iterdir()}
    assert not (tmp_path / "r" / ".parts").exists()
