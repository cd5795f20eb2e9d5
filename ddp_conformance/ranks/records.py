"""What a rank records of one scenario: plain data, sent to the parent and judged there.

A rank never judges itself: the engine (:mod:`ddp_conformance.ranks.engine`) fills these
records, the parent compares them with the oracle, the reference and each other
(:mod:`ddp_conformance.judge`). Records are plain dataclasses of tensors, so checks can be
tested on hand-built records with no process at all.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
    #: The rank is in none of the scenario's process groups: it trained nothing.
    idle: bool = False
    #: Every collective this rank issued, with the phase it was issued in.
    trace: list[Collective] = field(default_factory=list)
    #: Seconds this rank spent per phase of the scenario: ``wrap`` (wrap, optimizer setup,
    #: comm hook registration), ``steps`` (the training loop, Join's exit) and ``record``
    #: (snapshots for the parent); see :mod:`ddp_conformance.judge.costs`.
    times: dict[str, float] = field(default_factory=dict)
