"""The single-process oracle: what DDP's synced gradients must be, computed in one process.

DDP's contract (torch's ``DistributedDataParallel`` docstring): after a synced backward,
every rank holds the average over ranks of the local gradients, i.e. the gradient of the
mean of the per-rank losses. The oracle runs the same model, from rank 0's initial weights
(DDP broadcasts them), on every rank's batch in turn, in one process, and combines the local
gradients the way DDP defines them: each rank's (locally accumulated) gradient divided by
the world size, summed in rank order. Each rank's batch is a separate forward, not one
concatenated batch, because DDP without SyncBatchNorm normalises per rank; for per-sample
models this is the same as the concatenated global batch.

- microbatching (``no_sync`` or several synced backwards): local gradients accumulate over
  the step's microbatches, then are reduced, as DDP's reducer does;
- Join (uneven inputs): only the ranks still holding data contribute; the divisor is the
  initial world size or, with ``divide_by_initial_world_size=False``, the number of active
  ranks (torch's ``_DDPJoinHook``);
- parameters unused on every rank keep their previous gradient (``None`` stays ``None``),
  as with ``find_unused_parameters=True``;
- buffers are simulated per rank: with ``broadcast_buffers``, a forward that follows a
  synced forward starts from rank 0's buffers (the highest active rank's under Join), as
  DDP's pre-forward broadcast makes it (see ``procedure.broadcasts``);
- several backwards of one loss (``Scenario.backwards``, ``retain_graph``): the passes'
  local gradients add up before the reduction; a forward raised inside ``no_sync``
  (``Scenario.raise_in_no_sync``) contributes nothing;
- the procedure's extra forwards: several forwards summed into one backward, an eval
  forward under ``no_grad`` between steps, autocast, per-rank batch sizes, and the
  forward RNG seeded per (rank, step, microbatch) as the ranks seed it (dropout).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ddp_conformance.catalog.models import get_model
from ddp_conformance.catalog.procedure import (
    backward_passes,
    batch,
    broadcasts,
    build_module,
    forward_context,
    forward_plan,
    make_optimizer,
    seed_forward,
)
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.contract.adapter import dense
from ddp_conformance.ranks.records import Tensors


@dataclass
class OracleStep:
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


@dataclass
class OracleRecord:
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


def _clone(tensors: Mapping[str, Tensor]) -> Tensors:
    return {n: t.detach().clone() for n, t in tensors.items()}


def run_oracle(scenario: Scenario, ranks: int | list[int], device: torch.device,
               threads: int | None = None) -> OracleRecord:
    """The oracle's record for the DDP group of global ``ranks`` (an int: ``range(n)``).

    ``threads`` should be the ranks' intra-op thread count.

    With the same thread count CPU kernels partition their reductions the same way, so the
    oracle's local gradients equal the ranks' bitwise and only DDP's reduction differs.
    """
    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        group = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
        try:
            return _run_oracle(scenario, group, device)
        except Exception:
            if scenario.expect_error is None:
                raise
            # A scenario whose model cannot train at all (the error it expects of DDP is
            # the model's own: no parameter to reduce) has only its initial state to judge.
            return _initial_state(scenario, group, device)
    finally:
        torch.set_num_threads(previous_threads)


def _initial_state(scenario: Scenario, ranks: list[int], device: torch.device) -> OracleRecord:
    """The oracle of an expected error that leaves no training to simulate: rank 0's
    initial parameters (those initialized: a lazy module's have no values yet) and every
    rank's own initial buffers."""
    from torch.nn.parameter import is_lazy

    model = build_module(scenario, ranks[0], device)
    return OracleRecord(_clone({n: p for n, p in model.named_parameters() if not is_lazy(p)}),
                        {r: _clone({n: b for n, b in build_module(scenario, r, device)
                                    .named_buffers() if not is_lazy(b)}) for r in ranks})


def _run_oracle(scenario: Scenario, ranks: list[int], device: torch.device) -> OracleRecord:
    spec = get_model(scenario.model)
    world_size = len(ranks)
    model = build_module(scenario, ranks[0], device)
    broadcast = scenario.broadcasts_buffers()
    # Without broadcast_buffers DDP's init sync leaves each rank's own initial buffers
    # (forward_sync_buffers=False still syncs them at init: Scenario.init_syncs_buffers).
    rank_buffers = {
        r: _clone(dict(model.named_buffers()))
        if scenario.init_syncs_buffers() or scenario.init == "same"
        else _clone(dict(build_module(scenario, r, device).named_buffers()))
        for r in ranks
    }
    params = dict(model.named_parameters())
    record = OracleRecord(_clone(params), {r: _clone(b) for r, b in rank_buffers.items()},
                          grad_dtypes=frozenset(str(p.dtype).removeprefix("torch.")
                                                for p in params.values() if p.requires_grad))
    for p in params.values():
        if p.requires_grad:
            dtype = str(p.dtype).removeprefix("torch.")
            record.numel_by_dtype[dtype] = record.numel_by_dtype.get(dtype, 0) + p.numel()
    optimizer = make_optimizer(scenario, model.parameters(), distributed=False)
    # Join's uneven inputs are by position in the group (group rank), data by global rank.
    steps = {r: scenario.steps_for(i) for i, r in enumerate(ranks)}

    for step in range(max(steps.values())):
        if spec.before_step is not None:
            spec.before_step(model, step)
        active = [r for r in ranks if step < steps[r]]
        divide_by_all = scenario.join is None or scenario.join.divide_by_initial_world_size
        divisor = world_size if divide_by_all else len(active)
        # Under Join torch broadcasts from the highest active rank (rank 0 may have joined
        # with stale buffers: ``_find_common_rank``), else from rank 0. The source runs
        # first, so every other rank can start a broadcast forward from its buffers.
        source = max(active) if scenario.join is not None else active[0]
        order = [source] + [r for r in active if r != source]
        plan, bcast = forward_plan(scenario, step), broadcasts(scenario, step)
        local: dict[int, dict[str, Tensor]] = {r: {} for r in active}
        at_forward: dict[int, list[Tensors]] = {r: [] for r in active}
        defined: list[frozenset[str]] = []
        source_at: dict[int, Tensors] = {}  # the source's buffers at each forward
        for mb in sorted({f.microbatch for f in plan}):  # the eval forward (-1) first
            positions = [i for i, f in enumerate(plan) if f.microbatch == mb]
            produced: set[str] = set()
            for r in order:
                loss: Any = 0
                for i in positions:
                    f = plan[i]
                    sync = broadcast and bcast[i] and r != source
                    if sync:
                        rank_buffers[r] = _clone(source_at[i])
                    if i == positions[0] or sync:  # in place, as DDP's broadcast writes
                        _load_buffers(model, rank_buffers[r])
                    if r == source:
                        source_at[i] = _clone(rank_buffers[r])
                    at_forward[r].append(_clone(rank_buffers[r]))
                    inputs, target = batch(scenario, r, step, mb, world_size, device, f.index)
                    seed_forward(scenario, r, step, mb, f.index)
                    if not f.training:
                        model.eval()
                        with torch.no_grad():
                            model(*inputs)
                        model.train()
                    else:
                        with forward_context(scenario, device):
                            out = model(*inputs)
                        loss = loss + spec.loss(out, target)
                    rank_buffers[r] = _clone(dict(model.named_buffers()))
                if mb < 0:
                    continue
                model.zero_grad(set_to_none=True)
                backward_passes(scenario, loss, lambda t: t.backward(),
                                lambda t: t.backward(retain_graph=True))
                for name, p in params.items():
                    if p.grad is not None:
                        produced.add(name)
                        g = dense(p.grad)
                        acc = local[r].get(name)
                        local[r][name] = g if acc is None else acc + g
            if mb >= 0:
                defined.append(frozenset(produced))

        # zero_grad at the start of the step, as every rank does.
        previous = {n: None if scenario.zero_grad_set_to_none or g is None else torch.zeros_like(g)
                    for n, g in ((n, record.steps[-1].grads[n] if record.steps else None)
                                 for n in params)}
        stale_used_map = len(active) < len(ranks) and \
            bool(scenario.ddp_options.get("find_unused_parameters"))
        grads, scales, zero_or_none = reduce_gradients(params, [local[r] for r in active],
                                                       divisor, previous, stale_used_map)
        for name, p in params.items():
            expected = grads[name]
            if expected is not None and _sparse_parameter(model, name):
                expected = expected.to_sparse()
            p.grad = None if expected is None else expected.clone()
        optimizer.step()
        if scenario.optimizer == "in_backward_sgd":
            # An optimizer applied in backward consumes the gradient: DDP steps each
            # parameter after its reduction and sets its .grad to None at the end of
            # backward (torch's _apply_optim_in_backward_hook); the step is judged on the
            # parameters.
            grads = {n: None if params[n].requires_grad else g for n, g in grads.items()}
        record.steps.append(OracleStep(active, grads, _clone(params),
                                       {r: _clone(rank_buffers[r]) for r in active}, at_forward,
                                       scales, defined, frozenset(zero_or_none)))

    # Join's post hook syncs the final model from the highest-ranked last joiner.
    record.last_joiner = max(r for r in ranks if steps[r] == max(steps.values()))
    record.final_params = _clone(params)
    record.final_buffers = _clone(rank_buffers[record.last_joiner])
    return record


def reduce_gradients(params: Mapping[str, Tensor], local: list[dict[str, Tensor]], divisor: int,
                     previous: dict[str, Tensor | None], stale_used_map: bool,
                     ) -> tuple[dict[str, Tensor | None], dict[str, float], set[str]]:
    """One step's synced gradients from the active ranks' local ones (``local``, in rank
    order): each divided by ``divisor`` and summed in rank order, as DDP's default
    reduction adds them, on top of ``previous`` (the gradients left by ``zero_grad``); a
    parameter no active rank made a gradient for keeps its previous one. Also, per
    gradient, the magnitude the reduction's rounding is proportional to (max over elements
    of sum_r |local_r| / divisor), and, with ``stale_used_map`` (see
    ``OracleStep.zero_or_none``), the parameters that may get zeros instead of None.

    Self-contained (torch only): ``ddp-conformance repro`` copies it into its scripts.
    """
    grads: dict[str, Tensor | None] = {}
    scales: dict[str, float] = {}
    zero_or_none: set[str] = set()
    for name, p in params.items():
        contributions = [rank_local.get(name) for rank_local in local]
        if all(c is None for c in contributions):
            grads[name] = previous[name]
            if stale_used_map and previous[name] is None and p.requires_grad:
                zero_or_none.add(name)
            continue
        parts = [(torch.zeros_like(p) if c is None else c) / divisor for c in contributions]
        total = parts[0]
        for part in parts[1:]:  # in rank order, as DDP's default reduction adds them
            total = total + part
        magnitude = torch.stack([part.abs().double() for part in parts]).sum(0)
        scales[name] = float(magnitude.max()) if magnitude.numel() else 0.0
        prev = previous[name]
        grads[name] = total if prev is None else prev + total
    return grads, scales, zero_or_none


def _sparse_parameter(model: torch.nn.Module, name: str) -> bool:
    """Whether ``name`` belongs to a sparse ``nn.Embedding`` (its optimizer step expects a
    sparse gradient; the update is the same)."""
    owner = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
    return isinstance(owner, torch.nn.Embedding) and owner.sparse


def _load_buffers(model: torch.nn.Module, buffers: Tensors) -> None:
    """Write ``buffers`` into the model's, as DDP's broadcast does: into their storage,
    without bumping their autograd version (``.data``), so that a graph that saved a
    buffer (BatchNorm's running statistics) survives a broadcast between two forwards of
    one backward, as it does under torch's DDP."""
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.data.copy_(buffers[name])
