"""``fsdp-no-shard``, ``fsdp-full-shard`` (FSDP1) and ``fsdp2`` (``fully_shard``), on any device.

FSDP1: ``FullyShardedDataParallel(module, process_group=..., sharding_strategy=...,
use_orig_params=True, sync_module_states=True)`` — ``sync_module_states`` is FSDP's init
sync (rank 0's weights), ``use_orig_params`` keeps the module's parameter names, and full
gradients and parameters are read inside ``summon_full_params(with_grads=True)`` (a
collective, so every rank reads together). ``no_sync()`` is FSDP's own.

FSDP2: ``fully_shard(module, mesh=DeviceMesh.from_group(process_group, device_type))``
shards every parameter as a ``DTensor``; gradient accumulation without communication is
``set_requires_gradient_sync(False)``; full tensors come from ``DTensor.full_tensor()``.
``fully_shard`` has no init sync: each rank keeps its shard of its *own* initial weights.

Neither has DDP's constructor options: they handle parameters without gradients natively
(``find_unused_parameters`` either way is accepted as "native"), never broadcast buffers
(only ``broadcast_buffers=False`` is honoured), and have no Join. Comm hooks exist with a
different signature (per flat parameter, not ``GradBucket``), so they are not claimed.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import Tensor, nn

from ddp_conformance.builtins._common import OptionPolicy, expectations_file, honoured, static_capabilities
from ddp_conformance.contract.adapter import Adapter, WrappedModuleAdapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability

POLICY: OptionPolicy = {"broadcast_buffers": lambda v: not v, "find_unused_parameters": None}
FEATURES = (Capability.NO_SYNC,)


class FSDP1Adapter(WrappedModuleAdapter):
    def __init__(self, strategy: str, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

        self.module = module
        self.wrapped = FullyShardedDataParallel(
            module, process_group=process_group,
            sharding_strategy=getattr(ShardingStrategy, strategy),
            use_orig_params=True, sync_module_states=device.type != "cpu", device_id=device)
        self.capabilities = honoured(POLICY, ddp_options, *FEATURES)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.wrapped.no_sync()  # type: ignore[operator, no-any-return]

    def _full(self, grads: bool) -> contextlib.AbstractContextManager[None]:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel.summon_full_params(  # type: ignore[return-value]
            self.wrapped, writeback=False, with_grads=grads)

    def gradients(self) -> dict[str, Tensor | None]:
        with self._full(grads=True):
            return super().gradients()

    def parameters(self) -> dict[str, Tensor]:
        with self._full(grads=False):
            return super().parameters()


class FSDP2Adapter(WrappedModuleAdapter):
    def __init__(self, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(process_group, device.type)
        self.module = self.wrapped = cast(nn.Module, fully_shard(module, mesh=mesh))
        self.capabilities = honoured(POLICY, ddp_options, *FEATURES)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        self.wrapped.set_requires_gradient_sync(False)  # type: ignore[operator]
        try:
            yield
        finally:
            self.wrapped.set_requires_gradient_sync(True)  # type: ignore[operator]

    def gradients(self) -> dict[str, Tensor | None]:
        return {n: None if p.grad is None else _full_tensor(p.grad)
                for n, p in self.module.named_parameters()}

    def parameters(self) -> dict[str, Tensor]:
        return {n: _full_tensor(p) for n, p in self.module.named_parameters()}


def _full_tensor(t: Tensor) -> Tensor:
    full = t.full_tensor() if hasattr(t, "full_tensor") else t
    return full.detach().clone()


def _fsdp1(name: str, strategy: str, description: str) -> Candidate:
    def wrap(module: nn.Module, process_group: Any, device: torch.device, **ddp_options: Any) -> Adapter:
        return FSDP1Adapter(strategy, module, process_group, device, **ddp_options)

    return Candidate(name=name, wrap=wrap, capabilities=static_capabilities(POLICY, *FEATURES),
                     version=torch.__version__, description=description,
                     expectations=expectations_file(name))


def fsdp_no_shard() -> Candidate:
    return _fsdp1("fsdp-no-shard", "NO_SHARD",
                  "FSDP1, ShardingStrategy.NO_SHARD (all-reduce, DDP-like)")


def fsdp_full_shard() -> Candidate:
    return _fsdp1("fsdp-full-shard", "FULL_SHARD",
                  "FSDP1, ShardingStrategy.FULL_SHARD (reduce-scatter, gathered for checks)")


def fsdp2() -> Candidate:
    return Candidate(name="fsdp2", wrap=FSDP2Adapter,
                     capabilities=static_capabilities(POLICY, *FEATURES), version=torch.__version__,
                     description="torch.distributed.fsdp.fully_shard (FSDP2, DTensor shards)",
                     expectations=expectations_file("fsdp2"))
