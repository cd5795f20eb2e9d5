"""The single-process result: what DDP's synced gradients must be, computed in one process.

DDP's contract (torch's ``DistributedDataParallel`` docstring): after a synced backward,
every rank holds the average over ranks of the local gradients, i.e. the gradient of the
mean of the per-rank losses. :func:`single_process` runs the same model, from the group's
first rank's initial weights (DDP broadcasts them), on every rank's batch in turn, in one
process, and combines the local gradients the way DDP defines them: each rank's (locally
accumulated) gradient divided by the group size, summed in rank order. Each rank's batch
is a separate forward, not one concatenated batch, because DDP without SyncBatchNorm
normalises per rank; for per-sample models this is the same as the concatenated batch.

- microbatching (``no_sync`` or several synced backwards): local gradients accumulate over
  the step's microbatches, then are reduced, as DDP's reducer does;
- Join (uneven inputs): only the ranks still holding data contribute; the divisor is the
  group size or, with ``divide_by_initial_world_size=False``, the number of active ranks
  (torch's ``_DDPJoinHook``);
- parameters unused on every rank keep their previous gradient (``None`` stays ``None``),
  as with ``find_unused_parameters=True``;
- buffers are simulated per rank: with ``broadcast_buffers``, a forward that follows a
  synced forward starts from the source's buffers (rank 0's, the highest active rank's
  under Join), as DDP's pre-forward broadcast makes it (``Procedure.broadcasts``);
- several backwards of one loss (``retain_graph``): the passes' local gradients add up
  before the reduction;
- the procedure's forwards as its tables list them (``Procedure.plan``): several forwards
  summed into one backward, an eval forward under ``no_grad`` between steps, autocast, and
  the forward RNG seeded per (rank, step, microbatch, forward) as the ranks seed it.

The harness's oracle (``judge/oracle.py``) and a reproducer's check run this same code.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

Tensors = dict[str, Tensor]
#: ``(rank, step, microbatch, forward)``: one forward of one rank (microbatch -1: eval).
At = tuple[int, int, int, int]


@dataclass
class OracleStep:
    """One step of the single-process result."""

    active: list[int]
    grads: dict[str, Tensor | None]
    params: Tensors
    buffers: dict[int, Tensors]
    buffers_at_forward: dict[int, list[Tensors]]
    #: Per parameter, max over elements of sum_r |local_r| / divisor: the magnitude the
    #: reduction's rounding error is proportional to (larger than |grad| where ranks cancel).
    grad_scales: dict[str, float] = field(default_factory=dict)
    #: Per microbatch, the parameters whose gradient a local backward produced on some
    #: active rank: what a synced backward must reduce at least (``trace.reduced_once``).
    #: Empty: not recorded (every parameter that requires a gradient then counts).
    local_grads: list[frozenset[str]] = field(default_factory=list)
    #: Parameters whose expected gradient is None but which a DDP may give a zero gradient:
    #: under Join with ``find_unused_parameters``, once a rank has joined, no active rank
    #: used them, and torch's joined rank allreduces its *stale* used map (the last map it
    #: reduced, or uninitialised memory: ``_match_unused_params_allreduce``), so torch may
    #: count them used and write the reduced zeros. The value is zero either way; which of
    #: the two torch does is the reference's to pin (``reference.grad_none``).
    zero_or_none: frozenset[str] = frozenset()
    #: Per active rank, its local gradients of the step (summed over its microbatches),
    #: before any reduction: what a diagnosis compares a wrong gradient with ("equals
    #: rank 1's local gradient"). Empty: not kept.
    local: dict[int, Tensors] = field(default_factory=dict)


@dataclass
class OracleRecord:
    """The single-process result of one DDP group."""

    initial_params: Tensors
    initial_buffers: dict[int, Tensors]
    steps: list[OracleStep] = field(default_factory=list)
    final_params: Tensors = field(default_factory=dict)
    final_buffers: Tensors = field(default_factory=dict)
    last_joiner: int = 0
    #: The dtypes ("float32", ...) of the parameters that require gradients: what DDP
    #: reduces in, absent a comm hook.
    grad_dtypes: frozenset[str] = frozenset()
    #: Elements per dtype: DDP buckets per dtype and reduces each in its own.
    numel_by_dtype: dict[str, int] = field(default_factory=dict)


@dataclass
class Procedure:
    """What :func:`single_process` reads: the procedure's tables and the model's functions.

    Built from a scenario's tables by :func:`ddp_conformance.script.case.procedure`."""

    #: The model as rank ``r`` builds it before wrapping (seeded).
    build: Callable[[int], nn.Module]
    #: ``(inputs, target)`` of one forward (:data:`At`).
    batch: Callable[[int, int, int, int], tuple[tuple[Any, ...], Tensor]]
    #: Seeds torch's RNG before one forward (:data:`At`): dropout's masks.
    seed_forward: Callable[[int, int, int, int], None]
    #: Around every training forward (autocast, or nothing).
    forward_context: Callable[[], AbstractContextManager[Any]]
    loss: Callable[[Any, Tensor], Tensor]
    before_step: Callable[[nn.Module, int], None] | None
    #: Right after the optimizer step, before the step is recorded.
    after_step: Callable[[nn.Module, int], None] | None
    #: The single process's optimizer over the parameters.
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
    #: Steps per global rank of the group (Join: fewer for the later ranks).
    steps_for: Mapping[int, int]
    #: Per step, its forwards in order as (microbatch, forward); microbatch -1: eval.
    plan: Mapping[int, list[tuple[int, int]]]
    #: Per step and forward of the plan, whether DDP broadcasts buffers at its start.
    broadcasts: Mapping[int, list[bool]]
    broadcast_buffers: bool
    #: Whether DDP's init sync leaves every rank with the first rank's buffers.
    init_syncs_buffers: bool
    #: Join's ``divide_by_initial_world_size``, or None: no Join.
    join_divides_by_group: bool | None
    set_to_none: bool
    find_unused_parameters: bool
    #: Backwards of one loss (all but the last retain the graph).
    backwards: int = 1
    #: An optimizer applied in backward consumes the gradients (judged on parameters).
    optimizer_in_backward: bool = False

    @property
    def evals(self) -> bool:
        """Whether a step of the plan starts with the eval forward (microbatch -1)."""
        return has_eval(self.plan)


def has_eval(plan: Mapping[int, list[tuple[int, int]]]) -> bool:
    """Whether a step of ``plan`` starts with the eval forward (microbatch -1)."""
    return any(forwards and forwards[0][0] < 0 for forwards in plan.values())


def clone(tensors: Mapping[str, Tensor]) -> Tensors:
    return {n: t.detach().clone() for n, t in tensors.items()}


def single_process(proc: Procedure, ranks: list[int]) -> OracleRecord:
    """The single-process result of the DDP group of global ``ranks``."""
    model = proc.build(ranks[0])
    # A fact of the model a reproducer's script is cut on (its value: repro.model_facts).
    model_has_sparse = any(isinstance(m, nn.Embedding) and m.sparse for m in model.modules())
    rank_buffers = {r: clone(dict(model.named_buffers())) if proc.init_syncs_buffers
                    else clone(dict(proc.build(r).named_buffers())) for r in ranks}
    params = dict(model.named_parameters())
    record = OracleRecord(initial_params=clone(params),
                          initial_buffers={r: clone(b) for r, b in rank_buffers.items()},
                          grad_dtypes=frozenset(_numel_by_dtype(params)),
                          numel_by_dtype=_numel_by_dtype(params))
    optimizer = proc.optimizer(model.parameters())
    steps = {r: proc.steps_for[r] for r in ranks}
    for step in range(max(steps.values())):
        if proc.before_step is not None:
            proc.before_step(model, step)
        active = [r for r in ranks if step < steps[r]]
        local, at_forward, defined = _forwards(proc, model, step, active, rank_buffers)
        previous = _after_zero_grad(proc, params, record.steps[-1].grads if record.steps else {})
        divisor = len(ranks) if proc.join_divides_by_group in (None, True) else len(active)
        grads, scales = reduce_gradients(params, [local[r] for r in active], divisor, previous)
        zero_or_none = (stale_used_map(params, grads, [local[r] for r in active])
                        if proc.find_unused_parameters and len(active) < len(ranks) else set())
        for name, p in params.items():
            expected = grads[name]
            if model_has_sparse and expected is not None and sparse_parameter(model, name):
                expected = expected.to_sparse()
            p.grad = None if expected is None else expected.clone()
        optimizer.step()
        if proc.after_step is not None:
            proc.after_step(model, step)
        if proc.optimizer_in_backward:
            # An optimizer applied in backward consumes the gradient: DDP steps each
            # parameter after its reduction and sets its .grad to None at the end of
            # backward (torch's _apply_optim_in_backward_hook); judged on the parameters.
            grads = {n: None if params[n].requires_grad else g for n, g in grads.items()}
        record.steps.append(OracleStep(
            active=active, grads=grads, params=clone(params),
            buffers={r: clone(rank_buffers[r]) for r in active}, buffers_at_forward=at_forward,
            grad_scales=scales, local_grads=defined, zero_or_none=frozenset(zero_or_none),
            local=local))
    # Join's post hook syncs the final model from the highest-ranked last joiner.
    record.last_joiner = max(r for r in ranks if steps[r] == max(steps.values()))
    record.final_params = clone(params)
    record.final_buffers = clone(rank_buffers[record.last_joiner])
    return record


def _numel_by_dtype(params: Mapping[str, Tensor]) -> dict[str, int]:
    """Elements per dtype ("float32", ...) of the parameters that require gradients."""
    out: dict[str, int] = {}
    for p in params.values():
        if p.requires_grad:
            dtype = str(p.dtype).removeprefix("torch.")
            out[dtype] = out.get(dtype, 0) + p.numel()
    return out


def _after_zero_grad(proc: Procedure, params: Mapping[str, Tensor],
                     last: Mapping[str, Tensor | None]) -> dict[str, Tensor | None]:
    """The gradients ``zero_grad`` at the start of a step leaves (``last``: the previous
    step's synced gradients)."""
    out: dict[str, Tensor | None] = {}
    for n in params:
        g = last.get(n)
        out[n] = None if proc.set_to_none or g is None else torch.zeros_like(g)
    return out


def _forwards(proc: Procedure, model: nn.Module, step: int, active: list[int],
              rank_buffers: dict[int, Tensors],
              ) -> tuple[dict[int, Tensors], dict[int, list[Tensors]], list[frozenset[str]]]:
    """The step's forwards and backwards of every active rank, in the plan's microbatch
    order (the eval forward first): per rank its local gradients summed over the
    microbatches, its buffers at each forward, and per microbatch the parameters some
    rank made a gradient for. ``rank_buffers`` is updated to each rank's after the step.

    Under Join torch broadcasts from the highest active rank (rank 0 may have joined with
    stale buffers: ``_find_common_rank``), else from the first. The source runs first, so
    every other rank can start a broadcast forward from its buffers at that forward."""
    source = max(active) if proc.join_divides_by_group is not None else active[0]
    order = [source] + [r for r in active if r != source]
    plan = proc.plan[step]
    local: dict[int, Tensors] = {r: {} for r in active}
    at_forward: dict[int, list[Tensors]] = {r: [] for r in active}
    defined: list[frozenset[str]] = []
    source_at: dict[int, Tensors] = {}  # the source's buffers at each forward
    # A fact of the model a reproducer's script is cut on (its value: repro.model_facts).
    model_has_buffers = any(True for _ in model.named_buffers())
    for mb in sorted({m for m, _ in plan}):  # the eval forward (-1) first
        positions = [i for i, (m, _) in enumerate(plan) if m == mb]
        produced: set[str] = set()
        for r in order:
            loss: Any = 0
            for i in positions:
                if model_has_buffers:
                    _sync_buffers(proc, model, step, i, r, source, positions[0], rank_buffers,
                                  source_at)
                at_forward[r].append(clone(rank_buffers[r]))
                loss = loss + _one_forward(proc, model, (r, step, mb, plan[i][1]))
                if model_has_buffers:
                    rank_buffers[r] = clone(dict(model.named_buffers()))
            if mb >= 0:
                _backward(proc, model, loss, local[r], produced)
        if mb >= 0:
            defined.append(frozenset(produced))
    return local, at_forward, defined


def _sync_buffers(proc: Procedure, model: nn.Module, step: int, i: int, rank: int, source: int,
                  first: int, rank_buffers: dict[int, Tensors], source_at: dict[int, Tensors]
                  ) -> None:
    """Before forward ``i`` of the plan on ``rank``: the source's buffers where DDP
    broadcasts them, loaded into the model at the microbatch's ``first`` forward or a
    broadcast; the source's recorded for the others."""
    sync = proc.broadcast_buffers and proc.broadcasts[step][i] and rank != source
    if sync:
        rank_buffers[rank] = clone(source_at[i])
    if i == first or sync:  # in place, as DDP's broadcast writes
        load_buffers(model, rank_buffers[rank])
    if rank == source:
        source_at[i] = clone(rank_buffers[rank])


def _one_forward(proc: Procedure, model: nn.Module, at: At) -> Any:
    """One forward of the plan, seeded as the rank seeds it; its loss (0 for the eval
    forward, under ``no_grad`` and ``eval()``)."""
    inputs, target = proc.batch(*at)
    proc.seed_forward(*at)
    if proc.evals and at[2] < 0:
        model.eval()
        with torch.no_grad():
            model(*inputs)
        model.train()
        return 0
    with proc.forward_context():
        out = model(*inputs)
    return proc.loss(out, target)


def _backward(proc: Procedure, model: nn.Module, loss: Tensor, local: Tensors,
              produced: set[str]) -> None:
    """One rank's backward(s) of a microbatch's loss; its gradients added to ``local``."""
    model.zero_grad(set_to_none=True)
    if proc.backwards != 1:  # a reproducer's script is cut on it: one backward, no loop
        for _ in range(proc.backwards - 1):
            loss.backward(retain_graph=True)
    loss.backward()
    for name, p in model.named_parameters():
        if p.grad is not None:
            produced.add(name)
            g = p.grad.detach().to_dense() if p.grad.is_sparse else p.grad.detach().clone()
            acc = local.get(name)
            local[name] = g if acc is None else acc + g


def reduce_gradients(params: Mapping[str, Tensor], local: list[Tensors], divisor: int,
                     previous: Mapping[str, Tensor | None],
                     ) -> tuple[dict[str, Tensor | None], dict[str, float]]:
    """One step's synced gradients from the active ranks' local ones (``local``, in rank
    order): each divided by ``divisor`` and summed in rank order, as DDP's default
    reduction adds them, on top of ``previous`` (the gradients left by ``zero_grad``); a
    parameter no active rank made a gradient for keeps its previous one. Also, per
    gradient, the magnitude the reduction's rounding is proportional to (max over elements
    of sum_r |local_r| / divisor)."""
    grads: dict[str, Tensor | None] = {}
    scales: dict[str, float] = {}
    for name, p in params.items():
        contributions = [rank_local.get(name) for rank_local in local]
        if all(c is None for c in contributions):
            grads[name] = previous[name]
            continue
        parts = [(torch.zeros_like(p) if c is None else c) / divisor for c in contributions]
        total = parts[0]
        for part in parts[1:]:  # in rank order, as DDP's default reduction adds them
            total = total + part
        magnitude = torch.stack([part.abs().double() for part in parts]).sum(0)
        scales[name] = float(magnitude.max()) if magnitude.numel() else 0.0
        prev = previous[name]
        grads[name] = total if prev is None else prev + total
    return grads, scales


def stale_used_map(params: Mapping[str, Tensor], grads: Mapping[str, Tensor | None],
                   local: list[Tensors]) -> set[str]:
    """Under Join with ``find_unused_parameters``, once a rank has joined: the parameters
    that may get zeros instead of None (``OracleStep.zero_or_none``), those requiring a
    gradient that no active rank (``local``) made one for and that have none
    (``grads``)."""
    return {name for name, p in params.items() if p.requires_grad and grads[name] is None
            and all(rank_local.get(name) is None for rank_local in local)}


def sparse_parameter(model: nn.Module, name: str) -> bool:
    """Whether ``name`` belongs to a sparse ``nn.Embedding`` (its optimizer step expects a
    sparse gradient; the update is the same)."""
    owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    return isinstance(owner, nn.Embedding) and owner.sparse


def load_buffers(model: nn.Module, buffers: Tensors) -> None:
    """Write ``buffers`` into the model's, as DDP's broadcast does: into their storage,
    without bumping their autograd version (``.data``), so that a graph that saved a
    buffer (BatchNorm's running statistics) survives a broadcast between two forwards of
    one backward, as it does under torch's DDP."""
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.data.copy_(buffers[name])
