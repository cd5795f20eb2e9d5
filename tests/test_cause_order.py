"""A failure's first line names the check that explains it best: the declared cause order
(:mod:`ddp_conformance.judge.cause_order`) and the evidence kept sorted by it."""
from __future__ import annotations

from ddp_conformance.judge.cause_order import CAUSE_ORDER, cause_rank
from ddp_conformance.judge.checks import declared_ids
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.verdict import Result, Verdict


def test_every_check_the_judge_can_fail_has_its_place() -> None:
    """A new check must be placed (else it would sort last, after the effects it may
    explain), and the table names nothing the judge cannot report."""
    assert sorted(CAUSE_ORDER) == sorted(declared_ids())
    assert len(set(CAUSE_ORDER)) == len(CAUSE_ORDER)


def test_causes_come_before_their_effects() -> None:
    before = [("replica.buffer_broadcast", "oracle.buffer"), ("init.param", "oracle.grad"),
              ("init.buffer", "oracle.buffer"), ("trace.no_sync", "oracle.grad"),
              ("trace.reduced_once", "reference.grad"), ("trace.dtype", "oracle.grad"),
              ("oracle.grad_none", "oracle.grad"), ("oracle.grad", "oracle.param"),
              ("oracle.grad", "replica.param"), ("reference.steps", "reference.grad"),
              ("expected_error", "trace.consistent")]
    for cause, effect in before:
        assert cause_rank(cause) < cause_rank(effect), (cause, effect)
    assert cause_rank("collective.allreduce") == len(CAUSE_ORDER)  # not listed: last


def test_the_evidence_keeps_failures_in_cause_order_and_each_check_in_its_own() -> None:
    ev = Evidence()
    ev.fail("oracle.buffer", "step 1, rank 1, 'bn.running_mean': max abs error 0.0351", 1, 1)
    ev.fail("oracle.grad", "step 2, rank 1, 'conv.weight': max abs error 0.2", 2, 1)
    ev.fail("replica.buffer_broadcast", "step 1, rank 1, 'bn.running_mean': differs", 1, 1)
    ev.fail("oracle.grad", "step 3, rank 0, 'conv.weight': max abs error 0.3", 3, 0)
    ev.fail("replica.buffer_broadcast", "step 2, rank 1, 'bn.running_var': differs", 2, 1)
    assert [(f.check, f.step) for f in ev.failures] == [
        ("replica.buffer_broadcast", 1), ("replica.buffer_broadcast", 2),
        ("oracle.grad", 2), ("oracle.grad", 3), ("oracle.buffer", 1)]
    result = Result("buffers/conv-bn-broadcast", "mine", Verdict.FAIL, 2, "gloo", "cpu",
                    failures=ev.failures)
    assert result.summary_line() == (
        "replica.buffer_broadcast: step 1, rank 1, 'bn.running_mean': differs")
