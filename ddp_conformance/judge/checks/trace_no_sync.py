"""``trace.no_sync``: nothing synchronised inside ``no_sync``."""
from __future__ import annotations

from ddp_conformance.catalog.procedure import buffers_broadcast, synced
from ddp_conformance.judge.registry import Context, check, traced
from ddp_conformance.judge.trace_blind import trace_applies
from ddp_conformance.script.trace_rules import no_sync_offence


def _has_no_sync_window(ctx: Context) -> bool:
    return traced(ctx) and ctx.scenario.microbatches >= 2 and not synced(ctx.scenario, 0)


@check("trace.no_sync", when=_has_no_sync_window)
def no_sync(ctx: Context) -> None:
    """No reduction and no broadcast of floating-point data (gradients, parameters,
    buffers) in the forward or backward of a microbatch inside ``no_sync()`` (torch:
    ``no_sync`` disables gradient synchronisation). Gathering parameters is allowed (a
    sharded candidate all-gathers its weights for every forward). Two exceptions follow
    torch: the buffer broadcast at a forward that follows a synced forward
    (``procedure.buffers_broadcast``), and integer metadata: torch rebuilds its buckets
    once, at the first forward after the first synced backward, and broadcasts the new
    layout as int32 even inside ``no_sync``. Under Join, the one-element allreduce by
    which Join counts the ranks still active is allowed too (the rule is
    :func:`~ddp_conformance.script.trace_rules.no_sync_offence`, which reproducers carry
    too). One failure per rank.
    Not applied where the candidate's collectives bypassed the traced group
    (:mod:`~ddp_conformance.judge.trace_blind`)."""
    if not trace_applies(ctx, "trace.no_sync"):
        return
    ev, scenario = ctx.evidence, ctx.scenario
    ev.ran("trace.no_sync")
    for rank, rec in sorted(ctx.records.items()):
        c = no_sync_offence(rec.trace, lambda mb: synced(scenario, mb),
                            lambda step, mb: buffers_broadcast(scenario, step, mb),
                            scenario.join is not None)
        if c is not None:
            ev.fail("trace.no_sync", f"step {c.step}, microbatch {c.microbatch} (inside "
                    f"no_sync), rank {rank}: {c.describe()} issued in {c.stage}",
                    c.step, rank)
