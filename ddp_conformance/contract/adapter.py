"""The adapter: what the engine drives on each rank (SPEC.md, "The candidate contract").

One :class:`Adapter` per rank and scenario, returned by ``Candidate.wrap``. The engine calls,
in this order: ``set_optimizer`` once; ``register_comm_hook`` where the scenario has a hook;
then per optimizer step ``zero_grad``, per microbatch ``forward`` and ``backward`` (inside
``no_sync``, ``sync_context`` or ``join`` where the scenario says), ``gradients``, ``step``,
``parameters`` and ``buffers``. :class:`WrappedModuleAdapter` is the adapter of every
candidate that keeps torch's training loop (``loss.backward(); opt.step()``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
from torch import Tensor, nn

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


class Adapter(ABC):
    """What the engine drives on each rank: one wrapped model and its optimizer.

    It must report *full* gradients and parameters keyed by the wrapped module's parameter
    names, even where the candidate shards them (DeepSpeed, FSDP), so that every check can
    compare them with the oracle.
    """

    module: nn.Module
    #: What this adapter can do (:class:`~ddp_conformance.contract.capability.Capability`
    #: names); a ``Capabilities`` set may add a note on why one is missing, for the N/A reason.
    capabilities: frozenset[str] = frozenset()

    @abstractmethod
    def set_optimizer(self, factory: OptimizerFactory) -> None:
        """Build the optimizer with ``factory(parameters)``. Called once, right after
        ``wrap`` and before parameters are first read, so a framework whose engine is built
        around its optimizer (DeepSpeed, fairscale's ShardedDataParallel with OSS) builds
        the engine here, init sync included."""

    @abstractmethod
    def forward(self, *inputs: Any) -> Any: ...

    @abstractmethod
    def backward(self, loss: Tensor) -> None: ...

    @abstractmethod
    def step(self) -> None: ...

    @abstractmethod
    def zero_grad(self, set_to_none: bool) -> None: ...

    def train(self, mode: bool) -> None:
        """Training (True) or evaluation (False) mode, as a user sets it on what they hold."""
        self.module.train(mode)

    def no_sync(self) -> ContextManager[None]:
        raise NotImplementedError("no_sync")

    def backward_retaining(self, loss: Tensor) -> None:
        """A backward that keeps the graph for another backward of the same loss
        (``loss.backward(retain_graph=True)``): the ``retain_graph`` capability."""
        raise NotImplementedError("backward_retaining")

    def join(self, **join_kwargs: Any) -> ContextManager[None]:
        raise NotImplementedError("join")

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        raise NotImplementedError("register_comm_hook")

    def sync_context(self, is_final_microbatch: bool, strategy: str) -> ContextManager[None]:
        """One microbatch's forward and backward under a Composer sync strategy."""
        raise NotImplementedError("sync_context")

    def register_builtin_comm_hook(self, hook_type: Any) -> None:
        """torch's ``_register_builtin_comm_hook(dist.BuiltinCommHookType.X)``."""
        raise NotImplementedError("register_builtin_comm_hook")

    def register_buffer_comm_hook(self, state: Any, hook: Callable[..., Any], location: Any) -> None:
        """torch's ``_register_buffer_comm_hook(state, hook, location)``: buffers are synced
        by ``hook(state, named_buffers)`` where DDP would broadcast them."""
        raise NotImplementedError("register_buffer_comm_hook")

    def register_fused_optim(self, optim_cls: type, *args: Any, **kwargs: Any) -> None:
        """torch's ``_register_fused_optim``: each parameter is stepped in backward, right
        after its gradient is reduced; ``step`` then has nothing left to do."""
        raise NotImplementedError("register_fused_optim")

    def update_process_group(self, group: Any) -> None:
        """torch's ``_update_process_group(group)``: reduce over ``group`` from now on."""
        raise NotImplementedError("update_process_group")

    def copy_wrapper(self, copier: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """Go on with ``copier(wrapper)``; return the module the copy wraps."""
        raise NotImplementedError("copy_wrapper")

    def gradients(self) -> dict[str, Tensor | None]:
        """Full, dense gradients (a sparse gradient is reported densified)."""
        return {n: None if p.grad is None else dense(p.grad)
                for n, p in self.module.named_parameters()}

    def parameters(self) -> dict[str, Tensor]:
        return {n: p.detach().clone() for n, p in self.module.named_parameters()}

    def buffers(self) -> dict[str, Tensor]:
        return {n: b.detach().clone() for n, b in self.module.named_buffers()}


def dense(t: Tensor) -> Tensor:
    """A detached dense copy of ``t`` (sparse gradients are compared densified)."""
    return t.detach().to_dense() if t.is_sparse else t.detach().clone()


class WrappedModuleAdapter(Adapter):
    """An adapter whose step is ``wrapped(*inputs)``, ``loss.backward()``, ``opt.step()``:
    DDP and every wrapper that keeps torch's training loop (FSDP, replicate, Lightning's
    strategy). Subclasses set ``wrapped`` and add what differs."""

    wrapped: nn.Module
    optimizer: torch.optim.Optimizer | None = None

    def set_optimizer(self, factory: OptimizerFactory) -> None:
        self.optimizer = factory(self.wrapped.parameters())

    def forward(self, *inputs: Any) -> Any:
        return self.wrapped(*inputs)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def train(self, mode: bool) -> None:
        """``model.train(mode)`` on the wrapper, as a user of DDP calls it."""
        self.wrapped.train(mode)

    def step(self) -> None:
        assert self.optimizer is not None, "set_optimizer first"
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool) -> None:
        assert self.optimizer is not None, "set_optimizer first"
        self.optimizer.zero_grad(set_to_none=set_to_none)
