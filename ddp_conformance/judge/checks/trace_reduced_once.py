"""``trace.reduced_once``: every synced backward reduces every needed gradient element once."""
from __future__ import annotations

from ddp_conformance.judge.oracle import OracleRecord
from ddp_conformance.judge.registry import Context, check, traced
from ddp_conformance.judge.summed_memory import Coverage, backward_coverage
from ddp_conformance.judge.trace_blind import trace_applies
from ddp_conformance.judge.trace_facts import (
    FLOATING,
    as_real,
    defined_gradients,
    needed_by_dtype,
    reduced_numel,
    scenario_group_size,
    synced_microbatches,
)
from ddp_conformance.judge.verdict import Figure


def _volume_checked(ctx: Context) -> bool:
    return traced(ctx) and ctx.scenario.trace_volume


def parameter_numel(oracle: OracleRecord) -> int:
    """Real elements of every floating parameter, those that require no gradient included:
    what a flat buffer over the whole model (fairseq's) holds."""
    return sum(as_real(str(p.dtype).removeprefix("torch."), p.numel())[1]
               for p in oracle.initial_params.values()
               if str(p.dtype).removeprefix("torch.") in FLOATING)


@check("trace.reduced_once", when=_volume_checked)
def reduced_once(ctx: Context) -> None:
    """Every synced backward reduces every element of every gradient *defined on some
    rank* exactly once, judged on the memory that reducing collectives (allreduce,
    reduce-scatter, reduce) of floating dtype summed in that backward, element by element
    of storage (:mod:`~ddp_conformance.judge.summed_memory`):

    - at least the elements of the parameters whose gradient a local backward produced
      on some active rank since the previous synced backward (under ``no_sync``, the
      union over the window's microbatches: ``trace_facts.defined_gradients``), counting
      what the reductions summed. A gradient that is ``None`` on every rank (a globally
      unused parameter) may be skipped: its value stays what it was either way;
    - no memory summed twice in one backward once the distinct memory reduced covers
      the needed gradients: a bucket or a gradient reduced again (evidence: the two
      reductions and the buffer's elements). A staging buffer reused because it is
      smaller than the gradients (fairseq with a small ``buffer_size``) is told apart by
      that: its distinct memory falls short of what was needed; its stale tails are then
      not counted (a note says so);
    - at most as many distinct elements as the whole model's parameters, frozen ones
      included (a flat buffer over every parameter, reduced whole, as fairseq's legacy
      DDP does: its padding is memory summed once, not a gradient reduced twice), plus
      ``group_size - 1`` per collective (a sharded candidate pads each collective to a
      multiple of the group size). Twice the model through distinct buffers is caught.

    Where the candidate's collectives bypassed the traced group, not applied
    (:mod:`~ddp_conformance.judge.trace_blind`). Scenarios whose comm hook compresses
    (PowerSGD) or whose gradients are sparse opt out (``Scenario.trace_volume``).
    """
    if not trace_applies(ctx, "trace.reduced_once"):
        return
    ev, scenario, oracle = ctx.evidence, ctx.scenario, ctx.oracle
    ev.ran("trace.reduced_once")
    full = reduced_numel(oracle)  # in real elements: a complex one counts as two
    whole = max(full, parameter_numel(oracle))
    for rank, rec in sorted(ctx.records.items()):
        covered, noted = backward_coverage(rec.trace), False
        for step in range(len(rec.steps)):
            for mb in synced_microbatches(scenario):
                names = defined_gradients(scenario, oracle, step, mb)
                needed = sum(needed_by_dtype(oracle, names).values())  # None: all, = full
                cov = covered.get((step, mb), Coverage(0, 0, 0, ()))
                slack = (scenario_group_size(rec) - 1) * cov.calls
                reused = bool(cov.twice) and cov.distinct < needed
                twice = bool(cov.twice) and not reused
                ok = needed <= cov.summed and cov.distinct <= whole + slack and not twice
                of = f"{full}" if needed == full else f"{needed} to {full}"
                detail = f"{cov.distinct} of {of} elements"
                if cov.summed != cov.distinct:
                    detail += f" ({cov.summed} summed)"
                ev.figure(Figure("trace.reduced_once", step, rank, "*", ok,
                                 float(cov.distinct - full), 0.0, 0.0, float(slack), detail))
                where = f"step {step}, microbatch {mb}, rank {rank}"
                if reused and not noted:
                    noted = True
                    ev.note(f"trace.reduced_once: {where}: a buffer of {cov.distinct} elements "
                            f"was reused for the {needed} needed (a staging buffer smaller "
                            f"than the gradients): its stale part is not counted")
                if ok:
                    continue
                ev.fail("trace.reduced_once", f"{where}: backward "
                        f"{_why(cov, needed, full, whole, oracle)}"
                        f" in {cov.calls} collective(s)", step, rank,
                        detail="\n".join(t.describe() for t in cov.twice[:8]))


def _sized_like(oracle: OracleRecord, elements: int) -> str:
    """The parameters (up to three) whose gradient has ``elements`` real elements: what
    memory summed twice most likely holds, named as a hint."""
    names = [n for n, p in oracle.initial_params.items()
             if as_real(str(p.dtype).removeprefix("torch."), p.numel())[1] == elements]
    if not names:
        return ""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"; the size of {', '.join(repr(n) for n in names[:3])}{more}"


def _why(cov: Coverage, needed: int, full: int, whole: int, oracle: OracleRecord) -> str:
    """The failure, in words."""
    if cov.summed < needed and needed == full:
        return (f"reduced {cov.summed} of the model's {full} gradient elements "
                f"(some gradients never synchronised)")
    if cov.summed < needed:
        return (f"reduced {cov.summed} of the {needed} gradient elements defined on some "
                f"rank (the model has {full}; some gradients never synchronised)")
    if cov.twice and cov.distinct >= needed:
        first = cov.twice[0]
        return (f"reduced the same memory more than once: {first.describe()}"
                f"{_sized_like(oracle, first.elements)} ({cov.distinct} distinct elements "
                f"already cover the {needed} needed: reduced more than once)")
    frozen = f", {whole} with the parameters that need no gradient" if whole > full else ""
    return (f"reduced {cov.distinct} distinct gradient elements, the model has {full}{frozen} "
            f"({cov.distinct / max(1, full):.2f}x: reduced more than once)")
