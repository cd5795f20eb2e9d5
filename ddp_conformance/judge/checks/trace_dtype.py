"""``trace.dtype``: gradients are reduced without losing precision."""
from __future__ import annotations

from ddp_conformance.catalog.scenario import Scenario, SyncStrategy
from ddp_conformance.judge.registry import Context, check, traced
from ddp_conformance.judge.trace_blind import trace_applies
from ddp_conformance.judge.trace_facts import (
    defined_gradients,
    needed_by_dtype,
    synced_microbatches,
)
from ddp_conformance.script.collective import real_counts, real_dtypes
from ddp_conformance.script.trace_rules import (
    dtype_volume_failure,
    elements_by_dtype,
    wire_offence,
    wire_rule,
)
from ddp_conformance.script.wire_dtypes import lossless, same

#: The dtype a comm hook puts on the wire, when it is not the gradients' own.
HOOK_WIRE_DTYPE = {"fp16_compress": "float16", "builtin_fp16_compress": "float16",
                   "fp16_compress_wrapper": "float16", "bf16_compress": "bfloat16"}


def hook_wire_dtype(scenario: Scenario, unread: tuple[str, ...] = ()) -> str | None:
    """The wire dtype the scenario's comm hook sets, if its reductions go through the hook.

    Under Composer's ``forced_sync`` they do not: every microbatch runs inside ``no_sync``
    and the gradients are then allreduced by hand, each in its own dtype
    (``ddp_reference.sync_strategy.forced_sync_gradients``), so the hook never runs.
    """
    if scenario.sync_strategy == SyncStrategy.FORCED_SYNC:
        return None
    mixed = scenario.ddp_options.get("mixed_precision")
    # DDP's own hook: the bucket cast to reduce_dtype, else kept in param_dtype
    if mixed and "mixed_precision" not in unread:
        return mixed.get("reduce_dtype") or mixed.get("param_dtype")
    return HOOK_WIRE_DTYPE.get(scenario.comm_hook or "")


@check("trace.dtype", when=traced)
def wire_dtype(ctx: Context) -> None:
    """Backward gradient reductions (reducing collectives of floating dtype) lose no
    precision. A wire dtype W is lossless for a gradient dtype G when W represents every
    G value exactly (float64 holds float32, which holds float16 and bfloat16; float16 and
    bfloat16 are incomparable: :mod:`~ddp_conformance.script.wire_dtypes`).

    - With a comm hook that sets the wire dtype (``fp16_compress``: float16, torch's
      ``fp16_compress_hook`` casts each bucket to float16), exactly that dtype: a hook
      that is ignored is caught. Under ``mixed_precision`` likewise its ``reduce_dtype``
      (``param_dtype`` where none is given), as torch's upcast hook reduces. Not under
      ``forced_sync``, where the hook never runs (:func:`hook_wire_dtype`), nor where
      the candidate never reads ``mixed_precision`` (``RankRecord.unread_options``: taken
      only through ``**kwargs``, passed to no torch DDP): that part is N/A with a note,
      and the rules below still apply.
    - Strict profile (``torch``, ``reference``, ``--strict-profile``): torch's exact wire
      dtype, the gradients' own (torch's reducer buckets per dtype and reduces each bucket
      in its dtype); in a mixed model each dtype's needed elements in that dtype.
    - Otherwise each reduction's dtype must be lossless for some gradient dtype of the
      model (float32 gradients allreduced in float64 and cast back lose nothing; in float16
      they do), and in a mixed model the per-dtype volume must be able to carry every
      needed element losslessly: for every set S of gradient dtypes, the needed elements
      of S are at most the elements reduced in dtypes lossless for some member of S
      (Hall's condition). Needed elements are those of the gradients defined on some rank,
      as for ``trace.reduced_once``.

    The volume part is skipped with a comm hook, for single-dtype models (the per
    collective rule and ``trace.reduced_once`` cover them) and where
    ``Scenario.trace_volume`` is off. One failure per rank for the per-collective rule,
    one in all for the volume.
    Not applied where the candidate's collectives bypassed the traced group
    (:mod:`~ddp_conformance.judge.trace_blind`)."""
    if not trace_applies(ctx, "trace.dtype"):
        return
    unread = tuple(sorted({o for rec in ctx.records.values() for o in rec.unread_options}))
    wire = hook_wire_dtype(ctx.scenario, unread)
    if wire != hook_wire_dtype(ctx.scenario):
        ctx.evidence.note("trace.dtype: the wire dtype of mixed_precision not applied: the "
                          "candidate never reads the option (taken only through **kwargs, "
                          "passed to no torch DistributedDataParallel)")
    _each_reduction(ctx, wire)
    if not wire and len(real_counts(ctx.oracle.numel_by_dtype)) > 1 and ctx.scenario.trace_volume:
        _per_dtype_volume(ctx)


def _each_reduction(ctx: Context, wire: str | None) -> None:
    # Complex gradients count as their real dtype's (collective.REAL_PAIRS).
    ev = ctx.evidence
    allowed, expected = wire_rule(real_dtypes(ctx.oracle.grad_dtypes), wire, ctx.strict)
    ev.ran("trace.dtype")
    for rank, rec in sorted(ctx.records.items()):
        c = wire_offence(rec.trace, allowed)
        if c is not None:
            ev.fail("trace.dtype", f"step {c.step}, microbatch {c.microbatch}, rank {rank}: "
                    f"gradients reduced as {c.describe()}, {expected}", c.step, rank)


def _per_dtype_volume(ctx: Context) -> None:
    ev, scenario, oracle = ctx.evidence, ctx.scenario, ctx.oracle
    relation, effect = (same, "precision changed") if ctx.strict else (lossless, "precision lost")
    for rank, rec in sorted(ctx.records.items()):
        seen = elements_by_dtype(rec.trace)
        if not seen:
            continue  # nothing reduced on this rank: trace.reduced_once says so
        for step in range(len(rec.steps)):
            for mb in synced_microbatches(scenario):
                needed = needed_by_dtype(oracle, defined_gradients(scenario, oracle, step, mb))
                why = dtype_volume_failure(needed, seen.get((step, mb), {}),
                                           oracle.numel_by_dtype, relation, effect)
                if why is not None:
                    ev.fail("trace.dtype", f"step {step}, microbatch {mb}, rank {rank}: {why}",
                            step, rank)
                    return
