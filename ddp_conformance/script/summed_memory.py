"""What one synced backward's gradient reductions covered, element by element of memory.

:func:`coverage` reads the storage extents the tracing group records for each backward
reduction (:mod:`.extents`) and says, for the reductions of one
backward on one rank, how many real elements they summed (``summed``, with multiplicity,
what the element counts alone say), how many distinct elements of memory
(``distinct``), and which memory was summed by more than one of them (``twice``).

What this establishes, and what not:

- A buffer reduced *whole* once (a flat buffer over every parameter, frozen ones
  included, as fairseq's legacy DDP reduces it, or one padded to a multiple of anything)
  is summed once per element: its padding or stale tail is counted as memory, once, and
  is no gradient reduced twice whatever the world size.
- Memory summed twice in one backward is either the same gradient data reduced twice
  (a bucket or a gradient all-reduced again) or a staging buffer reused for the next
  batch of gradients (fairseq with a buffer smaller than the model). The two are told
  apart by what the backward needed: a staging buffer is reused only when the distinct
  memory reduced is smaller than the gradients that had to be reduced; when it already
  covers them, summing memory again carries no gradient that was not reduced already.
- A collective recorded without extents (a trace from before extents, a hand-built one)
  counts as memory of its own: only its element count speaks.

**By what the memory held** (``fresh``, given where every rank's trace is at hand): the
tracing group records, for memory an earlier reduction of the backward summed, block
digests of what it holds at the later reduction's launch (:data:`.extents.Again`). An
all-reduce leaves the same bits on every rank of its group, and a deterministic
element-wise step after it (dividing by the world size) keeps them the same; a rank's
local gradients copied in since differ from its peers'. So a block whose digest differs
between ranks was *rewritten* since its last reduction (a block of zeros says nothing: a
reduction leaves zeros where the gradients were zero), and a reduction that carries
rewritten or never-reduced memory, or nothing but zeros again, is a staging buffer
refilled, not a second reduction: its other re-reduced memory is a stale tail
(``restaged``), not counted twice. A reduction over nothing but memory that holds,
bitwise on every rank, what the earlier reduction left (or that is still in flight, or
was summed by a reduction whose result is not left in place) is a second reduction.
Memory refilled with gradients bitwise equal on every rank and not zero would read as
already reduced; at world size 1 contents say nothing, and the rule below applies.

Without ``fresh`` (a reproducer's one rank, world size 1), by where it was: a staging
buffer is told from a second reduction by what the backward needed (above).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ddp_conformance.script.collective import Collective, as_real, gradient_reduction
from ddp_conformance.script.extents import IN_FLIGHT, NOT_IN_PLACE, ZERO


@dataclass(frozen=True)
class SummedTwice:
    """Memory summed by two reductions of one backward: their positions in the backward's
    reductions (0-based, in trace order), the collectives, and how many real elements."""

    first: int
    second: int
    first_collective: Collective
    second_collective: Collective
    elements: int

    def describe(self) -> str:
        a, b = self.first_collective, self.second_collective
        same = "the same " if self.first == self.second else ""
        return (f"{self.elements} element(s) of one buffer were summed by {same}reduction "
                f"#{self.first} ({a.describe()}) and again by #{self.second} ({b.describe()})")


@dataclass(frozen=True)
class Coverage:
    """The reductions of one backward on one rank (real elements: complex count as two)."""

    calls: int
    summed: int
    distinct: int
    twice: tuple[SummedTwice, ...]
    #: Whether contents show every entry of ``twice`` to be values already reduced (not
    #: so where a reduce or reduce-scatter summed it first).
    proven: bool = False
    #: Distinct elements of the storages refilled and reduced again (staging buffers):
    #: their size says nothing of how many gradients they carried (a tail never written,
    #: or stale), so the bound on distinct memory leaves them out.
    staging: int = 0
    #: Reductions that summed nothing but values the same on every rank (some not zero):
    #: values already reduced, copied elsewhere (None: contents not judged). The bound
    #: on distinct memory is broken only with such evidence where contents are judged:
    #: a buffer reduced whole once may have a tail that never held a gradient.
    settled: int | None = None
    #: The entries of memory summed again tolerated as a refilled staging buffer's stale
    #: part (judged by contents), and the most distinct elements one such buffer summed
    #: in the backward.
    refilled: tuple[SummedTwice, ...] = ()
    room: int = 0

    @property
    def restaged(self) -> int:
        """Elements of re-reduced memory tolerated as refilled staging buffers' stale parts."""
        return sum(t.elements for t in self.refilled)

    def redone(self, whole: int) -> tuple[SummedTwice, ...]:
        """The refilled memory that is a second reduction all the same: a buffer refilled
        and summed again although it had room for all ``whole`` elements of the model's
        gradients. A staging buffer is reused within a backward only because the gradients
        do not fit in it; one that holds them all and is summed again carries gradients
        already reduced (a reduction per nested backward of a reentrant checkpoint, each
        over the whole buffer refilled from the gradients it reduced before), even where
        the refill rewrote it, bitwise, with what the earlier reduction left."""
        return self.refilled if self.room >= whole else ()


#: ``fresh(position, entry, block)``: whether block ``block`` of the ``entry``-th
#: :data:`.extents.Again` record of the backward's ``position``-th reduction was rewritten
#: since its last reduction (see the module's docstring); ``entry`` -1: the reduction's
#: own launch digests (``Collective.blocks``), whether that block holds local data.
Fresh = Callable[[int, int, int], bool]


def _settled(c: Collective, position: int, fresh: Fresh) -> bool:
    """Whether reduction ``c`` summed nothing but values the same on every rank, some of
    them not zero: values already reduced, wherever they were copied to (its launch
    digests; False without them)."""
    if not c.blocks or all(b == ZERO for b in c.blocks):
        return False
    return not any(fresh(position, -1, b) for b in range(len(c.blocks)))


def _carries_fresh(c: Collective, position: int, fresh: Fresh) -> bool | None:
    """Whether reduction ``c``, which summed memory an earlier reduction of the backward
    summed, also summed memory none did, or memory rewritten since (None: contents
    cannot say: no record of them, or a reduction whose result is not left in place
    summed some of it first)."""
    if not c.again:
        return None  # no record of what the memory held (a hand-built or older trace)
    mine = sum(stop - start for _, start, stop in c.extents)
    again = sum(stop - start for _, start, stop, _ in c.again)
    if mine > again:
        return True
    if all(b == ZERO for entry in c.again for b in entry[3]):
        return True  # zeros summed again: nothing already reduced is summed twice
    if any(fresh(position, k, b) for k, entry in enumerate(c.again)
           for b in range(len(entry[3]))):
        return True
    return None if any(NOT_IN_PLACE in entry[3] for entry in c.again) else False


def _real_size(c: Collective) -> float:
    """Bytes per real element of ``c`` (0 when its bytes are unknown)."""
    real = as_real(c.dtype, c.numel)[1]
    return c.nbytes / real if real and c.nbytes else 0.0


def coverage(reductions: Iterable[Collective], fresh: Fresh | None = None) -> Coverage:
    """The coverage of ``reductions``: one backward's gradient reductions on one rank;
    with ``fresh``, memory summed again by a reduction that carries rewritten memory is
    ``restaged``, not ``twice``."""
    calls, summed, distinct = 0, 0, 0
    # storage -> [(start, stop, reduction index, bytes per real element)]
    spans: dict[int, list[tuple[int, int, int, float]]] = defaultdict(list)
    mine: list[Collective] = []
    for c in reductions:
        index = calls
        calls += 1
        mine.append(c)
        real = as_real(c.dtype, c.numel)[1]
        summed += real
        size = _real_size(c)
        if not c.extents or not size:
            distinct += real
            continue
        for storage, start, stop in c.extents:
            spans[storage].append((start, stop, index, size))
    twice: list[SummedTwice] = []
    by_storage: dict[int, int] = defaultdict(int)
    for storage, ranges in spans.items():
        ranges.sort()
        reach, owner = -1, -1  # furthest byte covered so far, and by which reduction
        for start, stop, index, size in ranges:
            fresh_from = max(start, reach)
            by_storage[storage] += round(max(0, stop - fresh_from) / size)
            if start < reach:
                overlap = round((min(stop, reach) - start) / size)
                first, second = sorted((owner, index))
                twice.append(SummedTwice(first, second, mine[first], mine[second], overlap))
            if stop > reach:
                reach, owner = stop, index
    distinct += sum(by_storage.values())
    if fresh is None:
        return Coverage(calls, summed, distinct, tuple(twice))
    carries = [_carries_fresh(c, i, fresh) for i, c in enumerate(mine)]
    kept = tuple(t for t in twice if not carries[t.second])
    refilled = tuple(t for t in twice if carries[t.second])
    proven = all(carries[t.second] is False for t in kept)
    buffers = {entry[0] for i, c in enumerate(mine) if carries[i] for entry in c.again}
    settled = (sum(_settled(c, i, fresh) for i, c in enumerate(mine))
               if all(c.blocks for c in mine) else None)
    return Coverage(calls, summed, distinct, kept, proven, sum(by_storage[s] for s in buffers),
                    settled, refilled, max((by_storage[s] for s in buffers), default=0))


def backward_reductions(trace: Iterable[Collective]) -> dict[tuple[int, int], list[Collective]]:
    """Per (step, microbatch): the backward's gradient reductions, in trace order."""
    per: dict[tuple[int, int], list[Collective]] = defaultdict(list)
    for c in trace:
        if gradient_reduction(c):
            per[(c.step, c.microbatch)].append(c)
    return dict(per)


def backward_coverage(trace: Iterable[Collective],
                      peers: Iterable[Iterable[Collective]] = ()
                      ) -> dict[tuple[int, int], Coverage]:
    """Per (step, microbatch): the :func:`coverage` of the backward's gradient reductions;
    with ``peers`` (the other ranks' traces of the group), judged by contents."""
    mine = backward_reductions(trace)
    others = [backward_reductions(t) for t in peers]
    if not others:
        return {key: coverage(cs) for key, cs in mine.items()}
    return {key: coverage(cs, _fresh(cs, [o.get(key, []) for o in others]))
            for key, cs in mine.items()}


def _fresh(mine: list[Collective], others: list[list[Collective]]) -> Fresh:
    """``fresh`` for one rank's backward against its peers' same backward: a block is
    rewritten where it is zero or its digest differs from a peer's (see the module)."""

    def digest(cs: list[Collective], p: int, k: int, b: int) -> str | None:
        if p >= len(cs):
            return None
        blocks = cs[p].blocks if k < 0 else cs[p].again[k][3] if k < len(cs[p].again) else ()
        return blocks[b] if b < len(blocks) else None

    def fresh(p: int, k: int, b: int) -> bool:
        own = digest(mine, p, k, b)
        if own is None or own in (ZERO, IN_FLIGHT, NOT_IN_PLACE):
            return False  # zeros: a reduction leaves them, and local gradients hold them
        theirs = [digest(o, p, k, b) for o in others]
        return any(d is not None and d not in (IN_FLIGHT, NOT_IN_PLACE) and d != own
                   for d in theirs)

    return fresh
