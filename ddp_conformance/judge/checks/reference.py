"""``reference.*``: the candidate's trajectory equals the reference DDP's."""
from __future__ import annotations

from ddp_conformance.judge.grads import check_grads
from ddp_conformance.judge.registry import Context, against_reference, check


@check("reference", "reference.grad", "reference.grad_none", "reference.param",
       "reference.buffer", "reference.steps", when=against_reference)
def reference_equivalence(ctx: Context) -> None:
    """The same trajectory as the reference DDP (``ddp_reference``, an executable
    specification of torch's DDP) run on the same data, rank by rank:

    - ``reference.steps``: each rank ran as many steps as the reference's;
    - ``reference.grad_none``: ``None``-ness of gradients matches exactly;
    - ``reference.grad`` / ``reference.param`` / ``reference.buffer``: values agree with
      the same tolerances as against the oracle (the reference may reduce in another
      order than the candidate).
    """
    ev, oracle, reference = ctx.evidence, ctx.oracle, ctx.reference
    assert reference is not None
    policy = ctx.policy
    for rank, rec in sorted(ctx.records.items()):
        ref = reference.get(rank)
        if ref is None:
            continue
        if len(rec.steps) != len(ref.steps):
            ev.fail("reference.steps", f"rank {rank} ran {len(rec.steps)} steps, the reference "
                                       f"{len(ref.steps)}", None, rank)
        for step, (srec, rrec) in enumerate(zip(rec.steps, ref.steps, strict=False)):
            scales = oracle.steps[step].grad_scales if step < len(oracle.steps) else {}
            check_grads(ev, "reference", step, rank, srec.grads, rrec.grads, scales,
                        policy, "the reference")
            ev.compare_all("reference.param", step, rank, srec.params, rrec.params,
                           policy, "the reference")
            ev.compare_all("reference.buffer", step, rank, srec.buffers, rrec.buffers,
                           policy, "the reference")
