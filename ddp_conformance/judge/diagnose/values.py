"""The relations of one group's records: gradients, buffers and ``no_sync`` traces.

Each function reads a judge :class:`~ddp_conformance.judge.registry.Context` and returns
the cause with the relation in words, or None when no relation of its kind holds for
*every* wrong value it looks at (:mod:`.signatures` states how exact each must be).
"""
from __future__ import annotations

import torch
from torch import Tensor

from ddp_conformance.catalog.procedure import synced
from ddp_conformance.judge.diagnose import signatures as sig
from ddp_conformance.judge.diagnose.causes import Cause
from ddp_conformance.judge.registry import Context
from ddp_conformance.script.collective import gradient_reduction

#: Wrong gradients of the first failing step a relation is tested on (the cost bound).
MAX_TENSORS = 48

Found = tuple[Cause, str]
#: One wrong gradient: (rank, parameter name, the candidate's, the expected).
Wrong = tuple[int, str, Tensor, Tensor]


def no_sync_reductions(ctx: Context) -> tuple[int, int]:
    """(microbatches inside ``no_sync`` whose backward reduced gradients, microbatches
    inside ``no_sync``), over every step of the lowest rank."""
    rec = ctx.records[min(ctx.records)]
    windows = {(step, mb) for step in range(len(rec.steps))
               for mb in range(ctx.scenario.microbatches) if not synced(ctx.scenario, mb)}
    reduced = {(c.step, c.microbatch) for c in rec.trace if gradient_reduction(c)}
    return len(windows & reduced), len(windows)


def buffer_source(ctx: Context) -> Found | None:
    """Whose buffers a rank holds at the first forward where they differ from the source's:
    its own (not broadcast) or another rank's than the source (wrong source). The
    buffers each rank held before the forward are its end state of the step before (its
    initial buffers at step 0), as recorded; equality is bitwise (a broadcast copies)."""
    records = ctx.records
    steps = min(len(r.steps) for r in records.values())
    source = min(records)
    for step in range(steps):
        before = {q: (records[q].steps[step - 1].buffers if step else records[q].initial_buffers)
                  for q in records}
        for rank in sorted(records):
            seen = records[rank].steps[step].buffers_at_forward
            if not seen or _same(seen[0], before[source]):
                continue
            order = [rank] + [q for q in sorted(records) if q != rank]  # its own first
            holder = next((q for q in order if _same(seen[0], before[q])), None)
            if holder == rank and rank != source:
                return (Cause.BUFFERS_NOT_BROADCAST, f"rank {rank} starts step {step}'s forward "
                        f"with its own buffers, expected rank {source}'s (not broadcast)")
            if holder is not None and holder != rank:
                return (Cause.BUFFERS_WRONG_SOURCE, f"rank {rank} starts step {step}'s forward "
                        f"with rank {holder}'s buffers, expected rank {source}'s")
    return None


def _same(a: dict[str, Tensor], b: dict[str, Tensor]) -> bool:
    return bool(a) and a.keys() == b.keys() and all(
        a[n].shape == b[n].shape and bool(torch.equal(a[n], b[n])) for n in a)


def gradient_relation(ctx: Context, check: str) -> Found | None:
    """The relation every wrong gradient of ``check`` (``oracle.grad`` or
    ``reference.grad``) shows at its first failing step, tried in this order: a named
    ratio (W, 1/W, Join's), an earlier step's average (before the local gradient: a stale
    DDP may hand out the local gradient at its first step), the local gradient kept,
    elements permuted, a narrower dtype's rounding, any other constant ratio."""
    found = _wrong_gradients(ctx, check)
    if found is None:
        return None
    step, wrong = found
    for relation in (_named_ratio, _stale, _kept_local, _permuted, _narrowed, _scaled):
        result = relation(ctx, step, wrong)
        if result is not None:
            return result
    return None


def _wrong_gradients(ctx: Context, check: str) -> tuple[int, list[Wrong]] | None:
    """The first failing step of ``check`` in this group and its wrong gradients (at most
    :data:`MAX_TENSORS`), each with what it should have been."""
    bad = [g for g in ctx.evidence.figures
           if g.check == check and not g.passed and g.rank in ctx.records]
    if not bad:
        return None
    step = min(g.step for g in bad)
    wrong: list[Wrong] = []
    for g in bad:
        if g.step != step or len(wrong) >= MAX_TENSORS:
            continue
        actual = ctx.records[g.rank].steps[step].grads.get(g.name)
        expected = _expected(ctx, check, step, g.rank, g.name)
        if isinstance(actual, Tensor) and isinstance(expected, Tensor):
            wrong.append((g.rank, g.name, actual, expected))
    return (step, wrong) if wrong else None


def _expected(ctx: Context, check: str, step: int, rank: int, name: str) -> Tensor | None:
    if check == "oracle.grad":
        return ctx.oracle.steps[step].grads.get(name) if step < len(ctx.oracle.steps) else None
    if ctx.reference is None or step >= len(ctx.reference[rank].steps):
        return None
    return ctx.reference[rank].steps[step].grads.get(name)


def _scale(ctx: Context, step: int, name: str) -> float:
    steps = ctx.oracle.steps
    return steps[step].grad_scales.get(name, 0.0) if step < len(steps) else 0.0


def _params(wrong: list[Wrong], ctx: Context, step: int) -> str:
    """Which parameters are wrong, against all that have a gradient (a bucket, or all)."""
    names = list(dict.fromkeys(name for _, name, _, _ in wrong))
    total = sum(1 for g in ctx.oracle.steps[step].grads.values() if g is not None) \
        if step < len(ctx.oracle.steps) else len(names)
    shown = ", ".join(names[:4]) + (f" (+{len(names) - 4})" if len(names) > 4 else "")
    return "every gradient" if len(names) >= total else f"{len(names)} of {total} gradients: {shown}"


def _named_ratio(ctx: Context, step: int, wrong: list[Wrong]) -> Found | None:
    world = len(ctx.records)
    named: list[tuple[float, Cause, str]] = []
    active = len(ctx.oracle.steps[step].active) if step < len(ctx.oracle.steps) else world
    if ctx.scenario.join is not None and active < world:  # first: W / 1 active is W too
        named += [(world / active, Cause.JOIN_DIVISOR, f"(= {world} ranks / {active} active): "
                   "Join's divisor ignored divide_by_initial_world_size"),
                  (active / world, Cause.JOIN_DIVISOR, f"(= {active} active / {world} ranks): "
                   "Join's divisor ignored divide_by_initial_world_size")]
    named += [
        (float(world), Cause.NO_DIVISION, f"(= world size {world}): summed without dividing"),
        (1.0 / world, Cause.DOUBLE_DIVISION, f"(= 1/world size {world}): divided twice")]
    overflow = any(not bool(torch.isfinite(a.detach().to_dense() if a.is_sparse else a).all())
                   for _, _, a, _ in wrong)
    for ratio, code, why in named:
        if ratio != 1.0 and all(sig.fits_ratio(a, e, ratio, world, _scale(ctx, step, n))
                                for _, n, a, e in wrong):
            return code, (f"{_params(wrong, ctx, step)} wrong at step {step} is "
                          f"{ratio:.3f}x the expected{' (or overflowed to inf)' if overflow else ''}"
                          f" {why}").replace("every gradient wrong", "every wrong gradient")
    return None


def _scaled(ctx: Context, step: int, wrong: list[Wrong]) -> Found | None:
    """One constant factor for every wrong gradient, read from the finest-dtype one (a
    bfloat16 bucket rounds the factor itself: 0.9 is 0.8984 there, within its bound)."""
    world = len(ctx.records)
    ratios = [sig.constant_ratio(a, e, world, _scale(ctx, step, n)) for _, n, a, e in wrong]
    if any(r is None for r in ratios):
        return None
    finest = min(range(len(wrong)), key=lambda i: sig.unit_roundoff(wrong[i][3].dtype))
    c = ratios[finest]
    assert c is not None
    if abs(c) < 1e-6 or not all(sig.fits_ratio(a, e, c, world, _scale(ctx, step, n)) for _, n, a, e in wrong):
        return None
    return Cause.SCALED, f"every wrong gradient at step {step} is {c:.4g}x the expected " \
                         f"(a constant factor; world size {world})"


def _kept_local(ctx: Context, step: int, wrong: list[Wrong]) -> Found | None:
    """Each wrong gradient equals a rank's local gradient, or it divided by W."""
    if step >= len(ctx.oracle.steps) or not ctx.oracle.steps[step].local:
        return None
    local, world = ctx.oracle.steps[step].local, len(ctx.records)
    owners: set[str] = set()
    for rank, name, actual, _ in wrong:
        options = {(q, d): t[name] / d for q, t in local.items() if name in t
                   for d in (1, world)}
        hit = next((k for k, t in options.items() if sig.equal_within(actual, t, world)), None)
        if hit is None:
            return None
        q, d = hit
        owners.add(("its rank's" if q == rank else f"rank {q}'s") + " local gradient"
                   + (f" / {world}" if d != 1 else ""))
    how = " or ".join(sorted(owners))
    return Cause.NOT_REDUCED, f"{_params(wrong, ctx, step)} wrong at step {step} equals " \
                              f"{how}: never reduced".replace("every gradient wrong",
                                                               "every wrong gradient")


def _stale(ctx: Context, step: int, wrong: list[Wrong]) -> Found | None:
    """Each wrong gradient equals an earlier step's expected average; or the next step
    holds this step's expected average for each of them (whatever this step held: zeros,
    the local gradient...). The average of the first failing step is comparable with
    what the candidate holds a step later: it was computed from the same parameters.
    Every wrong gradient being zero with no such later evidence is said as such."""
    world, steps = len(ctx.records), ctx.oracle.steps
    for back in (1, 2):
        if step - back >= 0 and all(
                isinstance(steps[step - back].grads.get(n), Tensor) and
                sig.equal_within(a, steps[step - back].grads[n], world)  # type: ignore[arg-type]
                for _, n, a, _ in wrong):
            return Cause.STALE_GRADIENT, (f"every wrong gradient at step {step} equals the "
                                          f"expected average of step {step - back}: "
                                          f"{back} step(s) late")
    later = [(ctx.records[r].steps[step + 1].grads.get(n), e) for r, n, _, e in wrong
             if step + 1 < len(ctx.records[r].steps)]
    if len(later) == len(wrong) and all(isinstance(g, Tensor) and sig.equal_within(g, e, world)
                                        for g, e in later):
        return Cause.STALE_GRADIENT, (f"every wrong gradient at step {step} arrives at step "
                                      f"{step + 1}: step {step + 1} holds step {step}'s "
                                      f"expected average ({_held(ctx, step, wrong)} at step "
                                      f"{step}): one step late")
    if all(not bool(a.count_nonzero()) for _, _, a, _ in wrong if not a.is_sparse):
        return Cause.UNEXPLAINED, f"every wrong gradient at step {step} is zero"
    return None


def _held(ctx: Context, step: int, wrong: list[Wrong]) -> str:
    """What the wrong gradients were at ``step``: zeros, the local gradients, or other."""
    if all(not bool(a.count_nonzero()) for _, _, a, _ in wrong if not a.is_sparse):
        return "zeros"
    local = ctx.oracle.steps[step].local if step < len(ctx.oracle.steps) else {}
    if all(r in local and n in local[r] and sig.equal_within(a, local[r][n], len(ctx.records))
           for r, n, a, _ in wrong):
        return "the local gradients"
    return "other values"


def _permuted(ctx: Context, step: int, wrong: list[Wrong]) -> Found | None:
    """The elements are the expected ones in another order; or, over every gradient of one
    rank flattened together (its buckets), a rank's local gradient entered the reduction
    permuted: ``W x actual - sum of the other ranks' locals`` is a permutation of its
    local gradient (the bound: the gradients' dtype, ``scale`` the sum of the ranks'
    largest local elements)."""
    world = len(ctx.records)
    if all(sig.permuted(a, e, world, _scale(ctx, step, n)) for _, n, a, e in wrong):
        return Cause.LAYOUT_MISMATCH, (f"{_params(wrong, ctx, step)} wrong at step {step} holds "
                                       "the expected elements in another order").replace(
            "every gradient wrong", "every wrong gradient")
    local = ctx.oracle.steps[step].local if step < len(ctx.oracle.steps) else {}
    rank = wrong[0][0]
    held = ctx.records[rank].steps[step].grads
    # Every gradient of the rank, not only the wrong ones: a bucket's permutation moves
    # elements across parameters. A rank's missing local gradient (unused there) is the
    # zeros DDP reduces in its place.
    names = [n for n, g in held.items() if isinstance(g, Tensor) and not g.is_sparse
             and any(n in t for t in local.values())]
    if len(local) != world or not names:
        return None
    actual = torch.cat([held[n].detach().reshape(-1).double() for n in names])  # type: ignore[union-attr]
    flat = {q: torch.cat([(t[n] if n in t else torch.zeros_like(held[n]))  # type: ignore[arg-type]
                          .detach().reshape(-1).double() for n in names])
            for q, t in local.items()}
    scale = float(sum(f.abs().max() for f in flat.values()))
    for q in sorted(flat):
        rest = sum((flat[p] for p in flat if p != q), torch.zeros_like(actual))
        if sig.permuted(world * actual - rest, flat[q], world, scale, wrong[0][3].dtype):
            return Cause.LAYOUT_MISMATCH, (f"rank {q}'s local gradient entered the reduction "
                                           f"with its elements permuted (step {step}, "
                                           f"{_params(wrong, ctx, step)}): its bucket is laid "
                                           "out differently")
    return None


def _narrowed(ctx: Context, step: int, wrong: list[Wrong]) -> Found | None:
    world = len(ctx.records)
    dtypes = {sig.narrowed_through(a, e, world, _scale(ctx, step, n)) for _, n, a, e in wrong}
    worst = max(float(((a.double() - e.double()).abs().max())
                      / max(sig.magnitude(e, _scale(ctx, step, n)), 1e-300))
                for _, n, a, e in wrong)
    if len(dtypes) == 1 and None not in dtypes:
        narrow = dtypes.pop()
        assert narrow is not None
        return Cause.NARROWED_PRECISION, (
            f"every wrong gradient at step {step} is representable in {_name(narrow)} (the "
            f"expected is not), relative error {worst:.2g} ~ {_name(narrow)} rounding "
            f"(u = {sig.unit_roundoff(narrow):.2g})")
    dtypes = {sig.rounding_dtype(a, e, world, _scale(ctx, step, n)) for _, n, a, e in wrong}
    if len(dtypes) == 1 and None not in dtypes:
        narrow = dtypes.pop()
        assert narrow is not None
        return Cause.NARROWED_PRECISION, (
            f"relative error {worst:.2g} at step {step} ~ {_name(narrow)} rounding "
            f"(u = {sig.unit_roundoff(narrow):.2g}), far above the gradients' own dtype's")
    return None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
