"""What a rank records of one scenario: plain data, sent to the parent and judged there.

A rank never judges itself: the engine (:mod:`ddp_conformance.ranks.engine`) fills these
records, the parent compares them with the oracle, the reference and each other
(:mod:`ddp_conformance.judge`). Records are plain dataclasses of tensors, so checks can be
tested on hand-built records with no process at all.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ddp_conformance.ranks.tracing import Collective

Tensors = dict[str, Tensor]


@dataclass
class StepRecord:
    grads: dict[str, Tensor | None]
    params: Tensors
    buffers: Tensors
    #: Buffers at the start of each forward of the step: one entry per microbatch.
    buffers_at_forward: list[Tensors] = field(default_factory=list)


@dataclass
class RankRecord:
    rank: int
    not_applicable: str = ""
    initial_params: Tensors = field(default_factory=dict)
    initial_buffers: Tensors = field(default_factory=dict)
    steps: list[StepRecord] = field(default_factory=list)
    final_params: Tensors = field(default_factory=dict)
    final_buffers: Tensors = field(default_factory=dict)
    #: "Type: message" of the error this rank raised where the scenario expects one.
    raised: str = ""
    #: Where the scenario expects a refusal: the candidate constructed without refusing,
    #: and reading its state right after raised this ("Type: message", e.g. torch's
    #: ``UninitializedParameter`` of a lazy module it accepted); the rank stopped there.
    accepted: str = ""
    #: The rank is in none of the scenario's process groups: it trained nothing.
    idle: bool = False
    #: The scenario's DDP options nothing in the candidate reads (``Adapter.unread_options``).
    unread_options: tuple[str, ...] = ()
    #: Every collective this rank issued, with the phase it was issued in.
    trace: list[Collective] = field(default_factory=list)
    #: Seconds this rank spent per phase of the scenario: ``wrap`` (wrap, optimizer setup,
    #: comm hook registration), ``steps`` (the training loop, Join's exit) and ``record``
    #: (snapshots for the parent); see :mod:`ddp_conformance.judge.costs`.
    times: dict[str, float] = field(default_factory=dict)


# --- transfer ---------------------------------------------------------------------------------
# A record holds thousands of distinct small tensors (``many_tiny``: 204 parameters x grads,
# params, buffers per step); pickled one by one they cost ~90 us each on each side (0.25 s
# to dump 2,856 of them here, as much to load). A record therefore pickles its tensors
# packed: one flat tensor per dtype holding every tensor's memory, and each tensor's shape,
# strides and offset (layouts such as channels_last kept): 10x cheaper.


class _Slot(NamedTuple):
    position: int


def _strip(value: Any, tensors: list[Tensor]) -> Any:
    """``value`` with every tensor in it (through dicts and lists) replaced by a slot."""
    if isinstance(value, Tensor):
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if isinstance(value, dict):
        return {k: _strip(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip(v, tensors) for v in value]
    return value


def _fill(value: Any, tensors: list[Tensor]) -> Any:
    if isinstance(value, _Slot):
        return tensors[value.position]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, tensors) for v in value]
    return value


def _dense(t: Tensor) -> bool:
    """Whether ``t``'s elements fill ``numel`` consecutive slots of its storage."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True)
                               if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def pack(tensors: list[Tensor]) -> tuple[dict[torch.dtype, Tensor], list[Any]]:
    """Flat tensors per dtype and, per tensor, ``(dtype, shape, stride, offset)`` (or the
    tensor itself where it is not a strided CPU tensor: sparse, on a GPU...)."""
    memories: dict[torch.dtype, list[Tensor]] = {}
    sizes: dict[torch.dtype, int] = {}
    metas: list[Any] = []
    for t in tensors:
        t = t.detach()
        if t.layout is not torch.strided or t.device.type != "cpu":
            metas.append(t)
            continue
        if not _dense(t):
            t = t.contiguous()
        offset = sizes.get(t.dtype, 0)
        memories.setdefault(t.dtype, []).append(
            t.as_strided((t.numel(),), (1,), t.storage_offset()))
        sizes[t.dtype] = offset + t.numel()
        metas.append((t.dtype, tuple(t.shape), tuple(t.stride()), offset))
    return {dtype: torch.cat(parts) for dtype, parts in memories.items()}, metas


def unpack(flats: dict[torch.dtype, Tensor], metas: list[Any]) -> list[Tensor]:
    """The tensors :func:`pack` packed (views of the flat tensors)."""
    return [m if isinstance(m, Tensor) else flats[m[0]].as_strided(m[1], m[2], m[3])
            for m in metas]


def _rank_record(state: dict[str, Any], steps: list[dict[str, Any]],
                 packed: tuple[dict[torch.dtype, Tensor], list[Any]]) -> RankRecord:
    tensors = unpack(*packed)
    record = RankRecord(**_fill(state, tensors))
    record.steps = [StepRecord(**_fill(step, tensors)) for step in steps]
    return record


def _reduce_rank_record(self: RankRecord) -> tuple[Any, ...]:
    tensors: list[Tensor] = []
    state = {f.name: _strip(getattr(self, f.name), tensors)
             for f in dataclasses.fields(self) if f.name != "steps"}
    steps = [{f.name: _strip(getattr(s, f.name), tensors) for f in dataclasses.fields(s)}
             for s in self.steps]
    return (_rank_record, (state, steps, pack(tensors)))


RankRecord.__reduce__ = _reduce_rank_record  # type: ignore[assignment,method-assign]
