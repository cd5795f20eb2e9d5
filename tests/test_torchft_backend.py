"""A real third-party backend through ``--backend``: torchft 0.2.0's process groups
(``tests/backends/torchft_groups.py``; the optional ``torchft`` extra, skipped without it).

* As shipped, torchft's ``ProcessGroupGloo`` is ``ProcessGroup(0, 1)`` on every process: the
  backend sanity check stops the run before any case with one line per rank, and torch's
  own DDP, without the harness, raises in its constructor
  (``tests/standalone/torchft_gloo_rank_zero_of_one.py``).
* With the labelled fix of the registration module (the C++ base built with the true rank
  and size), the sanity check passes and DDP scenarios run on it, torch and the reference.
* Its one DDP ERROR (``surface/join-find-unused``) is torch's: DDP's join hook calls an
  overload no Python process group has (``tests/standalone/ddp_join_python_process_group.py``).
* ``ProcessGroupBabyGloo`` (with the same fix): its works' futures hold ``None`` and torch's
  DDP dies with SIGSEGV on it (``tests/standalone/torchft_baby_gloo.py``).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deadlines import deadline

pytest.importorskip("torchft")

ROOT = Path(__file__).resolve().parents[1]
MODULE = "tests.backends.torchft_groups"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=deadline(600), check=False)


def _records(report_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (report_dir / "results.jsonl").read_text().splitlines()]


def test_torchft_gloo_as_shipped_is_stopped_before_any_case(tmp_path: Path) -> None:
    proc = _run("-m", "ddp_conformance", "run", "--backend", f"{MODULE}:torchft_gloo",
                "--compare-backend", "none", "--timeout", "120",
                "-k", "allreduce-sum-float32 or gradients/mlp-sgd", "--report-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-3:] == [
        "ddp-conformance: backend torchft_gloo disagrees with the 2-rank job the harness set "
        "up; no case ran:",
        "rank 0: its C++ size is 1 (expected 2)",
        "rank 1: backend says rank 0; its C++ rank is 0 (expected 1); its C++ size is 1 "
        "(expected 2)"], proc.stderr
    assert [r["type"] for r in _records(tmp_path)] == ["run", "end"]  # not one case


def test_torchs_ddp_on_torchft_gloo_as_shipped_raises_standalone() -> None:
    proc = _run("tests/standalone/torchft_gloo_rank_zero_of_one.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        f"rank {r}: rank() 0, size() 2, C++ rank 0, C++ size 1; DDP raised RuntimeError: "
        "ProcessGroupGloo::allgather: invalid output tensor list at index 0 (expected length "
        "2, got 1)" for r in range(2)], proc.stdout + proc.stderr


def test_torchft_gloo_with_the_true_rank_runs_ddp_scenarios(tmp_path: Path) -> None:
    proc = _run("-m", "ddp_conformance", "run", "--backend", f"{MODULE}:torchft_gloo_fixed",
                "--candidate", "torch", "--candidate", "reference", "--compare-backend", "none",
                "--timeout", "120", "-k", "allreduce-sum-float32 or gradients/mlp-sgd",
                "--report-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the strided case below
    results = [r for r in _records(tmp_path) if r["type"] == "result"]
    verdicts = {(r["scenario"], r["candidate"]): r["verdict"] for r in results}
    strided = ("collectives/allreduce-sum-float32-strided", "torchft_gloo_fixed")
    # torchft forwards to Gloo, which ignores strides (pytorch/pytorch#192920, standalone:
    # tests/backends/gloo_strided.py; an expected failure on plain gloo): inherited.
    assert verdicts.pop(strided) == "FAIL", results
    assert set(verdicts.values()) == {"PASS"} and len(verdicts) >= 10, verdicts
    assert {c for _, c in verdicts} == {"torchft_gloo_fixed", "torch", "reference"}, verdicts


def test_ddp_join_with_find_unused_fails_on_any_python_group_standalone() -> None:
    """The cause of torchft's ``surface/join-find-unused`` ERROR (the example backend's too)."""
    proc = _run("tests/standalone/ddp_join_python_process_group.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "gloo rank 0: completed" in lines and "gloo rank 1: completed" in lines, lines
    assert ("forwarding rank 0: raised TypeError: ForwardingGroup.allreduce() missing 1 "
            "required positional argument: 'opts'") in lines, lines


def test_torchft_baby_gloo_future_is_empty_and_ddp_dies_standalone() -> None:
    """The causes of ``ProcessGroupBabyGloo``'s non-PASS (with the true rank): its future
    FAILs (``collectives/allreduce-sum-float32-future``, ``-then``) and torch's DDP CRASHes."""
    proc = _run("tests/standalone/torchft_baby_gloo.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == [f"rank {r}: allreduce wait() gave [2.0, 2.0, 2.0, 2.0]; get_future() "
                         "value None (length None)" for r in range(2)], lines
    assert lines[2:] == [f"rank {r}: DDP forward+backward process exit code -11"
                         for r in range(2)], lines
