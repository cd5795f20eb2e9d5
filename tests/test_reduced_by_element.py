"""trace.reduced_once by element of memory, and no trace check PASSes having seen nothing.

Standalone DDPs (``tests/flat_buffer.py``) through the harness at 2, 3 and 4 ranks: a
flat buffer reduced whole once per step (fairseq's legacy DDP: a stale tail where the
frozen parameters are) passes, and so does a small staging buffer reused within one
backward; reducing a buffer or each gradient twice fails at every world size, with the
memory and the parameter named. A DDP reducing through a ``ProcessGroupGloo`` of its
own passes on values, every trace check saying it was not applied. The bookkeeping
underneath is tested without processes.
"""
from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.trace_blind import NOT_APPLIED
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.ranks.tracing import REDUCING, Collective
from ddp_conformance.runner import Runner
from ddp_conformance.script import trace_rules as rules
from ddp_conformance.script.extents import reduced_extents
from ddp_conformance.script.summed_memory import coverage

from .judge.world import make_world

CATALOG = {s.id: s for s in load_catalog()}
FLAT = "tests.flat_buffer:"
CANDIDATES = [FLAT + n for n in ("FlatBufferDDP", "SmallBufferDDP", "ReducesBufferTwice",
                                 "ReducesEachGradientTwice", "OwnGroupDDP")] + ["torch"]
TRACE_CHECKS = {"trace.dtype", "trace.no_sync", "trace.reduced_once", "trace.consistent",
                "trace.buckets"}


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda n: f"{n}ranks")
def flat_runner(request: pytest.FixtureRequest) -> Iterator[Runner]:
    with Runner(RunConfig(candidates=CANDIDATES, world_size=request.param,
                          timeout_s=30.0)) as r:
        yield r


def _failures(result: object) -> list[str]:
    return [result.reason, *(f.message for f in result.failures)]  # type: ignore[attr-defined]


# --- through the harness --------------------------------------------------------------

@pytest.mark.parametrize("scenario", ["models/frozen", "gradients/mlp-sgd"])
def test_a_flat_buffer_reduced_whole_once_passes(flat_runner: Runner, scenario: str) -> None:
    result = flat_runner.run_case(CATALOG[scenario], FLAT + "FlatBufferDDP")
    assert result.verdict is Verdict.PASS, _failures(result)
    assert "trace.reduced_once" in result.checks_run
    figures = [f for f in result.figures if f.check == "trace.reduced_once"]
    assert figures and all(f.passed for f in figures)


def test_the_stale_tail_of_a_buffer_over_frozen_parameters_is_counted_once(
        flat_runner: Runner) -> None:
    """fairseq sizes its buffer for every parameter: on the frozen model 108 elements are
    reduced for 36 gradient elements, once, at every world size."""
    result = flat_runner.run_case(CATALOG["models/frozen"], FLAT + "FlatBufferDDP")
    details = {f.detail for f in result.figures if f.check == "trace.reduced_once"}
    assert details == {"108 of 36 elements"}


def test_a_reused_staging_buffer_passes_with_a_note(flat_runner: Runner) -> None:
    result = flat_runner.run_case(CATALOG["gradients/mlp-sgd"], FLAT + "SmallBufferDDP")
    assert result.verdict is Verdict.PASS, _failures(result)
    assert any("reused" in n and "stale part is not counted" in n for n in result.notes)


@pytest.mark.parametrize("scenario", ["models/frozen", "gradients/mlp-sgd"])
def test_a_buffer_reduced_twice_fails_naming_the_buffer(flat_runner: Runner,
                                                        scenario: str) -> None:
    result = flat_runner.run_case(CATALOG[scenario], FLAT + "ReducesBufferTwice")
    assert result.verdict is Verdict.FAIL
    assert {f.check for f in result.failures} == {"trace.reduced_once"}, _failures(result)
    message = result.failures[0].message
    assert "reduced the same memory more than once" in message
    assert "summed by reduction #0" in message and "again by #1" in message


def test_each_gradient_reduced_twice_fails_naming_the_parameter(flat_runner: Runner) -> None:
    result = flat_runner.run_case(CATALOG["models/frozen"], FLAT + "ReducesEachGradientTwice")
    assert result.verdict is Verdict.FAIL
    assert {f.check for f in result.failures} == {"trace.reduced_once"}, _failures(result)
    assert "the size of 'head.weight'" in result.failures[0].message


@pytest.fixture(scope="module")
def own_runner() -> Iterator[Runner]:
    with Runner(RunConfig(candidates=[FLAT + "OwnGroupDDP", "torch"], world_size=2,
                          timeout_s=30.0)) as r:
        yield r


@pytest.mark.parametrize("scenario", ["gradients/mlp-sgd", "no-sync/window-of-3"])
def test_a_ddp_on_its_own_group_passes_with_every_trace_check_not_applied(
        own_runner: Runner, scenario: str) -> None:
    bypassing = own_runner.run_case(CATALOG[scenario], FLAT + "OwnGroupDDP")
    torch_ddp = own_runner.run_case(CATALOG[scenario], "torch")
    assert bypassing.verdict is Verdict.PASS, _failures(bypassing)
    assert not TRACE_CHECKS & set(bypassing.checks_run)
    noted = {n.split(" ")[0] for n in bypassing.notes if NOT_APPLIED in n}
    applicable = TRACE_CHECKS - ({"trace.no_sync"} if scenario == "gradients/mlp-sgd" else set())
    assert noted == applicable, bypassing.notes
    assert torch_ddp.verdict is Verdict.PASS, _failures(torch_ddp)
    assert applicable <= set(torch_ddp.checks_run)
    assert not any(NOT_APPLIED in n for n in torch_ddp.notes)


# --- the bookkeeping, without processes --------------------------------------------------

def _backward() -> SimpleNamespace:
    return SimpleNamespace(stage="backward", step=0, microbatch=0)


def _reduction(t: torch.Tensor, tracer: SimpleNamespace) -> Collective:
    c = Collective(0, 0, "backward", "allreduce", "float32", t.numel(), 2, t.numel() * 4)
    c.extents = reduced_extents(tracer, "allreduce", ([t],), REDUCING)
    return c


def test_a_temporary_freed_and_reallocated_is_other_memory() -> None:
    tracer = _backward()
    first = _reduction(torch.ones(256), tracer)  # freed at once: its address may come back
    second = _reduction(torch.ones(256), tracer)
    assert first.extents[0][0] != second.extents[0][0]
    assert coverage([first, second]).twice == ()


def test_the_same_tensor_reduced_twice_overlaps_and_views_do_not() -> None:
    tracer, buffer = _backward(), torch.zeros(10)
    head, tail = buffer[:6], buffer[6:]
    cov = coverage([_reduction(head, tracer), _reduction(tail, tracer)])
    assert (cov.summed, cov.distinct, cov.twice) == (10, 10, ())
    again = coverage([_reduction(buffer, tracer), _reduction(head, tracer)])
    assert (again.summed, again.distinct) == (16, 10)
    assert [(t.first, t.second, t.elements) for t in again.twice] == [(0, 1, 6)]


def test_outside_backward_and_for_gathers_nothing_is_recorded() -> None:
    t = torch.ones(4)
    assert reduced_extents(SimpleNamespace(stage="forward", step=0, microbatch=0),
                           "allreduce", ([t],), REDUCING) == ()
    assert reduced_extents(_backward(), "allgather", ([[t]], [t]), REDUCING) == ()


def test_a_non_contiguous_tensor_never_overlaps() -> None:
    tracer, buffer = _backward(), torch.zeros(4, 4)
    cov = coverage([_reduction(buffer.t(), tracer), _reduction(buffer, tracer)])
    assert cov.twice == () and cov.distinct == 32


def test_an_empty_trace_with_synchronised_gradients_is_not_applied_everywhere() -> None:
    world = make_world()
    world.set_trace([])
    assert world.failed() == set()
    noted = {n.split(" ")[0] for n in world.evidence.notes if NOT_APPLIED in n}
    assert noted == TRACE_CHECKS - {"trace.no_sync"}  # no no_sync window in this scenario
    assert not TRACE_CHECKS & set(world.evidence.checks)


def test_an_empty_trace_with_gradients_that_differ_is_not_applied_either() -> None:
    """Nothing went through the traced group and the ranks disagree (a candidate on its
    own group with a defect elsewhere): the trace saw nothing, so it claims nothing (no
    "0 collectives"); the ranks' disagreement is the value checks' to report."""
    world = make_world()
    world.set_trace([])
    grads = world.records[1].steps[0].grads
    assert grads["w"] is not None
    grads["w"] = grads["w"] + 1.0
    failed = world.failed()
    assert not {c for c in failed if c.startswith("trace.")}, failed
    notes = [n for n in world.evidence.notes if "trace.reduced_once" in n]
    assert notes and NOT_APPLIED in notes[0], world.evidence.notes
    assert "value checks judge" in notes[0]


def test_a_trace_that_saw_part_of_the_gradients_is_judged() -> None:
    """Half the gradient elements went through the traced group (above the share a
    candidate on its own group may still send): judged, and the shortfall named."""
    world = make_world()  # 4 gradient elements
    world.set_trace([Collective(step, 0, "backward", "allreduce", "float32", 2, 2, 8)
                     for step in range(2)])
    assert "trace.reduced_once" in world.failed()
    assert "reduced 2 of the model's 4" in world.messages("trace.reduced_once")[0]


def _on_buffer(numel: int, steps: int = 2, calls: int = 2) -> list[Collective]:
    """``calls`` allreduces per step of the first ``numel`` float32 elements of one buffer."""
    return [Collective(step, 0, "backward", "allreduce", "float32", numel, 2, 4 * numel,
                       extents=((7, 0, 4 * numel),))
            for step in range(steps) for _ in range(calls)]


def test_a_buffer_smaller_than_the_gradients_may_be_reused() -> None:
    world = make_world()  # 4 gradient elements
    world.set_trace(_on_buffer(3))  # 3 distinct elements, twice: a staging buffer reused
    assert world.failed() == set()
    assert any("reused" in n for n in world.evidence.notes)


def test_a_buffer_holding_every_gradient_reduced_again_fails() -> None:
    world = make_world()
    world.set_trace(_on_buffer(4))
    assert world.failed() == {"trace.reduced_once"}
    message = world.messages("trace.reduced_once")[0]
    assert "4 element(s) of one buffer were summed by reduction #0" in message
    assert "reduced more than once" in message


def test_a_buffer_over_frozen_parameters_reduced_once_passes_at_every_group_size() -> None:
    params = {"w": torch.ones(3), "frozen": torch.ones(50)}
    world = make_world(params=params)
    world.oracle.numel_by_dtype = {"float32": 3}  # "frozen" requires no gradient
    for size in (2, 3, 4, 8):
        world.set_trace([Collective(step, 0, "backward", "allreduce", "float32", 53, size,
                                    4 * 53, extents=((9, 0, 4 * 53),)) for step in range(2)])
        assert "trace.reduced_once" not in world.failed(), size
    world.set_trace([Collective(step, 0, "backward", "allreduce", "float32", 55, 2, 4 * 55,
                                extents=((9, 0, 4 * 55),)) for step in range(2)])
    assert "trace.reduced_once" in world.failed()  # beyond every parameter and the padding


def test_a_sharded_candidate_may_pad_each_parameter_s_rows_to_the_group_size() -> None:
    """FSDP2 at 3 ranks reduce-scatters a (4, 8) weight padded to 6 rows: 48 elements for
    32, within ``group_size - 1`` rows per parameter; twice the weight is not."""
    world = make_world(params={"w": torch.ones(4, 8)})
    world.oracle.numel_by_dtype = {"float32": 32}

    def scatter(numel: int) -> list[Collective]:
        return [Collective(step, 0, "backward", "reduce_scatter", "float32", numel, 3,
                           4 * numel, extents=((step + 1, 0, 4 * numel),)) for step in range(2)]

    world.set_trace(scatter(48))
    assert "trace.reduced_once" not in world.failed()
    world.set_trace(scatter(64 + 8))  # beyond two rows of padding and the per-collective slack
    assert "trace.reduced_once" in world.failed()


def _refilled(numel: int) -> list[Collective]:
    """One backward's two allreduces of the first ``numel`` float32 elements of one buffer,
    the second over memory the first summed, its blocks rewritten since."""
    span = ((7, 0, 4 * numel),)
    first = Collective(0, 0, "backward", "allreduce", "float32", numel, 2, 4 * numel,
                       extents=span, blocks=("a",))
    again = Collective(0, 0, "backward", "allreduce", "float32", numel, 2, 4 * numel,
                       extents=span, again=((7, 0, 4 * numel, ("b",)),), blocks=("b",))
    return [first, again]


def test_a_refilled_buffer_is_a_staging_buffer_only_where_the_gradients_do_not_fit() -> None:
    """Contents rewritten since the first reduction excuse memory summed again only for a
    buffer smaller than the gradients; one with room for all of them, refilled and summed
    again in the same backward (a reduction per nested backward of a reentrant checkpoint),
    carries gradients already reduced."""
    rewritten = lambda position, entry, block: True  # noqa: E731 - every block differs
    small = coverage(_refilled(3), rewritten)
    assert small.twice == () and small.refilled and small.room == 3
    assert rules.reduced_once(small, needed=4, whole=4, slack=1) == (True, True)
    roomy = coverage(_refilled(4), rewritten)
    assert roomy.twice == () and roomy.redone(4) == roomy.refilled and roomy.room == 4
    assert rules.reduced_once(roomy, needed=4, whole=4, slack=1) == (False, False)
    why = rules.reduced_once_failure(roomy, 4, 4, 4, {"w": torch.ones(4)})
    assert "room for all 4 of the model's" in why and "reduced again" in why
    assert roomy.redone(5) == ()  # a model of 5 elements would not fit: staging again
