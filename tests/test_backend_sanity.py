"""Backend sanity first (:mod:`ddp_conformance.ranks.sanity`): a backend whose rank lies is
stopped before any case, with one line per rank; Gloo and the example backend pass, for
the cost of one job."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ddp_conformance.ranks.pool import RankPool
from ddp_conformance.ranks.sanity import RANK_CHECK, BackendInsane, check_backend
from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parents[1]


def test_a_backend_whose_rank_lies_ends_the_run_before_any_case(tmp_path: Path) -> None:
    """torchft 0.2.0's ``ProcessGroup(0, 1)`` on every rank (tests/backends/lying.py)."""
    proc = subprocess.run(
        [sys.executable, "-m", "ddp_conformance", "run", "--backend",
         "tests.backends.lying:lying_rank", "--compare-backend", "none", "--timeout", "120",
         "-k", "allreduce-sum-float32 or gradients/mlp-sgd", "--report-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=deadline(600), check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.splitlines()[-3:] == [
        "ddp-conformance: backend lying_rank disagrees with the 2-rank job the harness set "
        "up; no case ran:",
        "rank 0: its C++ size is 1 (expected 2)",
        "rank 1: backend says rank 0; its C++ rank is 0 (expected 1); its C++ size is 1 "
        "(expected 2)"], proc.stderr
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["type"] for r in records] == ["run", "end"]  # not one case


@pytest.mark.parametrize("backend", ["gloo", "tests.backends.example:example_backend"])
def test_gloo_and_the_example_backend_pass(backend: str) -> None:
    with RankPool(2, backend) as pool:
        assert pool.call(RANK_CHECK, "cpu") == [[], []]
        check_backend(pool, backend, 2, "cpu")  # raises nothing


class _Answers:
    """What the ranks answered (the parent's side only: the ranks' is tested above)."""

    def __init__(self, answers: Any) -> None:
        self.answers = answers

    def call(self, function: str, *args: Any, timeout_s: float = 0) -> Any:
        assert function == RANK_CHECK and args == ("cpu",) and timeout_s > 0
        if isinstance(self.answers, Exception):
            raise self.answers
        return self.answers


def test_one_line_per_disagreeing_rank_and_one_for_a_check_that_did_not_finish() -> None:
    with pytest.raises(BackendInsane) as caught:
        check_backend(_Answers([[], ["the rank-identifying allgather gave [0, 0, 2] "
                                     "(expected [0, 1, 2])"], []]), "b", 3, "cpu")
    assert caught.value.lines == ["rank 1: the rank-identifying allgather gave [0, 0, 2] "
                                  "(expected [0, 1, 2])"]
    assert caught.value.exit_code == 1
    with pytest.raises(BackendInsane) as caught:
        check_backend(_Answers(RuntimeError("\nTIMEOUT: rank 1 never answered\ndetail")), "b",
                      2, "cpu")
    assert caught.value.lines == ["the check did not finish on every rank: TIMEOUT: rank 1 "
                                  "never answered"]
    check_backend(_Answers([[], []]), "b", 2, "cpu")  # agrees: nothing raised
    check_backend(object(), "b", 2, "cpu")  # a pool that cannot call: not checked
