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
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ddp_conformance.script.collective import Collective, as_real, gradient_reduction


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


def _real_size(c: Collective) -> float:
    """Bytes per real element of ``c`` (0 when its bytes are unknown)."""
    real = as_real(c.dtype, c.numel)[1]
    return c.nbytes / real if real and c.nbytes else 0.0


def coverage(reductions: Iterable[Collective]) -> Coverage:
    """The coverage of ``reductions``: one backward's gradient reductions on one rank."""
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
    for ranges in spans.values():
        ranges.sort()
        reach, owner = -1, -1  # furthest byte covered so far, and by which reduction
        for start, stop, index, size in ranges:
            fresh_from = max(start, reach)
            distinct += round(max(0, stop - fresh_from) / size)
            if start < reach:
                overlap = round((min(stop, reach) - start) / size)
                first, second = sorted((owner, index))
                twice.append(SummedTwice(first, second, mine[first], mine[second], overlap))
            if stop > reach:
                reach, owner = stop, index
    return Coverage(calls, summed, distinct, tuple(twice))


def backward_coverage(trace: Iterable[Collective]) -> dict[tuple[int, int], Coverage]:
    """Per (step, microbatch): the :func:`coverage` of the backward's gradient reductions."""
    per: dict[tuple[int, int], list[Collective]] = defaultdict(list)
    for c in trace:
        if gradient_reduction(c):
            per[(c.step, c.microbatch)].append(c)
    return {key: coverage(cs) for key, cs in per.items()}
