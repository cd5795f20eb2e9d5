"""A scenario at one world size written out as data (:class:`Case`), and what reads it.

``catalog/tables.py`` computes a :class:`Case` from the harness's own functions
(``catalog/procedure.py``: the forward plan, the broadcasts, the seeds); a reproducer
holds it as a literal. From a case and the model's ``ModelSpec`` the same functions build
a rank's model and batches, seed a forward and choose the optimizer, on the ranks of a
reproducer and in the single process (:func:`procedure`): the harness's oracle reads a
scenario through these tables too, so a reproducer's single-process result is the
harness's oracle by construction.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ddp_conformance.script.single_process import At, Procedure, has_eval


@dataclass
class Case:
    """What a scenario's procedure is at one world size: its settings and its tables
    (per global rank, step, microbatch and forward of the plan)."""

    world_size: int
    steps: int
    microbatches: int
    #: Forwards per backward, their losses summed (``plan`` lists them).
    forwards: int
    #: Steps per global rank (Join: rank r of its group runs max(1, steps - r * fewer)).
    steps_for: dict[int, int]
    #: Seed of each global rank's initial weights.
    init_seeds: dict[int, int]
    #: Samples per global rank (uneven batches: DDP averages the per-rank means).
    batch_sizes: dict[int, int]
    #: Per step, its forwards in order as (microbatch, forward); microbatch -1 is the eval
    #: forward under no_grad and eval() (catalog/procedure.py: forward_plan).
    plan: dict[int, list[tuple[int, int]]]
    #: Per step and forward of ``plan``, whether DDP broadcasts buffers at its start
    #: (procedure.broadcasts: after a forward with grad outside no_sync).
    broadcasts: dict[int, list[bool]]
    #: Per (rank, step, microbatch, forward), the seed of the batch's generator.
    data_seeds: dict[At, int]
    #: Per (rank, step, microbatch, forward), torch.manual_seed before it (dropout's masks).
    forward_seeds: dict[At, int]
    #: Per microbatch, whether its backward reduces gradients.
    synced: list[bool]
    #: Per (step, microbatch), whether DDP broadcasts buffers at its first forward.
    buffers_broadcast: dict[tuple[int, int], bool]
    #: Whether DDP broadcasts buffers before forwards, and at its construction.
    broadcast_buffers: bool
    init_syncs_buffers: bool
    optimizer: str
    lr: float
    set_to_none: bool
    #: The dtype of torch.autocast around every training forward (None: none).
    autocast: str | None
    #: The candidate's constructor keywords (besides process_group).
    ddp_options: dict[str, Any]
    model_kwargs: dict[str, Any]
    #: Whether the model's build takes the rank (``ModelSpec.rank_aware``).
    model_rank_aware: bool
    #: DDP process groups (global ranks), every rank creates each in order; None: the world.
    groups: list[list[int]] | None = None
    #: Join's keywords (None: no Join).
    join: dict[str, bool] | None = None
    #: Compare with the single-process result after a rank has joined.
    oracle_after_join: bool = True
    #: Composer's gradient-accumulation sync strategy (None: ``synced`` decides).
    sync_strategy: str | None = None
    comm_hook: str | None = None
    comm_hook_registrations: int = 1
    #: The dtype the comm hook reduces in (None: a dtype holding the gradients'; under
    #: forced_sync the hook never runs).
    hook_wire_dtype: str | None = None
    #: The error every rank must raise, on 'Type: message' (then nothing else is compared).
    expect_error: str | None = None
    #: Check that each synced backward reduces every gradient element once.
    trace_volume: bool = True
    #: Bitwise comparison (exact data); else the norm-wise tolerance per dtype (judge/
    #: tolerance.py), ``rtol_override`` replacing it.
    exact: bool = False
    rtol_override: float | None = None
    rtol: dict[str, float] = field(default_factory=dict)
    #: The dtypes of the parameters that require gradients.
    grad_dtypes: list[str] = field(default_factory=list)
    #: Backwards of one loss (all but the last retain the graph).
    backwards: int = 1
    #: Check DDP's init sync, the buffers against the single-process result, the
    #: collectives against the trace rules, the replicas against each other (a reproducer
    #: whose case's failed checks are known leaves out the kinds none of them is).
    init_checks: bool = True
    buffer_checks: bool = True
    #: Compute the single-process result and compare each step with it (a reproducer of a
    #: crash or a hang, which no check failed, needs none: the run itself reproduces it).
    oracle_checks: bool = True
    trace_checks: bool = True
    replica_checks: bool = True

    @property
    def evals(self) -> bool:
        """Whether a step of the plan starts with the eval forward (microbatch -1)."""
        return has_eval(self.plan)


def build(case: Case, spec: Any, rank: int) -> nn.Module:
    """The model as ``rank`` builds it before wrapping (seeded by its init seed)."""
    torch.manual_seed(case.init_seeds[rank])
    kwargs = dict(case.model_kwargs, rank=rank) if case.model_rank_aware else case.model_kwargs
    return spec.build(**kwargs)


def batch(case: Case, spec: Any, at: At, group_size: int) -> tuple[tuple[Any, ...], Tensor]:
    """The batch of one forward ``at`` (its rank's ``batch_sizes`` samples), rebuildable in
    any process from its seed."""
    rank, step = at[0], at[1]
    gen = torch.Generator().manual_seed(case.data_seeds[at])
    return spec.batch(gen, case.batch_sizes[rank], rank, group_size, step)


def seed_forward(case: Case, at: At) -> None:
    """Seed torch's RNG before forward ``at``, as every rank and the single process do:
    dropout then draws that rank's masks wherever its batch is computed."""
    torch.manual_seed(case.forward_seeds[at])


def forward_context(case: Case, device_type: str = "cpu") -> contextlib.AbstractContextManager[Any]:
    """Around every training forward (not the eval forward, not the backward)."""
    if case.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=getattr(torch, case.autocast))


def make_optimizer(optimizer_name: str, lr: float, params: Iterable[nn.Parameter],
                   distributed: bool = True) -> torch.optim.Optimizer:
    """Optimizer ``optimizer_name`` (a reproducer's script is cut on it): SGD, SGD with
    momentum 0.9, Adam (torch's defaults), or ``zero_sgd``: SGD sharded by
    ``ZeroRedundancyOptimizer`` on the ranks, plain SGD in the single process
    (``distributed=False``: ZeRO changes where the update is computed, not its value); the
    optimizers stepped in backward are SGD's update."""
    if optimizer_name == "zero_sgd" and distributed:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=lr)
    if optimizer_name in ("sgd", "zero_sgd", "fused_sgd", "in_backward_sgd"):
        return torch.optim.SGD(params, lr=lr)
    if optimizer_name == "sgd_momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if optimizer_name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"unknown optimizer {optimizer_name!r}")


def _on(device: torch.device, inputs: tuple[Any, ...], target: Tensor
        ) -> tuple[tuple[Any, ...], Tensor]:
    return tuple(x.to(device) if isinstance(x, Tensor) else x for x in inputs), target.to(device)


def procedure(case: Case, spec: Any, members: list[int],
              device: torch.device | None = None) -> Procedure:
    """What the single process reads of ``case`` for the DDP group of global ``members``
    (the data scaled by the group's size), on ``device`` (the CPU by default)."""
    group_size, device = len(members), device or torch.device("cpu")
    return Procedure(
        build=lambda rank: build(case, spec, rank).to(device),
        batch=lambda *at: _on(device, *batch(case, spec, at, group_size)),
        seed_forward=lambda *at: seed_forward(case, at),
        forward_context=lambda: forward_context(case, device.type),
        loss=spec.loss, before_step=spec.before_step, after_step=spec.after_step,
        optimizer=lambda params: make_optimizer(case.optimizer, case.lr, params, distributed=False),
        steps_for=case.steps_for, plan=case.plan, broadcasts=case.broadcasts,
        broadcast_buffers=case.broadcast_buffers, init_syncs_buffers=case.init_syncs_buffers,
        join_divides_by_group=None if case.join is None
        else case.join["divide_by_initial_world_size"],
        set_to_none=case.set_to_none,
        find_unused_parameters=bool(case.ddp_options.get("find_unused_parameters")),
        backwards=case.backwards, optimizer_in_backward=case.optimizer == "in_backward_sgd")
