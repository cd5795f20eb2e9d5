"""No PASS on nothing: when the trace cannot have seen the candidate's synchronisation.

A candidate may reduce through a process group of its own that the harness does not
trace (torchft's managed group: a ``ProcessGroupGloo`` built on a ``PrefixStore``), or
through C++ functional collectives that look the backend up by device. Its gradients
are then synchronised (the value checks say whether rightly) while the trace shows none
of it, and a trace check that found nothing wrong has checked nothing.

:func:`bypass` says when that is so; :func:`trace_applies`, called first by every
``trace.*`` check unit, then records the note ``"<check> not applied: the candidate's
collectives bypassed the traced group (...)"`` and the unit reports nothing (its id is
not among the checks run): never a PASS having seen nothing.
"""
from __future__ import annotations

import torch

from ddp_conformance.catalog.procedure import synced
from ddp_conformance.judge.registry import Context
from ddp_conformance.judge.trace_facts import (
    defined_gradients,
    gradient_elements,
    needed_by_dtype,
    synced_microbatches,
)

NOT_APPLIED = "not applied: the candidate's collectives bypassed the traced group"


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Bitwise the same gradient (NaN where NaN, both None)."""
    if a is None or b is None:
        return a is b
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.detach().cpu(), b.detach().cpu()
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype.is_floating_point:
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def gradients_synchronised(ctx: Context) -> bool:
    """Every rank of the group holds bitwise the same gradients after every step whose
    last microbatch is synced (there is at least one, with a gradient): the gradients
    were synchronised, by whatever route."""
    if not synced(ctx.scenario, ctx.scenario.microbatches - 1):
        return False
    records = [rec for _, rec in sorted(ctx.records.items())]
    steps = min((len(rec.steps) for rec in records), default=0)
    seen = False
    for step in range(steps):
        base = records[0].steps[step].grads
        for rec in records[1:]:
            grads = rec.steps[step].grads
            if set(grads) != set(base) or not all(_same(base[n], grads[n]) for n in base):
                return False
        seen = seen or any(g is not None for g in base.values())
    return seen and len(records) > 1


#: "Far fewer": the traced gradient reductions of a rank's synced backwards cover less than
#: this share of the gradient elements they needed. A candidate that reduces through its
#: own group may still send a few small floating collectives through the traced one (a
#: loss scale, a norm, a commit vote); one that skips part of its gradients sends most
#: of them, and is judged (``trace.reduced_once``: "never synchronised").
FAR_FEWER = 0.1


def _shortfall(ctx: Context, rank: int) -> str | None:
    """How far the rank's traced backward reductions fall short of what its synced
    backwards needed, when below :data:`FAR_FEWER` of it (None: they do not)."""
    rec, totals = ctx.records[rank], gradient_elements(ctx.records[rank].trace)
    seen = needed = 0
    for step in range(len(rec.steps)):
        for mb in synced_microbatches(ctx.scenario):
            names = defined_gradients(ctx.scenario, ctx.oracle, step, mb)
            needed += sum(needed_by_dtype(ctx.oracle, names).values())
            seen += totals.get((step, mb), (0, 0))[0]
    if needed == 0 or seen >= FAR_FEWER * needed:
        return None
    return (f"rank {rank}: {seen} of the {needed} gradient elements its synced backwards "
            f"needed went through it")


def bypass(ctx: Context) -> str | None:
    """Why the trace cannot judge this run (None: it can): the scenario trains, its
    traced volume means something (``Scenario.trace_volume``: not under PowerSGD, whose
    compressed volume is a fraction of the gradients', nor ``noop_hook``, which reduces
    nothing, nor for sparse gradients, which are gathered), and on every rank of the
    group the synced backwards reduced far fewer gradient elements through the traced
    group than they needed (:data:`FAR_FEWER`; none at all,
    typically), whatever the ranks' gradients hold afterwards. Whether they agree says
    nothing of the route: a candidate that reduces through its own group and has a
    defect elsewhere (a parameter left ``None`` on some ranks) leaves them disagreeing,
    and the trace still saw none of its collectives; what the gradients hold is the
    value checks' to judge. (:func:`gradients_synchronised` says which case it is, for
    the note.)"""
    if ctx.expects_error or not ctx.trace or not ctx.scenario.trace_volume:
        return None  # no volume to expect: a compressing or no-op hook, sparse gradients
    reasons = []
    for rank in sorted(ctx.records):
        reason = _shortfall(ctx, rank)
        if reason is None:
            return None  # the cheap test first: a trace that saw enough is judged
        reasons.append(reason)
    if not reasons:
        return None
    held = ("every rank holds the same gradients" if gradients_synchronised(ctx) else
            "the value checks judge what the ranks hold")
    return f"{reasons[0]}; {held}"


def trace_applies(ctx: Context, check: str) -> bool:
    """Whether trace check ``check`` can judge this run; where not, note why (once per
    check and group) and report nothing for it."""
    why = ctx.once(bypass)
    if why is None:
        return True
    ctx.evidence.note(f"{check} {NOT_APPLIED} ({why})")
    return False
