"""The parts of a scenario's procedure shared by the ranks and the oracle.

Both sides must build the same optimizer and the same batches, and agree on which
microbatches synchronise; keeping these here makes the oracle and the engine two readings
of one procedure rather than two copies of it.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from ddp_conformance.catalog.models import get_model
from ddp_conformance.catalog.scenario import Accumulate, Scenario

OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "zero_sgd")


def make_optimizer(scenario: Scenario, params: Iterable[nn.Parameter],
                   distributed: bool = True) -> torch.optim.Optimizer:
    """The scenario's optimizer: plain SGD, SGD with momentum 0.9, Adam (torch defaults),
    or ``zero_sgd``: SGD sharded by ``ZeroRedundancyOptimizer`` (plain SGD for the oracle,
    ``distributed=False``: ZeRO changes where the update is computed, not its value)."""
    if scenario.optimizer == "zero_sgd" and distributed:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=scenario.lr)
    if scenario.optimizer in ("sgd", "zero_sgd"):
        return torch.optim.SGD(params, lr=scenario.lr)
    if scenario.optimizer == "sgd_momentum":
        return torch.optim.SGD(params, lr=scenario.lr, momentum=0.9)
    if scenario.optimizer == "adam":
        return torch.optim.Adam(params, lr=scenario.lr)
    raise ValueError(f"unknown optimizer {scenario.optimizer!r}; known: {OPTIMIZERS}")


def build_module(scenario: Scenario, rank: int, device: torch.device) -> nn.Module:
    """The model as ``rank`` builds it before wrapping (seeded by ``init_seed(rank)``)."""
    torch.manual_seed(scenario.init_seed(rank))
    spec = get_model(scenario.model)
    kwargs = dict(scenario.model_kwargs, rank=rank) if spec.rank_aware else scenario.model_kwargs
    return spec.build(**kwargs).to(device)


def batch(scenario: Scenario, rank: int, step: int, microbatch: int, world_size: int,
          device: torch.device) -> tuple[tuple[Any, ...], Tensor]:
    """The batch ``rank`` trains on at (step, microbatch): rebuildable in any process."""
    gen = torch.Generator().manual_seed(scenario.data_seed(rank, step, microbatch))
    inputs, target = get_model(scenario.model).batch(gen, scenario.batch_size, rank, world_size,
                                                     step)
    return tuple(x.to(device) if isinstance(x, Tensor) else x for x in inputs), target.to(device)


def synced(scenario: Scenario, microbatch: int) -> bool:
    """Whether gradients are reduced in this microbatch's backward."""
    if scenario.sync_strategy == "multi_auto_sync":
        return True
    if scenario.sync_strategy is not None:  # single_auto_sync, forced_sync: the last only
        return microbatch == scenario.microbatches - 1
    return scenario.accumulate is Accumulate.SYNC_EACH or microbatch == scenario.microbatches - 1


def forward_synced(scenario: Scenario, microbatch: int) -> bool:
    """Whether this microbatch's forward runs outside ``no_sync`` (DDP then broadcasts
    buffers). Differs from :func:`synced` only for ``forced_sync``, which runs every
    microbatch inside ``no_sync`` and reduces by hand after the last backward."""
    if scenario.sync_strategy == "forced_sync":
        return False
    return synced(scenario, microbatch)


def buffers_broadcast(scenario: Scenario, step: int, microbatch: int) -> bool:
    """Whether DDP broadcasts buffers at the start of this forward.

    torch decides it from the *previous* forward: ``_post_forward`` sets
    ``require_forward_param_sync`` to whether that forward ran with grad enabled outside
    ``no_sync`` (initially True), and ``_pre_forward`` broadcasts when it is set. So the
    first forward after a ``no_sync`` one does not broadcast, and the first forward inside
    ``no_sync`` after a synced one does.
    """
    if step == 0 and microbatch == 0:
        return True
    previous = microbatch - 1 if microbatch > 0 else scenario.microbatches - 1
    return forward_synced(scenario, previous)


def _allreduce_to_new_tensor(group, bucket):  # type: ignore[no-untyped-def]
    """An allreduce hook whose result is a new tensor, not the bucket's buffer: DDP must
    copy what the future returns (torch: ``Reducer`` reads the hook's result). Unannotated:
    torch rejects a ``bucket`` annotation that is not ``dist.GradBucket`` itself."""
    import torch.distributed as dist

    averaged = bucket.buffer() / dist.get_world_size(group)  # a new tensor
    work = dist.all_reduce(averaged, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def make_comm_hook(name: str, process_group: Any) -> tuple[Any, Any]:
    """(state, hook) of one of torch's built-in comm hooks, by name."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "allreduce":
        return process_group, default_hooks.allreduce_hook
    if name == "fp16_compress":
        return process_group, default_hooks.fp16_compress_hook
    if name == "allreduce_to_new_tensor":
        return process_group, _allreduce_to_new_tensor
    if name == "powersgd":
        # Rank 16 is at least the smaller side of every matrix in the catalog's MLP, and
        # min_compression_rate=0 compresses them all: P Q^T then spans each gradient
        # exactly, so PowerSGD's result differs from the allreduce only by rounding (see
        # the scenario's tolerance). start_powerSGD_iter=2 runs two vanilla steps first.
        state = powerSGD_hook.PowerSGDState(
            process_group=process_group, matrix_approximation_rank=16,
            start_powerSGD_iter=2, min_compression_rate=0, use_error_feedback=True,
            warm_start=False, random_seed=0)
        return state, powerSGD_hook.powerSGD_hook
    raise ValueError(f"unknown comm hook {name!r}")
