"""The first iteration's bucket layout under ``static_graph`` with
``find_unused_parameters``: torch's DDP builds its reducer knowing ``static_graph`` (one
bucket per dtype, ``_ddp_init_helper``), so the reference does too, and ``trace.buckets``
fails a DDP that builds it with ``bucket_cap_mb`` buckets (the strict profile)."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.runner import Runner

from .conftest import DEFECTIVE

SCENARIO = {s.id: s for s in load_catalog()}["buckets/static-graph-find-unused-tiny-cap"]
LATE = DEFECTIVE + "SetsStaticGraphLate"


@pytest.fixture(scope="module")
def strict_runner() -> Iterator[Runner]:
    """2 ranks, the strict profile for every candidate (bucket layouts enforced)."""
    with Runner(RunConfig(candidates=["torch", "reference", LATE], timeout_s=20.0,
                          strict_profile=True)) as r:
        yield r


def test_torch_and_the_reference_agree_on_the_layout(strict_runner: Runner) -> None:
    """torch's case is judged against the reference's run of the same scenario."""
    result = strict_runner.run_case(SCENARIO, "torch")
    assert result.verdict is Verdict.PASS, [f.message for f in result.failures]
    assert "trace.buckets" in result.checks_run


def test_a_reducer_built_without_static_graph_fails_on_the_layout_alone(
        strict_runner: Runner) -> None:
    result = strict_runner.run_case(SCENARIO, LATE)
    assert result.verdict is Verdict.FAIL
    # Its values are right: only the first iteration's bucket layout differs.
    assert {f.check for f in result.failures} == {"trace.buckets"}, [
        f.message for f in result.failures]
    assert "step 0" in result.failures[0].message
