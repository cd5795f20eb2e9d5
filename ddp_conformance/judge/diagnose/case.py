"""One failing case's cause, from its records: the relation its wrong values show.

:func:`diagnose_group` runs after the checks of one DDP group (same records, oracle and
reference): it takes the case's first failure (cause before effect,
:mod:`~ddp_conformance.judge.cause_order`) and, for a value check, tests the relations of
:mod:`.signatures` on every wrong gradient of the first failing step (the only step where
the candidate's trajectory still equals the oracle's, so that local gradients and earlier
steps' averages are comparable). A relation is stated only when it holds for every one.
"""
from __future__ import annotations

from ddp_conformance.judge.diagnose import values
from ddp_conformance.judge.diagnose.causes import CaseCause, Cause
from ddp_conformance.judge.registry import Context
from ddp_conformance.judge.verdict import CheckFailure
from ddp_conformance.script.collective import gradient_reduction

__all__ = ["CaseCause", "diagnose_group"]

#: The buffer checks whose first failure is read as a broadcast's.
BUFFER_CHECKS = ("replica.buffer_broadcast", "oracle.buffer", "reference.buffer")


def diagnose_group(ctx: Context) -> CaseCause | None:
    """The cause of the failures the checks of this group found (None: none failed)."""
    mine = [f for f in ctx.evidence.failures if f.rank is None or f.rank in ctx.records]
    if not mine:
        return None
    first = mine[0]
    wrong_group = _wrong_group(ctx)
    if wrong_group:
        return CaseCause(Cause.WRONG_GROUP, wrong_group, first.check)
    for read in (_refusal, _init, _trace, _buffers, _none, _grads, _rest):
        found = read(ctx, first)
        if found is not None:
            return found
    return CaseCause(Cause.UNEXPLAINED, _plain(first), first.check)


def _plain(failure: CheckFailure) -> str:
    return failure.message.splitlines()[0] if failure.message else failure.check


def _wrong_group(ctx: Context) -> str:
    """The backward's reductions all ran on groups of another size than the DDP group."""
    size = len(ctx.records)
    sizes = {c.group_size for rec in ctx.records.values() for c in rec.trace
             if gradient_reduction(c)}
    if not sizes or size in sizes:
        return ""
    return (f"gradients reduced over a group of {', '.join(map(str, sorted(sizes)))} ranks; "
            f"the DDP group given has {size}")


def _refusal(ctx: Context, first: CheckFailure) -> CaseCause | None:
    if first.check != "expected_error":
        return None
    return CaseCause(Cause.API_REFUSAL_MISSING, _plain(first).removeprefix("expected_error: "),
                     first.check)


def _init(ctx: Context, first: CheckFailure) -> CaseCause | None:
    if not first.check.startswith("init."):
        return None
    what = "parameters" if first.check == "init.param" else "buffers"
    return CaseCause(Cause.NO_INIT_SYNC, f"rank {first.rank} starts with {what} other than rank "
                     f"{min(ctx.records)}'s: not broadcast at construction", first.check)


def _trace(ctx: Context, first: CheckFailure) -> CaseCause | None:
    check = first.check
    if check == "trace.no_sync":
        inside, total = values.no_sync_reductions(ctx)
        if total and inside < total:
            return CaseCause(Cause.NO_SYNC_NOT_RESTORED, f"gradients reduced inside {inside} of "
                             f"{total} no_sync microbatches (after a nested no_sync ended): "
                             "sync switched on instead of restored", check)
        return CaseCause(Cause.NO_SYNC_IGNORED, f"gradients reduced inside every no_sync "
                         f"microbatch ({inside} of {total})", check)
    if check == "trace.reduced_once":
        twice = "more than once" in first.message
        return CaseCause(Cause.REDUCED_TWICE if twice else Cause.NOT_REDUCED,
                         _plain(first).removeprefix("trace.reduced_once: "), check)
    if check == "trace.dtype":
        wire = _plain(first).removeprefix("trace.dtype: ")
        seen = values.gradient_relation(ctx, "oracle.grad")
        if seen is not None and seen[0] is Cause.NARROWED_PRECISION:
            wire = f"{seen[1]}; {wire}"
        return CaseCause(Cause.NARROWED_PRECISION, wire, check)
    if check == "trace.buckets" and all(f.check == "trace.buckets" for f in ctx.evidence.failures):
        return CaseCause(Cause.BUCKET_LAYOUT, _plain(first).removeprefix("trace.buckets: "),
                         check)
    if check == "trace.consistent" and ctx.scenario.join is not None:
        return CaseCause(Cause.JOIN_NOT_SHADOWED, "ranks issued different collectives after a "
                         "rank joined: " + _plain(first).removeprefix("trace.consistent: "),
                         check)
    return None


def _buffers(ctx: Context, first: CheckFailure) -> CaseCause | None:
    if first.check not in BUFFER_CHECKS:
        return None
    found = values.buffer_source(ctx)
    return None if found is None else CaseCause(found[0], found[1], first.check)


def _none(ctx: Context, first: CheckFailure) -> CaseCause | None:
    if not first.check.endswith(".grad_none"):
        return None
    if "gradient is a tensor" in first.message:
        return CaseCause(Cause.UNUSED_NOT_NONE, f"{first.name!r} has a gradient on rank "
                         f"{first.rank} at step {first.step}, where DDP leaves None (unused "
                         "on every rank)", first.check)
    return CaseCause(Cause.UNUSED_NOT_REDUCED, f"{first.name!r} has no gradient on rank "
                     f"{first.rank} at step {first.step}, where DDP gives the reduced one "
                     "(used on another rank)", first.check)


def _grads(ctx: Context, first: CheckFailure) -> CaseCause | None:
    grad_checks = ("oracle.grad", "reference.grad")
    checks = [first.check] if first.check in grad_checks else []
    checks += [c for c in grad_checks if c not in checks and first.check in (
        "oracle.param", "reference.param", "replica.param", "trace.consistent")]
    for check in checks:
        found = values.gradient_relation(ctx, check)
        if found is not None:
            return CaseCause(found[0], found[1], check)
    return None


def _rest(ctx: Context, first: CheckFailure) -> CaseCause | None:
    if first.check == "replica.final" and ctx.scenario.join is not None:
        return CaseCause(Cause.JOIN_FINAL_SYNC, "only the end state differs: "
                         + _plain(first).removeprefix("replica.final: "), first.check)
    if first.check == "replica.param":
        return CaseCause(Cause.REPLICAS_DIVERGE, _plain(first).removeprefix("replica.param: "),
                         first.check)
    return None
