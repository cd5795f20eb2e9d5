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

from .models import get_model
from .scenario import Accumulate, Scenario

OPTIMIZERS = ("sgd", "sgd_momentum", "adam")


def make_optimizer(scenario: Scenario, params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The scenario's optimizer: plain SGD, SGD with momentum 0.9, or Adam (torch defaults)."""
    if scenario.optimizer == "sgd":
        return torch.optim.SGD(params, lr=scenario.lr)
    if scenario.optimizer == "sgd_momentum":
        return torch.optim.SGD(params, lr=scenario.lr, momentum=0.9)
    if scenario.optimizer == "adam":
        return torch.optim.Adam(params, lr=scenario.lr)
    raise ValueError(f"unknown optimizer {scenario.optimizer!r}; known: {OPTIMIZERS}")


def build_module(scenario: Scenario, rank: int, device: torch.device) -> nn.Module:
    """The model as ``rank`` builds it before wrapping (seeded by ``init_seed(rank)``)."""
    torch.manual_seed(scenario.init_seed(rank))
    return get_model(scenario.model).build(**scenario.model_kwargs).to(device)


def batch(scenario: Scenario, rank: int, step: int, microbatch: int, world_size: int,
          device: torch.device) -> tuple[tuple[Any, ...], Tensor]:
    """The batch ``rank`` trains on at (step, microbatch): rebuildable in any process."""
    gen = torch.Generator().manual_seed(scenario.data_seed(rank, step, microbatch))
    inputs, target = get_model(scenario.model).batch(gen, scenario.batch_size, rank, world_size)
    return tuple(x.to(device) if isinstance(x, Tensor) else x for x in inputs), target.to(device)


def synced(scenario: Scenario, microbatch: int) -> bool:
    """Whether this microbatch's forward/backward synchronises (else it is in ``no_sync``)."""
    return scenario.accumulate is Accumulate.SYNC_EACH or microbatch == scenario.microbatches - 1
