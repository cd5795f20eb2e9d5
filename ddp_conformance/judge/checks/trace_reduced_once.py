"""``trace.reduced_once``: every synced backward reduces every needed gradient element once."""
from __future__ import annotations

from ddp_conformance.judge.registry import Context, check, traced
from ddp_conformance.judge.trace_blind import trace_applies
from ddp_conformance.judge.trace_facts import (
    defined_gradients,
    needed_by_dtype,
    reduced_numel,
    scenario_group_size,
    synced_microbatches,
)
from ddp_conformance.judge.verdict import Figure
from ddp_conformance.script import trace_rules as rules
from ddp_conformance.script.summed_memory import Coverage, backward_coverage
from ddp_conformance.script.trace_rules import parameter_numel, row_padding


def _volume_checked(ctx: Context) -> bool:
    return traced(ctx) and ctx.scenario.trace_volume


@check("trace.reduced_once", when=_volume_checked)
def reduced_once(ctx: Context) -> None:
    """Every synced backward reduces every element of every gradient *defined on some
    rank* exactly once, judged on the memory that reducing collectives (allreduce,
    reduce-scatter, reduce) of floating dtype summed in that backward, element by element
    of storage (:mod:`~ddp_conformance.script.summed_memory`; the verdict is
    :func:`~ddp_conformance.script.trace_rules.reduced_once`):

    - at least the elements of the parameters whose gradient a local backward produced
      on some active rank since the previous synced backward (under ``no_sync``, the
      union over the window's microbatches: ``trace_facts.defined_gradients``), counting
      what the reductions summed. A gradient that is ``None`` on every rank (a globally
      unused parameter) may be skipped: its value stays what it was either way;
    - no memory summed twice in one backward once the distinct memory reduced covers
      the needed gradients: a bucket or a gradient reduced again (evidence: the two
      reductions and the buffer's elements). A staging buffer reused because it is
      smaller than the gradients (fairseq with a small ``buffer_size``) is told apart by
      that: its distinct memory falls short of what was needed, or, where every rank's
      trace is at hand, its contents were rewritten with local gradients since; its stale
      tails are then not counted (a note says so). A refilled buffer with room for all the
      model's gradients is no staging buffer: summed again in the same backward (once per
      nested backward of a reentrant checkpoint), it carries gradients already reduced;
    - at most as many distinct elements as the whole model's parameters, frozen ones
      included (a flat buffer over every parameter, reduced whole, as fairseq's legacy
      DDP does: its padding is memory summed once, not a gradient reduced twice), plus
      ``group_size - 1`` per collective (a sharded candidate pads each collective to a
      multiple of the group size) and, where the rank reduce-scatters, ``group_size - 1``
      rows of every parameter (FSDP2 pads each parameter's dim 0 to a multiple of the
      group size:
      :func:`~ddp_conformance.script.trace_rules.row_padding`). Twice the model through
      distinct buffers is caught.

    Where the candidate's collectives bypassed the traced group, not applied
    (:mod:`~ddp_conformance.judge.trace_blind`). Scenarios whose comm hook compresses
    (PowerSGD) or whose gradients are sparse opt out (``Scenario.trace_volume``).
    """
    if not trace_applies(ctx, "trace.reduced_once"):
        return
    ev, scenario, oracle = ctx.evidence, ctx.scenario, ctx.oracle
    ev.ran("trace.reduced_once")
    full = reduced_numel(oracle)  # in real elements: a complex one counts as two
    whole = max(full, parameter_numel(oracle.initial_params))
    for rank, rec in sorted(ctx.records.items()):
        peers = [r.trace for k, r in sorted(ctx.records.items()) if k != rank]
        covered, noted = backward_coverage(rec.trace, peers), False
        for step in range(len(rec.steps)):
            for mb in synced_microbatches(scenario):
                names = defined_gradients(scenario, oracle, step, mb)
                needed = sum(needed_by_dtype(oracle, names).values())  # None: all, = full
                cov = covered.get((step, mb), Coverage(0, 0, 0, ()))
                size = scenario_group_size(rec)
                slack = (size - 1) * cov.calls + row_padding(oracle.initial_params, size,
                                                              rec.trace)
                noted = _judge_backward(ctx, (step, mb, rank), cov, needed, full, whole, slack,
                                        noted)


def _judge_backward(ctx: Context, where: tuple[int, int, int], cov: Coverage, needed: int,
                    full: int, whole: int, slack: int, noted: bool) -> bool:
    """The figure, the note (once per rank: ``noted``) and the failure of the synced
    backward of (step, microbatch) on a rank; whether the note was given."""
    ev, oracle = ctx.evidence, ctx.oracle
    step, mb, rank = where
    ok, reused = rules.reduced_once(cov, needed, whole, slack)
    of = f"{full}" if needed == full else f"{needed} to {full}"
    detail = f"{cov.distinct} of {of} elements"
    if cov.summed != cov.distinct:
        detail += f" ({cov.summed} summed)"
    ev.figure(Figure("trace.reduced_once", step, rank, "*", ok,
                     float(cov.distinct - full), 0.0, 0.0, float(slack), detail))
    place = f"step {step}, microbatch {mb}, rank {rank}"
    if reused and not noted:
        noted = True
        ev.note(f"trace.reduced_once: {place}: memory reduced earlier in the backward was "
                f"reduced again holding gradients copied in since (a staging buffer "
                f"reused, {cov.distinct} distinct elements for the {needed} needed): its "
                f"stale part is not counted")
    if not ok:
        why = rules.reduced_once_failure(cov, needed, full, whole, oracle.initial_params)
        ev.fail("trace.reduced_once", f"{place}: backward {why} in {cov.calls} collective(s)",
                step, rank, detail="\n".join(t.describe()
                                              for t in (cov.twice + cov.redone(whole))[:8]))
    return noted
