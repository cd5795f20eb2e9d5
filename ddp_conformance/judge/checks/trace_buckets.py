"""``trace.buckets``: torch's bucket layout (strict profile)."""
from __future__ import annotations

from ddp_conformance.judge.registry import Context, against_reference, check
from ddp_conformance.judge.trace_blind import trace_applies
from ddp_conformance.judge.trace_facts import backward_allreduce_sizes
from ddp_conformance.judge.verdict import Figure


def _traced_with_reference(ctx: Context) -> bool:
    return ctx.trace and against_reference(ctx)


@check("trace.buckets", when=_traced_with_reference)
def buckets(ctx: Context) -> None:
    """Strict profile: the per-backward sequence of gradient reduction sizes equals the
    reference DDP's, i.e. the same bucket layout as torch's DDP (``bucket_cap_mb``,
    reverse registration order, one bucket per dtype, the rebuild after the first step).
    Enforced under the strict profile (``torch``, ``reference``, ``--strict-profile``);
    otherwise the first difference is a note. Only the first difference is reported.
    Not applied where the candidate's collectives bypassed the traced group
    (:mod:`~ddp_conformance.judge.trace_blind`)."""
    if not trace_applies(ctx, "trace.buckets"):
        return
    ev, reference = ctx.evidence, ctx.reference
    assert reference is not None
    ev.ran("trace.buckets")
    for rank, rec in sorted(ctx.records.items()):
        ref = reference.get(rank)
        if ref is None:
            continue
        mine, theirs = backward_allreduce_sizes(rec.trace), backward_allreduce_sizes(ref.trace)
        for key in sorted(set(mine) | set(theirs)):
            a, b = mine.get(key, []), theirs.get(key, [])
            ok = a == b
            detail = f"candidate {a}\nreference {b}"
            ev.figure(Figure("trace.buckets", key[0], rank, "*", ok, 0.0, 0.0, 0.0, 0.0, detail))
            if ok:
                continue
            message = (f"step {key[0]}, microbatch {key[1]}, rank {rank}: gradient allreduce "
                       f"sizes {a} differ from the reference DDP's bucket layout {b}")
            if ctx.strict:
                ev.fail("trace.buckets", message, key[0], rank, detail=detail)
            else:
                ev.note(f"trace.buckets (not enforced): {message}")
            return
