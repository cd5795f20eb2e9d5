"""Correct but limited candidates: they lack capabilities, so scenarios needing them are N/A."""
from __future__ import annotations

from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel


class ForwardOnly(torch.nn.Module):
    """torch's DDP behind a wrapper that exposes only ``forward`` (no no_sync, no Join)."""

    def __init__(self, module: torch.nn.Module, process_group: Any = None,
                 broadcast_buffers: bool = True, find_unused_parameters: bool = False) -> None:
        super().__init__()
        self._ddp = DistributedDataParallel(module, process_group=process_group,
                                            broadcast_buffers=broadcast_buffers,
                                            find_unused_parameters=find_unused_parameters)

    def forward(self, *inputs: Any) -> Any:
        return self._ddp(*inputs)


def torch_ddp_factory(module: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
    """A factory function (not a class): capabilities are only known once it is called."""
    return DistributedDataParallel(module, **kwargs)


class OneArgumentCommHook(DistributedDataParallel):
    """torch's DDP whose ``register_comm_hook(hook)`` takes the hook alone (the state bound
    into it): not torch's ``(state, hook)``, so comm-hook scenarios are N/A, not errors."""

    def register_comm_hook(self, hook: Any) -> None:  # type: ignore[override]
        super().register_comm_hook(None, hook)
