"""``trace.reduced_once``: every synced backward reduces every needed gradient element once."""
from __future__ import annotations

from ddp_conformance.judge.registry import Context, check, traced
from ddp_conformance.judge.trace_facts import (
    defined_gradients,
    gradient_elements,
    needed_by_dtype,
    reduced_numel,
    scenario_group_size,
    synced_microbatches,
)
from ddp_conformance.judge.verdict import Figure


def _volume_checked(ctx: Context) -> bool:
    return traced(ctx) and ctx.scenario.trace_volume


@check("trace.reduced_once", when=_volume_checked)
def reduced_once(ctx: Context) -> None:
    """Every synced backward reduces every element of every gradient *defined on some
    rank* exactly once, counting the elements that reducing collectives (allreduce,
    reduce-scatter) of floating dtype sum in that backward:

    - at least the elements of the parameters whose gradient a local backward produced
      on some active rank since the previous synced backward (under ``no_sync``, the
      union over the window's microbatches: ``trace_facts.defined_gradients``). A
      gradient that is ``None`` on every rank (a globally unused parameter) may be
      skipped: its value stays what it was either way (torch leaves it untouched);
    - at most the elements of all parameters that require gradients, plus up to
      ``group_size - 1`` per collective: torch reduces whole buckets, unused parameters
      included, and a sharded candidate pads each collective to a multiple of the group
      size. Twice the model, or part of it, is caught.

    A candidate whose reductions the trace cannot see at all (C++ functional collectives
    looking the backend up by device) gets a note instead. Scenarios whose comm hook
    compresses (PowerSGD) or whose gradients are sparse opt out (``Scenario.trace_volume``).
    """
    ev, scenario, oracle = ctx.evidence, ctx.scenario, ctx.oracle
    ev.ran("trace.reduced_once")
    full = reduced_numel(oracle)  # in real elements: a complex one counts as two
    for rank, rec in sorted(ctx.records.items()):
        totals = gradient_elements(rec.trace)
        if rec.steps and not totals:
            # Nothing reduced through the traced group in any backward: the candidate's
            # collectives bypass it (C++ functional collectives, its own groups). Its values
            # are still checked; the volume cannot be.
            ev.note(f"trace.reduced_once not applied on rank {rank}: the trace saw no "
                    "gradient reduction (collectives outside the traced process group)")
            continue
        for step in range(len(rec.steps)):
            for mb in synced_microbatches(scenario):
                names = defined_gradients(scenario, oracle, step, mb)
                needed = sum(needed_by_dtype(oracle, names).values())  # None: all, = full
                total, calls = totals.get((step, mb), (0, 0))
                slack = (scenario_group_size(rec) - 1) * calls
                ok = needed <= total <= full + slack
                of = f"{full}" if needed == full else f"{needed} to {full}"
                ev.figure(Figure("trace.reduced_once", step, rank, "*", ok, float(total - full),
                                 0.0, 0.0, float(slack), f"{total} of {of} elements"))
                if ok:
                    continue
                if total < needed and needed == full:
                    why = f"reduced {total} of the model's {full} gradient elements " \
                          f"(some gradients never synchronised)"
                elif total < needed:
                    why = f"reduced {total} of the {needed} gradient elements defined on some " \
                          f"rank (the model has {full}; some gradients never synchronised)"
                else:
                    why = f"reduced {total} gradient elements, the model has {full} " \
                          f"({total / max(1, full):.2f}x: reduced more than once)"
                ev.fail("trace.reduced_once", f"step {step}, microbatch {mb}, rank {rank}: "
                        f"backward {why} in {calls} collective(s)", step, rank)
