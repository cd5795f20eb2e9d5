"""Every check id the registry declares fails on a record broken for it, and passes on the
consistent one (hand-built records, no process)."""
from __future__ import annotations

import copy
from collections.abc import Callable

import pytest

from ddp_conformance.catalog.scenario import Accumulate, Scenario
from ddp_conformance.judge.checks import declared_ids
from ddp_conformance.ranks.tracing import Collective

from .world import World, make_world

NO_SYNC = Scenario("judge/no-sync", "mlp", microbatches=2, accumulate=Accumulate.NO_SYNC)
EXPECTS_ERROR = Scenario("judge/raises", "mlp", expect_error=r"RuntimeError: .*boom")


def _plain() -> World:
    return make_world()


def init_param(w: World) -> None:
    w.records[1].initial_params["w"] += 1.0


def init_buffer(w: World) -> None:
    w.records[1].initial_buffers["running"] += 1.0


def oracle_grad(w: World) -> None:
    g = w.oracle.steps[0].grads["w"]
    assert g is not None
    g += 1.0


def oracle_grad_none(w: World) -> None:
    w.oracle.steps[1].grads["b"] = None


def oracle_param(w: World) -> None:
    w.oracle.steps[0].params["w"] += 1.0


def oracle_buffer(w: World) -> None:
    w.oracle.steps[0].buffers[1]["running"] += 1.0


def replica_param(w: World) -> None:
    w.records[1].steps[0].params["b"] += 1.0


def replica_buffer_broadcast(w: World) -> None:
    w.records[1].steps[0].buffers_at_forward[0]["running"] += 1.0


def replica_final(w: World) -> None:
    w.records[1].final_params["w"] += 1.0


def reference_grad(w: World) -> None:
    assert w.reference is not None
    g = w.reference[0].steps[1].grads["w"]
    assert g is not None
    g *= 3.0


def reference_grad_none(w: World) -> None:
    assert w.reference is not None
    w.reference[1].steps[0].grads["w"] = None


def reference_param(w: World) -> None:
    assert w.reference is not None
    w.reference[0].steps[0].params["w"] -= 1.0


def reference_buffer(w: World) -> None:
    assert w.reference is not None
    w.reference[0].steps[1].buffers["running"] += 1.0


def reference_steps(w: World) -> None:
    assert w.reference is not None
    w.reference[1].steps.append(copy.deepcopy(w.reference[1].steps[-1]))


def expected_error_missing(w: World) -> None:
    w.scenario = EXPECTS_ERROR  # every rank finished without raising


def trace_dtype(w: World) -> None:
    w.set_trace([Collective(c.step, c.microbatch, c.stage, c.kind, "float16", c.numel,
                            c.group_size) for c in w.records[0].trace])


def trace_no_sync(w: World) -> None:
    w.set_trace([Collective(0, 0, "backward", "allreduce", "float32", 4, 2),
                 *w.records[0].trace])


def trace_reduced_once(w: World) -> None:
    w.set_trace(w.records[0].trace * 2)


def trace_consistent(w: World) -> None:
    w.records[1].trace.insert(1, Collective(0, -1, "optimizer", "barrier", "-", 0, 2))


def trace_buckets(w: World) -> None:
    w.strict = True  # the candidate reduces per parameter, the reference in one bucket
    w.set_trace([Collective(step, 0, "backward", "allreduce", "float32", n, 2)
                 for step in range(2) for n in (3, 1)])


#: check id -> (a consistent world, what breaks it, every check id that then fails).
BREAKS: dict[str, tuple[Callable[[], World], Callable[[World], None], set[str]]] = {
    "expected_error": (_plain, expected_error_missing, {"expected_error"}),
    "init.param": (_plain, init_param, {"init.param"}),
    "init.buffer": (_plain, init_buffer, {"init.buffer"}),
    "oracle.grad": (_plain, oracle_grad, {"oracle.grad"}),
    "oracle.grad_none": (_plain, oracle_grad_none, {"oracle.grad_none"}),
    "oracle.param": (_plain, oracle_param, {"oracle.param"}),
    "oracle.buffer": (_plain, oracle_buffer, {"oracle.buffer"}),
    "replica.param": (_plain, replica_param,
                      {"replica.param", "oracle.param", "reference.param"}),
    "replica.buffer_broadcast": (_plain, replica_buffer_broadcast,
                                 {"replica.buffer_broadcast", "oracle.buffer"}),
    "replica.final": (_plain, replica_final, {"replica.final"}),
    "reference.grad": (_plain, reference_grad, {"reference.grad"}),
    "reference.grad_none": (_plain, reference_grad_none, {"reference.grad_none"}),
    "reference.param": (_plain, reference_param, {"reference.param"}),
    "reference.buffer": (_plain, reference_buffer, {"reference.buffer"}),
    "reference.steps": (_plain, reference_steps, {"reference.steps"}),
    "trace.dtype": (_plain, trace_dtype, {"trace.dtype"}),
    "trace.no_sync": (lambda: make_world(NO_SYNC), trace_no_sync, {"trace.no_sync"}),
    "trace.reduced_once": (_plain, trace_reduced_once, {"trace.reduced_once"}),
    "trace.consistent": (_plain, trace_consistent, {"trace.consistent"}),
    "trace.buckets": (_plain, trace_buckets, {"trace.buckets"}),
}


def test_every_declared_check_id_has_a_breaking_record() -> None:
    assert set(BREAKS) == set(declared_ids())


@pytest.mark.parametrize("check_id", sorted(BREAKS))
def test_the_consistent_record_passes(check_id: str) -> None:
    build, _, _ = BREAKS[check_id]
    world = build()
    assert world.failed() == set(), [f.message for f in world.evidence.failures]


@pytest.mark.parametrize("check_id", sorted(BREAKS))
def test_the_broken_record_fails_that_check(check_id: str) -> None:
    build, breaks, fails = BREAKS[check_id]
    world = build()
    breaks(world)
    failed = world.failed()
    assert check_id in failed
    assert failed == fails, [f.message for f in world.evidence.failures]
    failure = next(f for f in world.evidence.failures if f.check == check_id)
    assert failure.message.startswith(f"{check_id}: ")


def test_checks_run_on_a_traced_run_against_the_reference() -> None:
    world = make_world(NO_SYNC)
    world.judge()
    # reference.steps is recorded only when it fails (a count, no per-step figure).
    assert set(world.evidence.checks) == set(declared_ids()) - {"expected_error",
                                                                "reference.steps"}


def test_without_reference_and_trace_only_value_checks_run() -> None:
    world = make_world(reference=False, trace=False)
    world.judge()
    assert not {c for c in world.evidence.checks if c.startswith(("reference.", "trace."))}
    assert {"init.param", "oracle.grad", "replica.param"} <= set(world.evidence.checks)


def test_an_expected_error_runs_only_the_error_and_trace_agreement() -> None:
    world = make_world(EXPECTS_ERROR)
    for rec in world.records.values():
        rec.raised = "RuntimeError: boom"
    oracle_grad(world)  # values are not compared where the iteration raises
    reference_grad(world)
    world.judge()
    assert world.evidence.failures == []
    assert world.evidence.checks == ["expected_error", "trace.consistent"]


def test_an_expected_error_with_the_wrong_message_fails_under_strict_messages() -> None:
    world = make_world(EXPECTS_ERROR)
    world.records[0].raised = "RuntimeError: boom"
    world.records[1].raised = "ValueError: something else"
    assert world.failed() == set()  # any clear error on every rank is the refusal
    world.strict_messages = True  # --strict-messages: torch's text too
    assert world.failed() == {"expected_error"}
    assert world.evidence.failures[0].rank == 1
    assert "--strict-messages" in world.evidence.failures[0].message


def test_a_candidate_that_accepted_what_torch_refuses_fails_even_with_the_refusal_text() -> None:
    world = make_world(EXPECTS_ERROR)
    world.records[0].raised = "RuntimeError: boom"
    # Rank 1 constructed; reading its (lazy) parameters then raised the very words
    # torch's refusal would carry: no refusal of the candidate's, whatever they say.
    world.records[1].accepted = ("ValueError: Attempted to use an uninitialized parameter "
                                 "in detach. This error happens...")
    assert world.failed() == {"expected_error"}
    (failure,) = world.evidence.failures
    assert failure.rank == 1 and "accepted what torch refuses" in failure.message
    assert failure.message.endswith("uninitialized parameter in detach.")


def test_strict_profile_reports_bucket_layouts_otherwise_notes_them() -> None:
    world = make_world()
    trace_buckets(world)
    world.strict = False
    assert world.failed() == set()
    assert any(n.startswith("trace.buckets (not enforced)") for n in world.evidence.notes)
