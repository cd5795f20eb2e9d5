"""The command line: exit codes, one-line errors, the report files, the agreement of modes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.cli import build_parser
from ddp_conformance.options import COMMANDS, uses_of
from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddp_conformance", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=deadline(timeout))


@pytest.mark.parametrize("args, message", [
    (["--candidate", "nosuch.module:X"], "unknown candidate 'nosuch.module:X'"),
    (["--world-size", "0"], "--world-size must be at least 1"),
    (["--backend", "nccl"], "backend nccl"),
    (["--backend", "mpi"], "unknown backend 'mpi'"),
    (["--candidate", "tests.defective:NoSuchThing"], "has no attribute 'NoSuchThing'"),
    (["--timeout", "0"], "--timeout must be positive"),
    (["-k", "no-scenario-has-this-name"], "no scenario matches"),
    (["--expectations", "/nonexistent/file"], "cannot read expectations file"),
    (["--world-size", "two"], "invalid int value"),
])
def test_usage_errors_exit_2_with_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    if args[0] == "--backend" and args[1] == "nccl":
        pytest.importorskip("torch")
        import torch

        if torch.cuda.device_count() >= 2:
            pytest.skip("this machine can run NCCL with 2 ranks")
    proc = cli("run", "--report-dir", str(tmp_path), *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_parser_does_not_import_torch() -> None:
    """``--help`` of every subcommand and the usage errors found before a command runs
    answer in a fresh interpreter without importing torch (seconds saved on every
    ``--help``; torch is imported once a command runs)."""
    import tests.cli_probe as probe

    proc = subprocess.run([sys.executable, "-m", "tests.cli_probe"], cwd=ROOT,
                          capture_output=True, text=True, timeout=deadline(60))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["imported"] == [], found
    expected = {" ".join(argv): 2 for argv in probe.USAGE_ERRORS}
    assert {k: v for k, v in found["codes"].items() if "--help" not in k} == expected
    assert {k: v for k, v in found["codes"].items() if "--help" in k} == {
        f"{command} --help".strip(): 0 for command in ["", "run", *COMMANDS]}


@pytest.mark.parametrize("argv", [["run"], ["fuzz"], ["repro", "gradients/mlp-sgd"], ["bench"],
                                  ["list"], ["report"]])
def test_every_subcommand_takes_the_shared_options_with_their_one_default(
        argv: list[str]) -> None:
    """Each row of the option table a subcommand takes has the table's default there; every
    subcommand that reads or writes files takes ``--report-dir``."""
    command = argv[0]
    args = build_parser().parse_args(argv)
    uses = uses_of(command)
    assert uses and all(getattr(args, option.dest) == option.default for option, _ in uses)
    names = {option.name for option, _ in uses}
    assert ("report-dir" in names) == (command != "list"), names
    if command in ("run", "fuzz", "bench"):
        assert {"candidate", "world-size", "backend", "device"} <= names, names


def test_list_lines_fit_in_100_columns() -> None:
    proc = cli("list", timeout=60)
    assert proc.returncode == 0, proc.stderr
    widths = [len(line) for line in proc.stdout.splitlines()]
    assert max(widths) <= 100, max(widths)
    ids = [s.id for s in load_catalog()]
    assert [line.split()[0] for line in proc.stdout.splitlines()[2:]
            if line and not line.startswith(" ")] == ids


def test_list_shows_every_scenario_with_its_needs() -> None:
    proc = cli("list", timeout=60)
    assert proc.returncode == 0
    for s in load_catalog():
        assert s.id in proc.stdout
    assert "option:find_unused_parameters" in proc.stdout and "join" in proc.stdout


def test_run_passes_on_torch_and_writes_the_reports(tmp_path: Path) -> None:
    proc = cli("run", "--report-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["world_size"] == 2
    assert lines[0]["candidates"][0]["name"] == "torch" and lines[0]["torch"]
    results = [x for x in lines if x["type"] == "result"]
    # Everything passes, except scenarios defined for other world sizes (process groups)
    # or backends (what torch cannot run on Gloo), and torch's own defects are expected
    # failures (builtins/expectations/torch.txt).
    from tests.test_verdicts import torch_defects

    assert results and all(r["verdict"] == "PASS" or (r["verdict"] == "N/A" and (
        "defined for world size" in r["reason"] or "needs backend" in r["reason"]
        or "a slow scenario" in r["reason"]))
        or (r["verdict"] == "XFAIL" and r["scenario"] in torch_defects())
        for r in results)
    assert sum(r["verdict"] == "PASS" for r in results) >= 50
    # A passing case keeps the worst figure per check and tensor (report/compact.py): the
    # whole catalog's results.jsonl stays under a megabyte.
    assert results[0]["figures_worst"]["checks"], "the worst error figures are kept"
    assert (tmp_path / "results.jsonl").stat().st_size < 1_000_000
    assert lines[-1]["type"] == "end"
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    assert int(suite.get("tests", 0)) == len(results) and suite.get("failures") == "0"
    assert (tmp_path / "report.html").exists()
    assert "| gradients/exact-dyadic" in (tmp_path / "summary.md").read_text()


def test_defects_fail_the_run_and_the_other_scenarios_still_run(tmp_path: Path) -> None:
    proc = cli("run", "--report-dir", str(tmp_path), "--timeout", "8",
               "--candidate", "tests.defective:NeverBroadcastsBuffers",
               "--candidate", "tests.defective:ExitsMidStep", "-k", "conv-bn or mlp-adam")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    results = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    verdicts = {(r["scenario"], r["candidate"]): r["verdict"] for r in results
                if r["type"] == "result"}
    assert verdicts[("buffers/conv-bn-broadcast", "tests.defective:NeverBroadcastsBuffers")] == "FAIL"
    assert verdicts[("buffers/conv-bn-no-broadcast", "tests.defective:NeverBroadcastsBuffers")] == "PASS"
    assert verdicts[("gradients/mlp-adam", "tests.defective:ExitsMidStep")] == "CRASH"
    assert "rank 1 died with exit code 3" in proc.stdout
    matching = [s for s in load_catalog() if "conv-bn" in s.id or "mlp-adam" in s.id]
    assert len(verdicts) == 2 * len(matching)  # every case ran despite the crashes


def test_fresh_pool_gives_the_same_verdicts(tmp_path: Path) -> None:
    args = ["--candidate", "torch", "--candidate", "tests.defective:SumsWithoutDividing",
            "-k", "exact-dyadic and not microbatches or conv-bn-broadcast or per-rank-weights"]
    verdicts = []
    for mode in ("persistent", "fresh"):
        out = tmp_path / mode
        proc = cli("run", "--report-dir", str(out), "--pool", mode, *args)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
        verdicts.append({(r["scenario"], r["candidate"]): r["verdict"] for r in rows
                         if r["type"] == "result"})
    assert verdicts[0] == verdicts[1]
    assert set(verdicts[0].values()) == {"PASS", "FAIL"}


def test_expectations_turn_failures_into_xfail_and_report_stale_patterns(tmp_path: Path) -> None:
    expectations = tmp_path / "expect.txt"
    expectations.write_text(
        "# known deviations\n"
        "gradients/exact-dyadic[tests.defective:SumsWithoutDividing]  # sums, never divides\n"
        "gradients/mlp-adam  # it passes this one: XPASS\n"
        "nothing/matches-this  # stale\n")
    proc = cli("run", "--report-dir", str(tmp_path / "r"), "--expectations", str(expectations),
               "--candidate", "tests.defective:SumsWithoutDividing", "-k",
               "exact-dyadic and not microbatches or mlp-adam")
    rows = [json.loads(x) for x in (tmp_path / "r" / "results.jsonl").read_text().splitlines()]
    verdicts = {r["scenario"]: r["verdict"] for r in rows if r["type"] == "result"}
    # mlp-adam does fail for this candidate, so it is XFAIL too; nothing unexpected: exit 0.
    assert verdicts == {"gradients/exact-dyadic": "XFAIL", "gradients/mlp-adam": "XFAIL"}
    assert proc.returncode == 0, proc.stdout
    # Staleness is judged against the whole catalog, so -k neither hides a stale pattern
    # nor makes a pattern for a case left out look stale.
    stale = [line for line in proc.stdout.splitlines() if "matches no case" in line]
    assert len(stale) == 1 and "'nothing/matches-this'" in stale[0], proc.stdout


def test_stale_expectations_are_found(tmp_path: Path) -> None:
    from ddp_conformance.judge.expectations import Expectations

    path = tmp_path / "e.txt"
    path.write_text("gradients/*  # all of them\nnothing/matches-this  # stale\n"
                    "join/x[my:DDP]  # brackets are literal\n")
    exp = Expectations.load(str(path))
    assert exp.match("gradients/mlp-sgd", "c") is not None
    assert exp.match("join/x", "my:DDP") is not None and exp.match("join/x", "m") is None
    assert [e.pattern for e in exp.stale()] == ["nothing/matches-this"]
    path.write_text("gradients/*\n")
    with pytest.raises(Exception, match="needs a reason"):
        Expectations.load(str(path))


def test_a_candidate_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text(
        "from torch.nn.parallel import DistributedDataParallel as MyDDP\n")
    proc = cli("run", "--report-dir", str(tmp_path / "r"), "--candidate", "mine:MyDDP",
               "-k", "exact", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS    gradients/exact-dyadic[mine:MyDDP]" in proc.stdout
    assert os.path.exists(tmp_path / "r" / "junit.xml")


def test_repeat_reports_stability_and_memory(tmp_path: Path) -> None:
    proc = cli("run", "--report-dir", str(tmp_path), "--repeat", "3", "-k", "exact")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stability over 3 repeats: 0 flaky case(s)" in proc.stdout
    assert proc.stdout.count("--- repeat") == 3
    rows = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    repeats = {r["repeat"] for r in rows if r["type"] == "result"}
    assert repeats == {0, 1, 2}


def test_stability_flags_changed_figures() -> None:
    from ddp_conformance.judge.stability import Stability
    from ddp_conformance.judge.verdict import Figure, Result, Verdict

    stability = Stability(2)
    for max_abs in (0.0, 1e-9):
        r = Result("s", "c", Verdict.PASS, 2, "gloo", "cpu")
        r.figures.append(Figure("oracle.grad", 0, 0, "w", True, max_abs, 0.0, 0.0, 1e-5))
        stability.add(r)
    assert stability.flaky() == {"s[c]": "figures changed between repeats"}
    stability.memory = [{0: (300.0, 300.0)}, {0: (310.0, 310.0)}, {0: (400.0, 400.0)}]
    assert 0 in stability.growth()
    stability.memory[-1] = {0: (320.0, 320.0)}
    assert stability.growth() == {}
