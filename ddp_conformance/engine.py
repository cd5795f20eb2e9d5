"""Runs one scenario for one candidate on one rank and records what happened.

Per optimizer step the record holds the synced gradients (``None`` kept as ``None``), the
parameters after the step, the buffers after the step, and the buffers as the wrapped
module saw them at the start of each forward (a forward pre-hook on the inner module, so
after any broadcast the candidate did in its own forward). The parent process compares
these records with the oracle and across ranks; a rank never judges itself.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .candidate import Candidate
from .models import get_model
from .procedure import batch, build_module, make_optimizer, synced
from .scenario import Capability, Scenario

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


def missing_capabilities(scenario: Scenario, capabilities: frozenset[str]) -> str:
    """The N/A reason, or '' when the candidate has everything the scenario needs."""
    missing = sorted(scenario.needs - capabilities)
    return f"candidate lacks {', '.join(missing)}" if missing else ""


def _snapshot(tensors: Any) -> Tensors:
    return {n: t.detach().clone() for n, t in tensors}


def run_scenario(scenario: Scenario, candidate: Candidate, rank: int, world_size: int,
                 device: torch.device, process_group: Any) -> RankRecord:
    """Train ``scenario`` with ``candidate`` on this rank; every rank calls this together."""
    static_missing = missing_capabilities(
        scenario, candidate.capabilities | _unknowable(candidate))
    if static_missing:
        return RankRecord(rank, not_applicable=static_missing)
    spec = get_model(scenario.model)
    module = build_module(scenario, rank, device)
    adapter = candidate.wrap(module, process_group, device, **scenario.ddp_options)
    na = missing_capabilities(scenario, adapter.capabilities)
    if na:
        return RankRecord(rank, not_applicable=na)

    record = RankRecord(rank, initial_params=adapter.parameters(), initial_buffers=adapter.buffers())
    adapter.set_optimizer(lambda params: make_optimizer(scenario, params))
    at_forward: list[Tensors] = []
    hook = module.register_forward_pre_hook(
        lambda mod, args: at_forward.append(_snapshot(mod.named_buffers())))
    join = (adapter.join(divide_by_initial_world_size=scenario.join.divide_by_initial_world_size,
                         throw_on_early_termination=scenario.join.throw_on_early_termination)
            if scenario.join else contextlib.nullcontext())
    try:
        with join:
            for step in range(scenario.steps_for(rank)):
                adapter.zero_grad(scenario.zero_grad_set_to_none)
                at_forward = []
                for mb in range(scenario.microbatches):
                    inputs, target = batch(scenario, rank, step, mb, world_size, device)
                    sync = contextlib.nullcontext() if synced(scenario, mb) else adapter.no_sync()
                    with sync:
                        loss = spec.loss(adapter.forward(*inputs), target)
                        adapter.backward(loss)
                grads = adapter.gradients()
                adapter.step()
                record.steps.append(StepRecord(grads, adapter.parameters(), adapter.buffers(),
                                               at_forward))
    finally:
        hook.remove()
    record.final_params = adapter.parameters()
    record.final_buffers = adapter.buffers()
    return record


def _unknowable(candidate: Candidate) -> frozenset[str]:
    """Features a factory function may have once called: assume them until wrapped."""
    if not candidate.late_capabilities:
        return frozenset()
    return frozenset(c.value for c in Capability)
