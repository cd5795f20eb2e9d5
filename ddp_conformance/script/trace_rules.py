"""The collective trace's rules, as pure functions over one rank's :class:`Collective` list.

The harness's ``trace.no_sync``, ``trace.dtype`` and ``trace.reduced_once`` check units
(``judge/checks/trace_*.py``) and a reproducer's ``check_collectives`` read a trace
through these functions: what counts as synchronising inside ``no_sync``, which wire
dtypes a gradient reduction may use, what a synced backward must have reduced (the
gradients *defined on some rank*) and the reduced-once verdict over storage extents
(:mod:`.summed_memory`). The callers turn what they return into their evidence.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ddp_conformance.script.collective import (
    FLOATING,
    STEP_STAGES,
    SYNCING,
    Collective,
    as_real,
    gradient_reduction,
    real_counts,
)
from ddp_conformance.script.summed_memory import Coverage
from ddp_conformance.script.wire_dtypes import Relation, holders, lossless, shortfall


def no_sync_offence(trace: Iterable[Collective], synced: Callable[[int], bool],
                    buffers_broadcast: Callable[[int, int], bool],
                    join: bool) -> Collective | None:
    """The first collective of ``trace`` that synchronises inside ``no_sync``, or None.

    Inside ``no_sync`` (a microbatch whose backward is not ``synced``) a forward or
    backward must not reduce nor broadcast floating-point data (gathering is allowed: a
    sharded candidate gathers its weights), except the buffer broadcast at a forward that
    follows a synced one (``buffers_broadcast(step, microbatch)``) and, under ``join``, the
    one-element allreduce by which Join counts the ranks still active. Integer data (the
    bucket layout torch broadcasts once, as int32) is not synchronisation of the model.
    """
    for c in trace:
        if c.stage not in STEP_STAGES or synced(c.microbatch) or c.dtype not in FLOATING \
                or c.kind not in SYNCING:
            continue
        if c.stage == "forward" and c.kind == "broadcast" and buffers_broadcast(c.step, c.microbatch):
            continue  # the buffer broadcast torch owes the previous synced forward
        if join and c.kind == "allreduce" and c.numel == 1 and c.stage == "forward":
            continue  # Join's count of active ranks
        return c
    return None


def wire_rule(grad_dtypes: frozenset[str], wire: str | None,
              strict: bool) -> tuple[Callable[[str], bool], str]:
    """Which wire dtypes a gradient reduction may use, and what was expected, in words.

    ``wire``: the dtype a comm hook (or mixed precision) sets: exactly that one. Else
    ``strict``: the gradients' own dtypes (torch's reducer reduces each bucket in its
    dtype); else any dtype lossless for some gradient dtype (:mod:`.wire_dtypes`).
    ``grad_dtypes`` are real dtypes (:func:`~.collective.real_dtypes`)."""
    own = " or ".join(sorted(grad_dtypes))
    if wire:
        return (lambda w: w == wire), f"expected {wire} (precision silently changed)"
    if strict:
        return (lambda w: w in grad_dtypes), (
            f"expected {own} (strict profile: torch's wire dtype, the gradients' own; "
            f"precision silently changed)")
    wider = [w for w in holders(grad_dtypes, lossless) if w not in grad_dtypes]
    exactly = f" or a dtype that holds it exactly ({' or '.join(wider)})" if wider else ""
    return (lambda w: any(lossless(w, g) for g in grad_dtypes)), \
        f"expected {own}{exactly} (precision lost)"


def wire_offence(trace: Iterable[Collective], allowed: Callable[[str], bool]) -> Collective | None:
    """The first gradient reduction of ``trace`` in a wire dtype not ``allowed``, or None."""
    for c in trace:
        if gradient_reduction(c) and not allowed(as_real(c.dtype, c.numel)[0]):
            return c
    return None


def reduced_numel(numel_by_dtype: Mapping[str, int]) -> int:
    """Real elements of the gradients a synced backward reduces (all that require one)."""
    return sum(real_counts(numel_by_dtype).values())


def elements_by_dtype(trace: Iterable[Collective]) -> dict[tuple[int, int], dict[str, int]]:
    """Per (step, microbatch): elements reduced in backward per wire dtype (in trace order)."""
    seen: dict[tuple[int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for c in trace:
        if gradient_reduction(c):
            dtype, numel = as_real(c.dtype, c.numel)
            seen[(c.step, c.microbatch)][dtype] += numel
    return seen


def defined_gradients(local_grads: Sequence[frozenset[str]] | None, microbatches: int,
                      synced_microbatches: Sequence[int], microbatch: int) -> frozenset[str] | None:
    """The parameters whose gradient the synced backward of ``microbatch`` must reduce:
    produced locally on some active rank (``local_grads``: per microbatch of the step,
    ``OracleStep.local_grads``) in a microbatch since the previous synced one of the step
    (zero_grad at every step ends the window). None where not recorded: then every
    parameter that requires a gradient counts."""
    if local_grads is None or len(local_grads) < microbatches:
        return None
    start = max((mb + 1 for mb in synced_microbatches if mb < microbatch), default=0)
    return frozenset().union(*local_grads[start:microbatch + 1])


def _real_numel(t: Any) -> tuple[str, int]:
    return as_real(str(t.dtype).removeprefix("torch."), t.numel())


def needed_by_dtype(numel_by_dtype: Mapping[str, int], params: Mapping[str, Any],
                    names: frozenset[str] | None) -> dict[str, int]:
    """Real elements per dtype of the gradients ``names`` of ``params`` (None: all that
    require gradients, ``numel_by_dtype``), in the model's dtype order."""
    if names is None:
        return real_counts(numel_by_dtype)
    needed = dict.fromkeys(real_counts(numel_by_dtype), 0)
    for name in names:
        dtype, numel = _real_numel(params[name])
        needed[dtype] = needed.get(dtype, 0) + numel
    return needed


def row_padding(params: Mapping[str, Any], group_size: int,
                trace: Iterable[Collective]) -> int:
    """Real elements a sharded candidate may add by padding each parameter's first
    dimension to a multiple of the group size (FSDP2 shards every parameter along dim 0:
    at most ``group_size - 1`` rows of it, a row being its elements past dim 0); 0 where
    ``trace`` has no reduce-scatter in a backward (nothing is sharded)."""
    if not any("reduce_scatter" in c.kind for c in trace if c.stage == "backward"):
        return 0
    rows = sum(_real_numel(p)[1] // max(1, p.shape[0]) if p.dim() else _real_numel(p)[1]
               for p in params.values() if str(p.dtype).removeprefix("torch.") in FLOATING)
    return (group_size - 1) * rows


def parameter_numel(params: Mapping[str, Any]) -> int:
    """Real elements of every floating parameter, those that require no gradient included:
    what a flat buffer over the whole model (fairseq's) holds."""
    return sum(_real_numel(p)[1] for p in params.values()
               if str(p.dtype).removeprefix("torch.") in FLOATING)


def dtype_volume_failure(needed: Mapping[str, int], got: Mapping[str, int],
                         numel_by_dtype: Mapping[str, int], relation: Relation,
                         effect: str) -> str | None:
    """Why one synced backward's per-dtype volume (``got``: elements reduced per wire
    dtype) cannot have carried the ``needed`` elements per gradient dtype under
    ``relation`` (Hall's condition, :func:`~.wire_dtypes.shortfall`), or None."""
    short = shortfall(needed, got, relation)
    if short is None:
        return None
    kinds = " and ".join(short.dtypes)
    full = sum(real_counts(numel_by_dtype).get(d, 0) for d in short.dtypes)
    of = (f"the model's {short.needed} {kinds} gradient elements" if short.needed == full
          else f"the {short.needed} {kinds} gradient elements defined on some rank")
    into = " or ".join(holders(frozenset(short.dtypes), relation))
    return f"only {short.covered} of {of} were reduced in {into} (reduced as {dict(got)}: {effect})"


def reduced_once(cov: Coverage, needed: int, whole: int, slack: int) -> tuple[bool, bool]:
    """``(ok, reused)`` for one synced backward's reductions ``cov``: at least the
    ``needed`` elements summed, at most ``whole`` distinct elements plus ``slack``
    (padding) outside refilled staging buffers, unless contents show no reduction of
    values already reduced (``cov.settled`` 0: the excess is a buffer's tail that never
    held a gradient), no values summed twice (``cov.twice``).
    ``reused``: memory summed again by a staging buffer refilled since (judged by
    contents: :mod:`.summed_memory`), or, where contents cannot speak
    (``cov.proven`` false), by one smaller than the gradients (its distinct memory falls
    short of what was needed); neither is counted as twice, unless the refilled buffer
    had room for all ``whole`` elements (:meth:`~.summed_memory.Coverage.redone`)."""
    redone = cov.redone(whole)  # refilled, though every gradient fitted: reduced again
    short = bool(cov.twice) and cov.distinct < needed and not cov.proven
    reused = short or (cov.restaged > 0 and not redone)
    twice = (bool(cov.twice) and not short) or bool(redone)
    over = (cov.distinct - (0 if redone else cov.staging) > whole + slack
            and cov.settled != 0)
    return needed <= cov.summed and not over and not twice, reused


def _sized_like(params: Mapping[str, Any], elements: int) -> str:
    """The parameters (up to three) whose gradient has ``elements`` real elements: what
    memory summed twice most likely holds, named as a hint."""
    names = [n for n, p in params.items() if _real_numel(p)[1] == elements]
    if not names:
        return ""
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"; the size of {', '.join(repr(n) for n in names[:3])}{more}"


def reduced_once_failure(cov: Coverage, needed: int, full: int, whole: int,
                         params: Mapping[str, Any]) -> str:
    """Why :func:`reduced_once` failed, in words (``full``: the elements of every gradient;
    ``params``: the model's parameters by name, for a hint)."""
    if cov.summed < needed and needed == full:
        return (f"reduced {cov.summed} of the model's {full} gradient elements "
                f"(some gradients never synchronised)")
    if cov.summed < needed:
        return (f"reduced {cov.summed} of the {needed} gradient elements defined on some "
                f"rank (the model has {full}; some gradients never synchronised)")
    redone = cov.redone(whole)
    if redone:
        first = redone[0]
        return (f"reduced the same memory more than once: {first.describe()} (a buffer of "
                f"{cov.room} elements, room for all {whole} of the model's, refilled and "
                f"reduced again in one backward: gradients already reduced, reduced again)")
    if cov.twice and cov.proven:
        first = cov.twice[0]
        return (f"reduced the same memory more than once: {first.describe()}"
                f"{_sized_like(params, first.elements)} (it held, bitwise the same on every "
                f"rank, what the first reduction left: values already reduced, reduced "
                f"more than once)")
    if cov.twice and cov.distinct >= needed:
        first = cov.twice[0]
        return (f"reduced the same memory more than once: {first.describe()}"
                f"{_sized_like(params, first.elements)} ({cov.distinct} distinct elements "
                f"already cover the {needed} needed: reduced more than once)")
    frozen = f", {whole} with the parameters that need no gradient" if whole > full else ""
    return (f"reduced {cov.distinct} distinct gradient elements, the model has {full}{frozen} "
            f"({cov.distinct / max(1, full):.2f}x: reduced more than once)")
