"""``replicate``: torch's composable DDP, ``torch.distributed._composable.replicate``.

``replicate(module, process_group=..., **ddp_kwargs)`` turns the module itself into a
data-parallel module (no wrapper object): it builds a ``DistributedDataParallel`` over the
module's parameters *lazily, at the first forward*, which is also when rank 0's weights
are broadcast. Gradient accumulation goes through ``module.set_requires_gradient_sync``
(the composable API's ``no_sync``); comm hooks through ``module.register_comm_hook``.
There is no Join support (the module is not ``Joinable``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ddp_conformance.builtins._common import (
    OptionPolicy,
    SyncWindows,
    expectations_file,
    honoured,
    static_capabilities,
)
from ddp_conformance.contract.adapter import WrappedModuleAdapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability

NAME = "replicate"
POLICY: OptionPolicy = {o: None for o in (
    "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters", "gradient_as_bucket_view",
    "static_graph", "init_sync")}
FEATURES = (Capability.NO_SYNC, Capability.COMM_HOOK)


class ReplicateAdapter(WrappedModuleAdapter):
    def __init__(self, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        from torch.distributed._composable import replicate

        kwargs: dict[str, Any] = dict(ddp_options, process_group=process_group)
        if device.type == "cuda":
            kwargs["device_id"] = device
        self.module = self.wrapped = replicate(module, **kwargs)
        self.capabilities = honoured(POLICY, ddp_options, *FEATURES)
        self._windows = SyncWindows(self.module.set_requires_gradient_sync)  # type: ignore[arg-type]

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self._windows.window()

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        self.module.register_comm_hook(state, hook)  # type: ignore[operator]


def candidate() -> Candidate:
    return Candidate(
        name=NAME, wrap=ReplicateAdapter, capabilities=static_capabilities(POLICY, *FEATURES),
        version=torch.__version__,
        description="torch.distributed._composable.replicate (composable DDP, lazy init)",
        expectations=expectations_file(NAME))
