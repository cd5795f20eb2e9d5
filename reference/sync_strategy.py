"""Gradient-accumulation sync strategies (Composer's ``DDPSyncStrategy`` and
``ddp_sync_context``, ``composer/distributed/dist_strategy.py``).

For a batch split into microbatches, each microbatch's forward and backward run inside
``ddp_sync_context(model, is_final_microbatch, strategy)``:

* ``single_auto_sync``: ``no_sync()`` except for the final microbatch, whose backward
  reduces the accumulated gradients;
* ``multi_auto_sync``: every microbatch synchronises as usual;
* ``forced_sync``: every microbatch runs under ``no_sync()``; after the final one,
  each parameter gradient that exists is summed over the group with a plain allreduce
  and replaced by ``grad / world_size``.

Works with any DDP-like module that has ``no_sync()`` (torch's DDP, this package's, or a
candidate); ``forced_sync`` uses the module's ``process_group`` when it has one.
"""
from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class SyncStrategy(str, enum.Enum):
    SINGLE_AUTO_SYNC = "single_auto_sync"
    MULTI_AUTO_SYNC = "multi_auto_sync"
    FORCED_SYNC = "forced_sync"


def _no_sync(model: nn.Module) -> AbstractContextManager[Any]:
    no_sync = getattr(model, "no_sync", None)
    if no_sync is None or not callable(no_sync):
        raise TypeError(
            f"ddp_sync_context needs a DDP-like module with a no_sync() context manager; "
            f"{type(model).__name__} has none"
        )
    return no_sync()  # type: ignore[no-any-return]


def forced_sync_gradients(model: nn.Module) -> None:
    """Average every existing ``.grad`` of ``model`` over its process group."""
    group = getattr(model, "process_group", None)
    world = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad = p.grad / world


@contextmanager
def ddp_sync_context(model: nn.Module, is_final_microbatch: bool,
                     strategy: SyncStrategy | str) -> Iterator[None]:
    """Run one microbatch's forward and backward under ``strategy``."""
    strategy = SyncStrategy(strategy)
    if strategy is SyncStrategy.SINGLE_AUTO_SYNC:
        context = nullcontext() if is_final_microbatch else _no_sync(model)
        with context:
            yield
    elif strategy is SyncStrategy.MULTI_AUTO_SYNC:
        yield
    else:
        context = _no_sync(model)
        try:
            with context:
                yield
        finally:
            if is_final_microbatch:
                with torch.no_grad():
                    forced_sync_gradients(model)
