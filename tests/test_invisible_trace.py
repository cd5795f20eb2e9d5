"""The trace is invisible to the candidate (issue 27 point 2, issue 28 point 2): over the
whole catalog, torch's DDP, the reference DDP and a candidate that branches on
``dist.get_backend()`` (:mod:`tests.ignite_like`) get the same verdict in every case
traced and with ``--no-trace``, on Gloo and on the example backend (a Python process
group, ``tests/backends/example.py``). One ``ddp-conformance run`` per configuration; the
verdicts are read from ``results.jsonl``. On the example backend only torch's DDP runs: the
branching candidate does not know the backend's name, the reference's traced collectives
are the same calls on either backend (Gloo judges them), and the collective checks are
checked traced by ``tests/test_backends.py`` and the no-future test below; each would add
a whole catalog to the suite's slowest test and no case the Gloo run does not.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = ("torch", "reference", "tests.ignite_like:auto_ddp")


def verdicts(backend: str, directory: Path, trace: bool) -> dict[tuple[str, str], str]:
    """(case, candidate) -> verdict of one whole-catalog run."""
    command = [sys.executable, "-m", "ddp_conformance", "run", "--backend", backend,
               "--compare-backend", "none", "--timeout", "120", "--report-dir", str(directory)]
    for spec in CANDIDATES if backend == "gloo" else CANDIDATES[:1]:
        command += ["--candidate", spec]
    if backend != "gloo":
        command += ["--collectives", "off"]
    if not trace:
        command.append("--no-trace")
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=deadline(1800),
                          check=False)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]
    assert records[-1]["type"] == "end", proc.stderr[-3000:]
    return {(r["scenario"], r["candidate"]): r["verdict"] for r in records
            if r["type"] == "result"}


@pytest.mark.parametrize("backend", ["gloo", "tests.backends.example:example_backend"])
def test_the_same_verdicts_traced_and_untraced_over_the_catalog(backend: str,
                                                                tmp_path: Path) -> None:
    traced = verdicts(backend, tmp_path / "traced", trace=True)
    untraced = verdicts(backend, tmp_path / "untraced", trace=False)
    assert traced.keys() == untraced.keys()
    differ = {case: (traced[case], untraced[case]) for case in traced
              if traced[case] != untraced[case]}
    assert not differ, differ
    assert {c for _, c in traced} >= ({"torch", "reference"} if backend == "gloo" else {"torch"})
    if backend == "gloo":  # the branching candidate wrapped and was judged, traced as untraced
        ignite = [v for (_, c), v in traced.items() if c.endswith("auto_ddp")]
        assert ignite.count("PASS") > len(ignite) // 2, ignite


def test_a_backend_whose_works_have_no_future_runs_traced(tmp_path: Path) -> None:
    """``tests/backends/no_future.py``: its works raise on ``get_future()`` and the backend
    is dead after one was asked (as torchft's ProcessGroupBabyGloo). Traced, with the flight
    recorder on, its allreduce and send/recv checks pass: the harness asked for no future
    (those that ask for one themselves, ``-future`` and ``-then``, are left out)."""
    proc = subprocess.run(
        [sys.executable, "-m", "ddp_conformance", "run", "--backend",
         "tests.backends.no_future:no_future", "--compare-backend", "none", "--timeout", "120",
         "--collectives", "only", "-k", "(allreduce-sum-float32 or send-recv-float32) and not "
         "float32-future and not float32-then", "--report-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=deadline(600), check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    verdicts = {r["scenario"]: r["verdict"] for r in results if r["type"] == "result"}
    assert "collectives/allreduce-sum-float32" in verdicts
    assert "collectives/send-recv-float32" in verdicts
    assert set(verdicts.values()) == {"PASS"}, verdicts
