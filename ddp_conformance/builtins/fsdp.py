"""``fsdp-no-shard``, ``fsdp-full-shard`` (FSDP1) and ``fsdp2`` (``fully_shard``), on any device.

FSDP1: ``FullyShardedDataParallel(module, process_group=..., sharding_strategy=...,
use_orig_params=True, sync_module_states=True)`` — ``sync_module_states`` is FSDP's init
sync (rank 0's weights), ``use_orig_params`` keeps the module's parameter names, and full
parameters (and FULL_SHARD's full gradients) are read inside
``summon_full_params(with_grads=True)`` (a collective, so every rank reads together).
FULL_SHARD's gradients are None where the optimizer's are: outside, each ``.grad`` is the
rank's 1-d piece of the sharded flat gradient, None for a parameter with
``requires_grad=False``, which ``summon_full_params`` would show as zeros; a gradient is
reported None when no rank's ``.grad`` holds a piece of it.
NO_SHARD's gradients are the original parameters' ``.grad`` as the optimizer gets them
after backward: inside ``summon_full_params`` FSDP re-views the flat gradient for every
parameter, which shows zeros for a parameter with ``requires_grad=False`` whose ``.grad``
is None outside, and the right layout for a channels_last parameter whose ``.grad``
outside is the flat gradient read row-major (``tests/standalone/fsdp1_channels_last_grad.py``).
``no_sync()`` is FSDP's own.

FSDP2: ``fully_shard(module, mesh=DeviceMesh.from_group(process_group, device_type))``
shards every parameter as a ``DTensor``; gradient accumulation without communication is
``set_requires_gradient_sync(False)``; full tensors come from ``DTensor.full_tensor()``.
``fully_shard`` has no init sync: each rank keeps its shard of its *own* initial weights.
``find_unused_parameters=True`` is ``set_reduce_scatter_unused_params(True)`` (torch's
docstring: "Similar to DDP's find_unused_parameters"): each rank reduce-scatters only the
parameters that have a gradient on it unless that is set, so ranks that used different
parameters issue mismatched reduce-scatters (Gloo aborts where the sizes differ, and where
they agree the ranks sum different parameters' gradients together); set, every rank
reduce-scatters every parameter that requires a gradient, a zero one where it has none,
and a parameter no rank used gets a zero gradient where DDP leaves None
(``tests/standalone/fsdp2_unused_params.py``).

Gloo with CUDA tensors (``--device cuda``): FSDP2's own collectives take Gloo paths that
stage CUDA tensors through pinned host memory (all-gather, reduce-scatter as all-reduce),
but ``DTensor.full_tensor()`` does not: its functional all-gather is
``allgather_into_tensor_coalesced`` (``all_gather_single_coalesced`` in torch 2.13's names),
which ProcessGroupGloo implements for CPU tensors only and runs on CUDA pointers as if they
were host memory: SIGSEGV on the Gloo worker thread, at the first read of the parameters
after wrapping (pytorch/pytorch#152645, open; #132471 is the same crash reached through
``fully_shard``; ``tests/standalone/fsdp2_gloo_cuda.py`` reproduces it without the harness).
So on Gloo with CUDA the adapter reads full tensors through the CPU: each rank's local
shard is copied to the host, gathered as a DTensor on a CPU mesh over the same group (the
path every CPU run takes), and copied back to the rank's device. CPU runs are unchanged.

Neither has DDP's constructor options: FSDP1 handles parameters without gradients natively
(``find_unused_parameters`` either way is accepted as "native"; for FSDP2 see above), never
broadcast buffers
(only ``broadcast_buffers=False`` is honoured), and have no Join. Comm hooks exist with a
different signature (per flat parameter, not ``GradBucket``), so they are not claimed.
"""
from __future__ import annotations

import contextlib
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddp_conformance.builtins._common import (
    OptionPolicy,
    SyncWindows,
    expectations_file,
    honoured,
    static_capabilities,
)
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
        self.strategy = strategy
        self.process_group = process_group
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
        if self.strategy == "NO_SHARD":
            # Unsharded: the original parameters' ``.grad`` are already the full gradients,
            # and they are what the optimizer steps with. summon_full_params(with_grads=True)
            # shows other tensors: a zero view for a parameter with requires_grad=False
            # (whose ``.grad`` FSDP sets to None) and a layout-aware view of a channels_last
            # parameter's gradient where the optimizer's ``.grad`` is not (see the module
            # docstring).
            return super().gradients()
        # FULL_SHARD: outside, each ``.grad`` is this rank's 1-d piece of the sharded flat
        # gradient (None where the rank holds no part of the parameter); the optimizer steps
        # those pieces, so their values are the full gradient summon_full_params gathers.
        # But summon_full_params shows a view for every parameter, where the optimizer gets
        # None for a parameter with requires_grad=False (FlatParamHandle._use_sharded_grad_views):
        # a gradient is None when no rank's optimizer has a piece of it (one int all-reduce).
        names = [n for n, _ in self.module.named_parameters()]
        held = torch.tensor([p.grad is not None for _, p in self.module.named_parameters()],
                            dtype=torch.int32, device=self._flag_device())
        dist.all_reduce(held, op=dist.ReduceOp.MAX, group=self.process_group)
        none = {n for n, h in zip(names, held.tolist(), strict=True) if not h}
        with self._full(grads=True):
            full = super().gradients()
        return {n: None if n in none else g for n, g in full.items()}

    def _flag_device(self) -> torch.device:
        """Where the group reduces a small tensor: the parameters' device."""
        return next(self.module.parameters()).device

    def parameters(self) -> dict[str, Tensor]:
        with self._full(grads=False):
            return super().parameters()


class FSDP2Adapter(WrappedModuleAdapter):
    def __init__(self, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        mesh = DeviceMesh.from_group(process_group, device.type)
        self.process_group = process_group
        self.module = self.wrapped = cast(nn.Module, fully_shard(module, mesh=mesh))
        if ddp_options.get("find_unused_parameters"):  # see the module docstring
            self.wrapped.set_reduce_scatter_unused_params(True)  # type: ignore[operator]
        self.capabilities = honoured(POLICY, ddp_options, *FEATURES)
        #: Where full tensors are gathered when the group cannot gather them on ``device``
        #: (Gloo with CUDA tensors, see the module docstring); None: ``full_tensor()`` as is.
        self._host_mesh = (DeviceMesh.from_group(process_group, "cpu")
                           if gloo_serves_cuda(process_group, device) else None)
        self._windows = SyncWindows(self.wrapped.set_requires_gradient_sync)  # type: ignore[arg-type]

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self._windows.window()

    def gradients(self) -> dict[str, Tensor | None]:
        """Each rank's gradients, gathered whole: None where this rank's ``.grad`` is None.
        Every rank gathers every gradient some rank holds (one int all-reduce says which),
        a rank without it with a zero shard: where ranks disagree on which gradients exist
        (their reduce-scatters covered different parameters), gathering only their own
        would pair one parameter's shards with another's, or never return."""
        params = list(self.module.named_parameters())
        flags = torch.device("cpu") if self._host_mesh is not None else params[0][1].device
        held = torch.tensor([p.grad is not None for _, p in params], dtype=torch.int32,
                            device=flags)
        dist.all_reduce(held, op=dist.ReduceOp.MAX, group=self.process_group)
        out: dict[str, Tensor | None] = {}
        for (n, p), anywhere in zip(params, held.tolist(), strict=True):
            grad = p.grad if p.grad is not None or not anywhere else torch.zeros_like(p)
            full = None if grad is None else _full_tensor(grad, self._host_mesh)
            out[n] = None if p.grad is None else full
        return out

    def parameters(self) -> dict[str, Tensor]:
        return {n: _full_tensor(p, self._host_mesh) for n, p in self.module.named_parameters()}


def gloo_serves_cuda(process_group: Any, device: torch.device) -> bool:
    """Whether ``device`` is a GPU whose tensors ``process_group`` hands to Gloo."""
    if device.type != "cuda":
        return False
    try:
        backend = process_group._get_backend(device)
    except (RuntimeError, AttributeError, ValueError):
        return False
    gloo = getattr(dist, "ProcessGroupGloo", None)
    return (gloo is not None and isinstance(backend, gloo)) or (
        getattr(backend, "name", lambda: "")() == "gloo")


def _full_tensor(t: Tensor, host_mesh: Any = None) -> Tensor:
    """A dense copy of the whole of ``t`` (a DTensor is gathered from every rank: a
    collective). With ``host_mesh``, gathered on the CPU and copied back to ``t``'s device."""
    if not hasattr(t, "full_tensor"):
        return t.detach().clone()
    if host_mesh is None:
        return cast(Tensor, t.full_tensor()).detach().clone()
    from torch.distributed.tensor import DTensor

    dt = cast(DTensor, t)
    local = dt.to_local().detach().cpu()
    on_host = DTensor.from_local(local, host_mesh, dt.placements, run_check=False,
                                 shape=dt.shape, stride=dt.stride())
    return on_host.full_tensor().detach().to(dt.device, copy=True)


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
