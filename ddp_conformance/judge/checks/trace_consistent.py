"""``trace.consistent``: every rank of a group issued the same collectives."""
from __future__ import annotations

from ddp_conformance.judge.registry import Context, check
from ddp_conformance.judge.trace_blind import trace_applies
from ddp_conformance.judge.trace_facts import side_by_side
from ddp_conformance.judge.verdict import Figure


def _traced_at_all(ctx: Context) -> bool:
    return ctx.trace  # an expected error too: mismatched collectives hang it


@check("trace.consistent", when=_traced_at_all)
def consistent(ctx: Context) -> None:
    """Every rank of a group issued the same sequence of collectives (kind, dtype,
    element count, group size: ``Collective.signature``), as c10d requires of every
    collective; mismatched collectives hang or corrupt real jobs. The first difference
    from the group's lowest rank is named with both sequences side by side. Runs where
    the scenario expects an error too (the ranks must still agree up to it).
    Not applied where the candidate's collectives bypassed the traced group
    (:mod:`~ddp_conformance.judge.trace_blind`)."""
    if not trace_applies(ctx, "trace.consistent"):
        return
    ev, records = ctx.evidence, ctx.records
    ev.ran("trace.consistent")
    first = min(records)
    base = records[first].trace
    for rank, rec in sorted(records.items()):
        if rank == first:
            continue
        mine = rec.trace
        diff = next((i for i, (a, b) in enumerate(zip(base, mine, strict=False))
                     if a.signature() != b.signature()),
                    None if len(base) == len(mine) else min(len(base), len(mine)))
        if diff is None:
            continue
        ours = mine[diff].describe() if diff < len(mine) else "nothing"
        theirs = base[diff].describe() if diff < len(base) else "nothing"
        at = mine[diff] if diff < len(mine) else base[diff]
        detail = side_by_side(base, mine, diff, f"rank {first}", f"rank {rank}")
        ev.fail("trace.consistent", f"rank {rank} differs from rank {first} at collective #{diff} "
                f"(step {at.step}, {at.stage}): rank {first} issued {theirs}, rank {rank} "
                f"issued {ours}", at.step, rank, detail=detail)
        ev.figure(Figure("trace.consistent", at.step, rank, "*", False, 0.0, 0.0, 0.0, 0.0,
                         detail))
