"""The collective trace catches what values alone cannot."""
from __future__ import annotations

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.runner import Runner

from .conftest import DEFECTIVE

CATALOG = {s.id: s for s in load_catalog()}


def test_torch_traces_the_same_collectives_on_every_rank(runner: Runner) -> None:
    result = runner.run_case(CATALOG["no-sync/window-of-3"], "torch")
    assert result.verdict is Verdict.PASS
    assert {"trace.no_sync", "trace.reduced_once", "trace.consistent", "trace.buckets",
            "trace.dtype"} <= set(result.checks_run)


def test_syncing_inside_no_sync_is_caught_by_the_trace_alone(runner: Runner) -> None:
    result = runner.run_case(CATALOG["no-sync/window-of-3"], DEFECTIVE + "SyncsInsideNoSync")
    assert result.verdict is Verdict.FAIL
    checks = {f.check for f in result.failures}
    # The gradients are right (averaging each microbatch gives the same sum): only the
    # trace sees the extra collectives.
    assert checks == {"trace.no_sync"}, [f.message for f in result.failures]
    assert "inside no_sync" in result.failures[0].message


def test_nested_no_sync_that_switches_sync_on_is_caught(runner: Runner) -> None:
    """Leaving an inner no_sync must restore "no sync": a no_sync that sets sync on when it
    ends passes the plain window and fails the nested one, on the trace."""
    plain = runner.run_case(CATALOG["no-sync/window-of-3"], DEFECTIVE + "NoSyncSwitchesSyncOn")
    assert plain.verdict is Verdict.PASS, [f.message for f in plain.failures]
    nested = runner.run_case(CATALOG["no-sync/nested"], DEFECTIVE + "NoSyncSwitchesSyncOn")
    assert nested.verdict is Verdict.FAIL
    assert "trace.no_sync" in {f.check for f in nested.failures}


def test_a_float16_reduction_is_caught_by_values_and_by_dtype(runner: Runner) -> None:
    result = runner.run_case(CATALOG["gradients/mlp-sgd"], DEFECTIVE + "ReducesInFloat16")
    assert result.verdict is Verdict.FAIL
    checks = {f.check for f in result.failures}
    assert {"oracle.grad", "trace.dtype"} <= checks
    dtype = next(f for f in result.failures if f.check == "trace.dtype")
    assert "float16" in dtype.message and "expected float32" in dtype.message


def test_reducing_twice_is_caught_by_volume(runner: Runner) -> None:
    """SumsWithoutDividing reduces once but wrongly; volume stays right: only values fail."""
    result = runner.run_case(CATALOG["gradients/mlp-sgd"], DEFECTIVE + "SumsWithoutDividing")
    assert "trace.reduced_once" not in {f.check for f in result.failures}
    assert "oracle.grad" in {f.check for f in result.failures}


def test_a_second_comm_hook_must_raise(runner: Runner) -> None:
    scenario = CATALOG["errors/comm-hook-registered-twice"]
    assert runner.run_case(scenario, "torch").verdict is Verdict.PASS
    result = runner.run_case(scenario, DEFECTIVE + "AcceptsSecondCommHook")
    assert result.verdict is Verdict.FAIL
    assert result.failures[0].check == "expected_error"
    assert "without raising" in result.failures[0].message


def test_ignoring_the_process_group_is_caught(runner4: Runner) -> None:
    scenario = CATALOG["process-groups/two-pairs-in-four"]
    assert runner4.run_case(scenario, "torch").verdict is Verdict.PASS
    result = runner4.run_case(scenario, DEFECTIVE + "UsesWorldGroup")
    assert result.verdict is Verdict.FAIL
    checks = {f.check for f in result.failures}
    assert "init.param" in checks or "oracle.grad" in checks, [f.message for f in result.failures]
