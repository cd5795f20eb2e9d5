"""Hand-built records of one small DDP group: everything consistent, ready to break.

A :class:`World` holds what :func:`~ddp_conformance.judge.run.judge_group` takes: the
scenario, every rank's :class:`RankRecord`, the oracle's record, the reference's records
and the profile. :func:`make_world` builds one in which every check passes: the ranks,
the oracle and the reference hold the same tensors, and each synced backward issues one
allreduce per dtype (torch's buckets) covering every parameter. Tests then break one
thing and judge. No process, no process group.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ddp_conformance.catalog.procedure import synced
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.oracle import OracleRecord, OracleStep
from ddp_conformance.judge.run import judge_group
from ddp_conformance.ranks.records import RankRecord, StepRecord
from ddp_conformance.ranks.tracing import Collective

WORLD_SIZE = 2


def dtype_name(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


@dataclass
class World:
    scenario: Scenario
    records: dict[int, RankRecord]
    oracle: OracleRecord
    reference: dict[int, RankRecord] | None
    strict: bool = False
    trace: bool = True
    evidence: Evidence = field(default_factory=Evidence)
    strict_messages: bool = False

    def judge(self) -> Evidence:
        self.evidence = Evidence()
        judge_group(self.evidence, self.scenario, self.records, self.oracle, self.reference,
                    strict=self.strict, trace=self.trace,
                    strict_messages=self.strict_messages)
        return self.evidence

    def failed(self) -> set[str]:
        return {f.check for f in self.judge().failures}

    def messages(self, check: str) -> list[str]:
        return [f.message for f in self.evidence.failures if f.check == check]

    def set_trace(self, trace: list[Collective]) -> None:
        """Every rank issues ``trace`` (so ``trace.consistent`` holds)."""
        for rec in self.records.values():
            rec.trace = list(trace)

    def backward_reductions(self) -> list[Collective]:
        return [c for c in self.records[0].trace if c.stage == "backward"]


def _clone(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {n: t.clone() for n, t in tensors.items()}


def default_params() -> dict[str, Tensor]:
    return {"w": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([0.5])}


def bucket_trace(scenario: Scenario, params: dict[str, Tensor], steps: int,
                 skip: frozenset[str] = frozenset(), wire: str | None = None,
                 world_size: int = WORLD_SIZE) -> list[Collective]:
    """One allreduce per dtype per synced backward (torch's per-dtype buckets) over the
    parameters not in ``skip``, in ``wire`` dtype if given (else each bucket's own)."""
    trace = []
    for step in range(steps):
        for mb in range(scenario.microbatches):
            if not synced(scenario, mb):
                continue
            numel: dict[str, int] = {}
            for name, p in params.items():
                if name not in skip:
                    numel[dtype_name(p)] = numel.get(dtype_name(p), 0) + p.numel()
            for dtype, n in numel.items():
                trace.append(Collective(step, mb, "backward", "allreduce", wire or dtype, n,
                                        world_size))
    return trace


def make_world(scenario: Scenario | None = None, params: dict[str, Tensor] | None = None, *,
               unused: frozenset[str] = frozenset(),
               local_grads: list[frozenset[str]] | None = None, steps: int = 2,
               strict: bool = False, trace: bool = True, reference: bool = True) -> World:
    """A consistent world of ``WORLD_SIZE`` ranks.

    ``unused``: parameters no rank's backward touches (``None`` gradients everywhere);
    ``local_grads``: per microbatch, the parameters with a local gradient on some rank
    (default: all but ``unused``), as the oracle records it.
    """
    scenario = scenario or Scenario("judge/hand-built", "mlp", steps=steps)
    params = params if params is not None else default_params()
    used = frozenset(params) - unused
    per_mb = local_grads if local_grads is not None else [used] * scenario.microbatches
    buffers = {"running": torch.tensor([0.25])}

    step_data = []
    current = {n: p.clone() for n, p in params.items()}
    for step in range(steps):
        grads: dict[str, Tensor | None] = {
            n: None if n in unused else torch.full_like(p, 0.5 * (step + 1))
            for n, p in params.items()}
        current = {n: p - 0.125 * g if g is not None else p.clone()
                   for (n, p), g in zip(current.items(), grads.values(), strict=True)}
        bufs = {"running": torch.tensor([step + 1.25])}
        at_forward = [{"running": torch.tensor([step + 0.25])}
                      for _ in range(scenario.microbatches)]
        step_data.append((grads, dict(current), bufs, at_forward))

    def rank_record(rank: int) -> RankRecord:
        rec = RankRecord(rank, initial_params=dict(params), initial_buffers=dict(buffers),
                         final_params=_clone(current), final_buffers=_clone(step_data[-1][2]),
                         trace=bucket_trace(scenario, params, steps, unused))
        rec.steps = [StepRecord(g, p, b, f) for g, p, b, f in step_data]
        return copy.deepcopy(rec)

    ranks = list(range(WORLD_SIZE))
    oracle = OracleRecord(
        dict(params), {r: dict(buffers) for r in ranks},
        grad_dtypes=frozenset(dtype_name(p) for p in params.values()),
        final_params=_clone(current), final_buffers=_clone(step_data[-1][2]))
    for p in params.values():
        oracle.numel_by_dtype[dtype_name(p)] = oracle.numel_by_dtype.get(dtype_name(p), 0) \
            + p.numel()
    oracle.steps = [OracleStep(ranks, g, p, {r: b for r in ranks}, {r: f for r in ranks},
                               {}, list(per_mb)) for g, p, b, f in step_data]
    oracle = copy.deepcopy(oracle)
    return World(scenario, {r: rank_record(r) for r in ranks}, oracle,
                 {r: rank_record(r) for r in ranks} if reference else None, strict, trace)
