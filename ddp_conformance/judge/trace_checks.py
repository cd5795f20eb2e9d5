"""Checks on the collective trace (see :mod:`ddp_conformance.trace`).

- ``trace.no_sync``: no reduction and no broadcast of floating-point data (gradients,
  parameters, buffers) in the forward or backward of a microbatch inside ``no_sync()``
  (torch: ``no_sync`` disables gradient synchronisation). Gathering parameters is allowed
  (a sharded candidate all-gathers its weights for every forward). Two exceptions follow
  torch: the buffer broadcast at a forward that follows a synced forward
  (``procedure.buffers_broadcast``), and integer metadata: torch rebuilds its buckets
  once, at the first forward after the first synced backward, and broadcasts the new
  layout as int32 even inside ``no_sync``. Under Join, the one-element allreduce by which
  Join counts the ranks still active is allowed too.
- ``trace.reduced_once``: every synced backward reduces every gradient element exactly
  once: the elements summed by reducing collectives (allreduce, reduce-scatter) of
  floating dtype in that backward equal the number of elements of parameters that require
  gradients. A sharded candidate may pad each collective to a multiple of the group size,
  so up to ``group_size - 1`` extra elements per collective are allowed; twice the model,
  or part of it, is not. A candidate whose reductions the trace cannot see at all (C++
  functional collectives looking the backend up by device) gets a note instead.
  Scenarios whose comm hook compresses (PowerSGD) or whose gradients are sparse opt out
  (``Scenario.trace_volume``).
- ``trace.dtype``: gradients are reduced in their own dtype (a float32 model's buckets
  in float32: nothing silently downcast; in a mixed model each dtype's elements in that
  dtype), or in the comm hook's wire dtype (``fp16_compress``: float16).
- ``trace.consistent``: every rank of a group issued the same sequence of collectives
  (kind, dtype, element count, group size); the first difference is named with both
  sequences side by side. Mismatched collectives hang or corrupt real jobs.
- ``trace.buckets`` (strict profile): the per-backward sequence of gradient allreduce
  sizes equals the reference DDP's, i.e. the same bucket layout as torch's DDP. Enforced
  for ``torch`` and ``reference`` and under ``--strict-profile``; otherwise reported only.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ddp_conformance.catalog.procedure import buffers_broadcast, synced
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.oracle import OracleRecord
from ddp_conformance.judge.verdict import Figure
from ddp_conformance.ranks.records import RankRecord
from ddp_conformance.ranks.tracing import REDUCING, Collective

FLOATING = frozenset({"float64", "float32", "float16", "bfloat16"})
#: What ``no_sync`` forbids: reducing or overwriting data across ranks (not gathering).
SYNCING = REDUCING | {"broadcast", "scatter"}
STEP_STAGES = frozenset({"forward", "backward"})


#: The dtype a comm hook puts on the wire, when it is not the gradients' own.
HOOK_WIRE_DTYPE = {"fp16_compress": "float16"}


def check_trace(ev: Evidence, scenario: Scenario, records: dict[int, RankRecord],
                oracle: OracleRecord, reference: dict[int, RankRecord] | None,
                enforce_buckets: bool) -> None:
    if scenario.expect_error is not None:
        _consistent(ev, records)  # the failing iteration is no DDP step: only agreement
        return
    reduced_numel = oracle.reduced_numel
    wire = HOOK_WIRE_DTYPE.get(scenario.comm_hook or "")
    _dtypes(ev, records, frozenset({wire}) if wire else oracle.grad_dtypes)
    if not wire and len(oracle.numel_by_dtype) > 1 and scenario.trace_volume:
        _per_dtype_volume(ev, scenario, records, oracle.numel_by_dtype)
    _no_sync(ev, scenario, records)
    if scenario.trace_volume:
        _reduced_once(ev, scenario, records, reduced_numel)
    _consistent(ev, records)
    if reference is not None:
        _buckets(ev, records, reference, enforce_buckets)


def _no_sync(ev: Evidence, scenario: Scenario, records: dict[int, RankRecord]) -> None:
    if scenario.microbatches < 2 or synced(scenario, 0):
        return
    ev.ran("trace.no_sync")
    for rank, rec in sorted(records.items()):
        for c in rec.trace:
            if c.stage not in STEP_STAGES or synced(scenario, c.microbatch) \
                    or c.dtype not in FLOATING or c.kind not in SYNCING:
                continue
            if c.stage == "forward" and c.kind == "broadcast" and \
                    buffers_broadcast(scenario, c.step, c.microbatch):
                continue  # the buffer broadcast torch owes the previous synced forward
            if scenario.join is not None and c.kind == "allreduce" and c.numel == 1 \
                    and c.stage == "forward":
                continue  # Join's count of active ranks
            ev.fail("trace.no_sync", f"step {c.step}, microbatch {c.microbatch} (inside "
                    f"no_sync), rank {rank}: {c.describe()} issued in {c.stage}",
                    c.step, rank)
            break


def _dtypes(ev: Evidence, records: dict[int, RankRecord], allowed: frozenset[str]) -> None:
    ev.ran("trace.dtype")
    for rank, rec in sorted(records.items()):
        for c in rec.trace:
            if c.stage == "backward" and c.kind in REDUCING and c.dtype in FLOATING \
                    and c.dtype not in allowed:
                ev.fail("trace.dtype", f"step {c.step}, microbatch {c.microbatch}, rank {rank}: "
                        f"gradients reduced as {c.describe()}, expected "
                        f"{' or '.join(sorted(allowed))} (precision silently changed)",
                        c.step, rank)
                break


def _per_dtype_volume(ev: Evidence, scenario: Scenario, records: dict[int, RankRecord],
                      expected: dict[str, int]) -> None:
    """A mixed-dtype model: every dtype's gradients are reduced in that dtype (buckets are
    per dtype), so each dtype's reduced volume covers its parameters."""
    for rank, rec in sorted(records.items()):
        seen: dict[tuple[int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for c in rec.trace:
            if c.stage == "backward" and c.kind in REDUCING and c.dtype in FLOATING:
                seen[(c.step, c.microbatch)][c.dtype] += c.numel
        if not seen:
            continue  # a blind trace: noted by trace.reduced_once
        for step in range(len(rec.steps)):
            for mb in range(scenario.microbatches):
                if not synced(scenario, mb):
                    continue
                got = seen.get((step, mb), {})
                short = {d: n for d, n in expected.items() if got.get(d, 0) < n}
                if short:
                    d, n = next(iter(short.items()))
                    ev.fail("trace.dtype", f"step {step}, microbatch {mb}, rank {rank}: only "
                            f"{got.get(d, 0)} of the model's {n} {d} gradient elements were "
                            f"reduced in {d} (reduced as {dict(got)}: precision changed)",
                            step, rank)
                    return


def gradient_elements(trace: Iterable[Collective]) -> dict[tuple[int, int], tuple[int, int]]:
    """Per (step, microbatch): elements reduced in backward, and the number of collectives."""
    totals: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for c in trace:
        if c.stage == "backward" and c.kind in REDUCING and c.dtype in FLOATING:
            entry = totals[(c.step, c.microbatch)]
            entry[0] += c.numel
            entry[1] += 1
    return {k: (v[0], v[1]) for k, v in totals.items()}


def _reduced_once(ev: Evidence, scenario: Scenario, records: dict[int, RankRecord],
                  expected: int) -> None:
    ev.ran("trace.reduced_once")
    for rank, rec in sorted(records.items()):
        totals = gradient_elements(rec.trace)
        if rec.steps and not totals:
            # Nothing reduced through the traced group in any backward: the candidate's
            # collectives bypass it (C++ functional collectives, its own groups). Its values
            # are still checked; the volume cannot be.
            ev.note(f"trace.reduced_once not applied on rank {rank}: the trace saw no "
                    "gradient reduction (collectives outside the traced process group)")
            continue
        for step in range(len(rec.steps)):
            for mb in range(scenario.microbatches):
                if not synced(scenario, mb):
                    continue
                total, calls = totals.get((step, mb), (0, 0))
                slack = (scenario_group_size(rec) - 1) * calls
                ok = expected <= total <= expected + slack
                ev.figures.append(Figure("trace.reduced_once", step, rank, "*", ok, float(total - expected),
                                         0.0, 0.0, float(slack), f"{total} of {expected} elements"))
                if ok:
                    continue
                if total < expected:
                    why = f"reduced {total} of the model's {expected} gradient elements " \
                          f"(some gradients never synchronised)"
                else:
                    why = f"reduced {total} gradient elements, the model has {expected} " \
                          f"({total / max(1, expected):.2f}x: reduced more than once)"
                ev.fail("trace.reduced_once", f"step {step}, microbatch {mb}, rank {rank}: "
                        f"backward {why} in {calls} collective(s)", step, rank)


def scenario_group_size(rec: RankRecord) -> int:
    sizes = [c.group_size for c in rec.trace if c.stage == "backward"]
    return max(sizes) if sizes else 1


def side_by_side(left: list[Collective], right: list[Collective], start: int, left_name: str,
                 right_name: str, rows: int = 8) -> str:
    """Two collective sequences as columns, from a little before ``start``."""
    lo = max(0, start - 2)
    lines = [f"{'#':>4}  {left_name:<44} {right_name}"]
    for i in range(lo, min(max(len(left), len(right)), start + rows)):
        a = left[i] if i < len(left) else None
        b = right[i] if i < len(right) else None
        mark = ">>" if i == start else "  "

        def cell(c: Collective | None) -> str:
            return "(nothing)" if c is None else f"s{c.step} {c.stage}: {c.describe()}"

        lines.append(f"{mark}{i:>3}  {cell(a):<44} {cell(b)}")
    return "\n".join(lines)


def _consistent(ev: Evidence, records: dict[int, RankRecord]) -> None:
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
        ev.figures.append(Figure("trace.consistent", at.step, rank, "*", False, 0.0, 0.0, 0.0, 0.0,
                                 detail))


def backward_allreduce_sizes(trace: Iterable[Collective]) -> dict[tuple[int, int], list[int]]:
    sizes: dict[tuple[int, int], list[int]] = defaultdict(list)
    for c in trace:
        if c.stage == "backward" and c.kind in REDUCING and c.dtype in FLOATING:
            sizes[(c.step, c.microbatch)].append(c.numel)
    return dict(sizes)


def _buckets(ev: Evidence, records: dict[int, RankRecord], reference: dict[int, RankRecord],
             enforce: bool) -> None:
    ev.ran("trace.buckets")
    for rank, rec in sorted(records.items()):
        ref = reference.get(rank)
        if ref is None:
            continue
        mine, theirs = backward_allreduce_sizes(rec.trace), backward_allreduce_sizes(ref.trace)
        for key in sorted(set(mine) | set(theirs)):
            a, b = mine.get(key, []), theirs.get(key, [])
            ok = a == b
            detail = f"candidate {a}\nreference {b}"
            ev.figures.append(Figure("trace.buckets", key[0], rank, "*", ok, 0.0, 0.0, 0.0, 0.0,
                                     detail))
            if ok:
                continue
            message = (f"step {key[0]}, microbatch {key[1]}, rank {rank}: gradient allreduce "
                       f"sizes {a} differ from the reference DDP's bucket layout {b}")
            if enforce:
                ev.fail("trace.buckets", message, key[0], rank, detail=detail)
            else:
                ev.note(f"trace.buckets (not enforced): {message}")
            return
