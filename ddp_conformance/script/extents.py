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

**What the memory held.** Where a reduction sums memory that an earlier reduction of the
same phase summed, the book also records what that memory holds *now*, at the later
reduction's launch (:data:`Again`): a digest per block of it (``ZERO`` for a block of zero
bytes), or ``IN_FLIGHT`` when the earlier reduction had not completed (its work polled
with ``is_completed()``, nothing else asked of it). An all-reduce leaves bitwise the same
contents on every rank of its group, and any deterministic element-wise operation on them
(a division by the world size) keeps them so; a rank's fresh local gradients differ from
its peers'. So the judge, comparing the digests of the same block across ranks, can tell a
reduction of values already reduced (the same on every rank, or still in flight) from a
reduction of memory rewritten since (:mod:`.summed_memory`).
"""
from __future__ import annotations

import hashlib
from typing import Any

import torch

#: ``(storage number, first byte, byte past the last)`` of data one reduction summed.
Extent = tuple[int, int, int]
#: ``(storage number, first byte, byte past the last, block digests)``: memory an earlier
#: reduction of the phase summed, as it is at this reduction's launch.
Again = tuple[int, int, int, tuple[str, ...]]
#: The block digest of zero bytes, of memory an earlier reduction still works on, and of
#: memory an earlier reduction that does not write its result in place (a reduce, whose
#: result only the root holds; a reduce-scatter) summed: contents say nothing there.
ZERO, IN_FLIGHT, NOT_IN_PLACE = "0", "~", "?"
#: The reductions that leave their result, the same on every rank, in the memory summed.
IN_PLACE = frozenset({"allreduce", "allreduce_coalesced"})
#: At most this many blocks per :data:`Again` entry (a block is whole elements).
DIGEST_BLOCKS = 64


def digests(region: torch.Tensor | bytes, element: int) -> tuple[str, ...]:
    """Block digests of ``region`` (a uint8 tensor, or bytes): :data:`ZERO` for zero
    bytes, else 8 hex digits of BLAKE2b; blocks are whole ``element``-byte elements, at
    most :data:`DIGEST_BLOCKS` of them."""
    data = region if isinstance(region, bytes) else region.detach().cpu().numpy().tobytes()
    per = max(1, -(-len(data) // (DIGEST_BLOCKS * element))) * element
    out = []
    for at in range(0, len(data), per):
        block = data[at:at + per]
        out.append(ZERO if not any(block) else
                    hashlib.blake2b(block, digest_size=4).hexdigest())
    return tuple(out)


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
        #: Per storage number: disjoint ``[start, stop, slot]`` segments, each the memory
        #: last reduced by the reduction in ``_works[slot]`` (its work, once bound;
        #: ``_in_place[slot]``: whether it left its result there).
        self._segments: dict[int, list[list[int]]] = {}
        self._storages: dict[int, Any] = {}
        self._works: list[Any] = []
        self._in_place: list[bool] = []
        self._pending: int | None = None

    def _enter(self, phase: tuple[int, int, int, str]) -> None:
        if phase != self._phase:
            self._phase, self._numbers, self._alive = phase, {}, []
            self._segments, self._storages, self._works, self._in_place = {}, {}, [], []

    def _number(self, t: torch.Tensor) -> int:
        self._next += 1
        if not t.is_contiguous():
            return self._next  # no byte range: a number of its own
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self._numbers:
            self._numbers[key] = self._next
            self._alive.append(storage)  # no other storage can take its address this phase
            self._storages[self._next] = storage
        return self._numbers[key]

    def _done(self, slot: int) -> bool:
        work = self._works[slot]
        return work is None or bool(work.is_completed())

    def _again(self, number: int, start: int, stop: int, element: int) -> list[Again]:
        """Memory of ``[start, stop)`` that earlier reductions summed, as it is now; the
        range then belongs to the reduction being recorded (slot ``len(_works)``)."""
        out: list[Again] = []
        kept: list[list[int]] = []
        storage = self._storages.get(number)
        for seg in self._segments.get(number, []):
            a, b = max(seg[0], start), min(seg[1], stop)
            if a >= b:
                kept.append(seg)
                continue
            if storage is None or not self._in_place[seg[2]]:
                blocks: tuple[str, ...] = (NOT_IN_PLACE,)
            elif not self._done(seg[2]):
                blocks = (IN_FLIGHT,)
            else:
                region = torch.empty(0, dtype=torch.uint8, device=storage.device)
                region.set_(storage, a, (b - a,), (1,))
                blocks = digests(region, element)
            out.append((number, a, b, blocks))
            if seg[0] < a:
                kept.append([seg[0], a, seg[2]])
            if b < seg[1]:
                kept.append([b, seg[1], seg[2]])
        kept.append([start, stop, len(self._works)])
        self._segments[number] = sorted(kept)
        return out

    def extents(self, tensors: list[torch.Tensor]) -> tuple[Extent, ...]:
        return self.reduction(tensors)[0]

    def reduction(self, tensors: list[torch.Tensor], in_place: bool = True
                  ) -> tuple[tuple[Extent, ...], tuple[Again, ...], tuple[str, ...]]:
        """The extents of one reduction's ``tensors`` and the memory among them that an
        earlier reduction of the phase summed (:data:`Again`); :meth:`bind` then gives
        the book the reduction's work. ``in_place``: the reduction leaves its result in
        ``tensors`` on every rank (:data:`IN_PLACE`). Third: the block digests of all
        that the reduction sums, at launch (:func:`launch_digests`)."""
        out: list[Extent] = []
        again: list[Again] = []
        for t in tensors:
            size = t.element_size()
            start = int(t.storage_offset()) * size
            number, stop = self._number(t), start + t.numel() * size
            out.append((number, start, stop))
            if t.is_contiguous() and t.numel():
                again += self._again(number, start, stop, size)
        self._pending = len(self._works)
        self._works.append(None)
        self._in_place.append(in_place)
        return tuple(out), tuple(again), launch_digests(tensors) if in_place else ()

    def bind(self, work: Any) -> None:
        """The work of the reduction just recorded (nothing when none was)."""
        if self._pending is not None and self._pending < len(self._works):
            self._works[self._pending] = work
        self._pending = None

    def clear(self) -> None:
        self._phase, self._numbers, self._alive = None, {}, []
        self._segments, self._storages, self._works, self._pending = {}, {}, [], None
        self._in_place = []


#: The process's book (one phase at a time, whatever tracer asks).
BOOK = ExtentBook()

#: Where each reducing operation's summed data is (``_MEASURE`` of the tracing group).
_INPUT_ARG = {"allreduce": 0, "allreduce_coalesced": 0, "reduce": 0}


def reduced_extents(tracer: Any, name: str, args: tuple[Any, ...],
                    reducing: frozenset[str]) -> tuple[Extent, ...]:
    """The extents of the data that operation ``name`` with positional ``args`` sums, when
    ``tracer`` is in a backward and ``name`` is in ``reducing``; else ``()``."""
    return reduced_memory(tracer, name, args, reducing)[0]


def reduced_memory(tracer: Any, name: str, args: tuple[Any, ...], reducing: frozenset[str]
                   ) -> tuple[tuple[Extent, ...], tuple[Again, ...], tuple[str, ...]]:
    """The extents of the data that operation ``name`` with positional ``args`` sums, when
    ``tracer`` is in a backward and ``name`` is in ``reducing``, and what of it an earlier
    reduction of the backward summed (:data:`Again`), and block digests of what it sums
    (:func:`launch_digests`); else ``((), (), ())``. Call
    ``BOOK.bind(work)`` once the operation is launched.

    The summed data is the first argument of an allreduce or reduce (reduced in place),
    the second (the input) of a reduce-scatter.
    """
    BOOK._pending = None
    if tracer.stage != "backward" or name not in reducing or not args:
        return (), (), ()
    index = _INPUT_ARG.get(name, 1)
    if len(args) <= index:
        return (), (), ()
    BOOK._enter((id(tracer), tracer.step, tracer.microbatch, tracer.stage))
    return BOOK.reduction(_tensors(args[index]), name in IN_PLACE)


def launch_digests(tensors: list[torch.Tensor]) -> tuple[str, ...]:
    """Block digests (:func:`digests`) of everything an in-place reduction sums, at its
    launch, when every tensor is a dense CPU tensor (else ``()``: reading device memory
    would synchronise the device, which the trace never does). They let the judge tell a
    reduction of values already reduced (the same bits on every rank) wherever they
    were copied to."""
    if not tensors or any(t.device.type != "cpu" or t.layout != torch.strided
                          or not t.is_contiguous() for t in tensors):
        return ()
    try:
        data = b"".join(t.detach().reshape(-1).view(torch.uint8).numpy().tobytes()
                        for t in tensors)
    except (RuntimeError, TypeError):  # a conjugate or otherwise unreadable view
        return ()
    return digests(data, tensors[0].element_size())
