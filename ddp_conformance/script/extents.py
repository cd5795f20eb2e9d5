"""Which memory a gradient reduction covered: storage extents, for ``trace.reduced_once``.

A DDP copies gradients into flat buffers and back, so the element counts of its
collectives alone cannot say whether one gradient was reduced twice or a buffer was
reduced whole with a padded or stale tail. What the tracing group *can* establish is
which bytes of which storage each reduction summed. :func:`reduced_extents` answers that
for one collective as a tuple of :data:`Extent` ``(storage, start, stop)``: ``storage``
a small integer naming one storage for the duration of one phase of the tracer (one
step's backward), ``start``/``stop`` a byte range inside it.

Soundness: within one phase the storages seen are kept alive here, so a buffer freed
and another allocated at the same address (a DDP that flattens each bucket into a
temporary) never share a number; two extents with the same number and overlapping bytes
really are the same memory. A tensor whose elements are not one dense byte range (not
contiguous) gets a storage number of its own, so it never overlaps anything: no
conclusion is drawn from memory it may share. Outside ``backward`` and for collectives
that do not reduce, nothing is recorded (empty tuple).
"""
from __future__ import annotations

from typing import Any

import torch

#: ``(storage number, first byte, byte past the last)`` of data one reduction summed.
Extent = tuple[int, int, int]


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


class ExtentBook:
    """Storage numbers for one phase at a time; the storages of the phase are kept alive."""

    def __init__(self) -> None:
        self._phase: tuple[int, int, int, str] | None = None
        self._numbers: dict[int, int] = {}
        self._alive: list[Any] = []
        self._next = 0

    def _enter(self, phase: tuple[int, int, int, str]) -> None:
        if phase != self._phase:
            self._phase, self._numbers, self._alive = phase, {}, []

    def _number(self, t: torch.Tensor) -> int:
        self._next += 1
        if not t.is_contiguous():
            return self._next  # no byte range: a number of its own
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self._numbers:
            self._numbers[key] = self._next
            self._alive.append(storage)  # no other storage can take its address this phase
        return self._numbers[key]

    def extents(self, tensors: list[torch.Tensor]) -> tuple[Extent, ...]:
        out: list[Extent] = []
        for t in tensors:
            size = t.element_size()
            start = int(t.storage_offset()) * size
            out.append((self._number(t), start, start + t.numel() * size))
        return tuple(out)

    def clear(self) -> None:
        self._phase, self._numbers, self._alive = None, {}, []


#: The process's book (one phase at a time, whatever tracer asks).
BOOK = ExtentBook()

#: Where each reducing operation's summed data is (``_MEASURE`` of the tracing group).
_INPUT_ARG = {"allreduce": 0, "allreduce_coalesced": 0, "reduce": 0}


def reduced_extents(tracer: Any, name: str, args: tuple[Any, ...],
                    reducing: frozenset[str]) -> tuple[Extent, ...]:
    """The extents of the data that operation ``name`` with positional ``args`` sums, when
    ``tracer`` is in a backward and ``name`` is in ``reducing``; else ``()``.

    The summed data is the first argument of an allreduce or reduce (reduced in place),
    the second (the input) of a reduce-scatter.
    """
    if tracer.stage != "backward" or name not in reducing or not args:
        return ()
    index = _INPUT_ARG.get(name, 1)
    if len(args) <= index:
        return ()
    BOOK._enter((id(tracer), tracer.step, tracer.microbatch, tracer.stage))
    return BOOK.extents(_tensors(args[index]))
