"""The adapter: what the engine drives on each rank (docs/CONTRACT.md, "The candidate
contract").

One :class:`Adapter` per rank and scenario, returned by ``Candidate.wrap``. The engine
(:mod:`ddp_conformance.ranks.engine`) calls, in this order: ``set_optimizer`` once; the
scenario's hook registrations (``register_comm_hook`` or ``register_builtin_comm_hook``,
``register_buffer_comm_hook``, ``register_fused_optim``); ``parameters`` and ``buffers``;
then, inside ``join`` where the scenario uses Join, per optimizer step:
``update_process_group`` or ``copy_wrapper`` at the step the scenario names, an eval
forward (``train(False)``, ``forward``, ``train(True)``) where it asks, ``zero_grad``, per
microbatch ``forward`` and ``backward`` (``backward_retaining`` before the last of several
backwards; inside ``no_sync`` or ``sync_context`` where the scenario says), then
``gradients``, ``step``, ``parameters`` and ``buffers``.

The optional methods are each bound to one
:class:`~ddp_conformance.contract.capability.Capability` (:func:`capability_method`), the
one source of truth: the engine calls one only in a scenario that needs its capability,
and only after the adapter declared it in ``capabilities`` (else the case is N/A);
:data:`CAPABILITY_METHODS` reads the binding back. :class:`WrappedModuleAdapter` is the
adapter of every candidate that keeps torch's training loop
(``loss.backward(); opt.step()``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager as ContextManager
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from ddp_conformance.contract.capability import Capability

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
Method = TypeVar("Method", bound=Callable[..., Any])


def capability_method(capability: Capability) -> Callable[[Method], Method]:
    """Bind an optional :class:`Adapter` method to ``capability``: the engine calls it only
    for scenarios that need the capability, of adapters that declare it; the default
    raises ``NotImplementedError`` (an adapter that declares the capability overrides it)."""
    def bind(method: Method) -> Method:
        method.capability = capability  # type: ignore[attr-defined]
        return method

    return bind


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
    #: The scenario's DDP options that nothing in the candidate reads (taken only through
    #: ``**kwargs``, passed to no torch DDP: ``contract.ddp_like.unread_options``); set at
    #: wrap. Misuse of them is N/A, and so are checks only they give a meaning to.
    unread_options: tuple[str, ...] = ()

    @abstractmethod
    def set_optimizer(self, factory: OptimizerFactory) -> None:
        """Build the optimizer with ``factory(parameters)``. Called once, right after
        ``wrap`` and before parameters are first read, so a framework whose engine is built
        around its optimizer (DeepSpeed, fairscale's ShardedDataParallel with OSS) builds
        the engine here, init sync included. Every adapter (no capability)."""

    @abstractmethod
    def forward(self, *inputs: Any) -> Any:
        """The wrapped model's forward on one rank's batch, as a user calls the wrapper
        (``ddp(*inputs)``): what DDP does at a forward (buffer broadcast, preparing the
        backward) happens here. Called ``forwards`` times per microbatch, after
        ``zero_grad``, and in eval mode for an eval forward. Every adapter."""

    @abstractmethod
    def backward(self, loss: Tensor) -> None:
        """Back-propagate ``loss`` (the sum of the microbatch's forwards' losses) and
        synchronise the gradients as the candidate does (``loss.backward()`` for DDP; an
        engine's own backward for DeepSpeed). Called once per microbatch, after its
        forwards; inside ``no_sync`` it must not synchronise. Every adapter."""

    @abstractmethod
    def step(self) -> None:
        """One optimizer step on the synchronised gradients. Called once per step, after
        the last microbatch's backward and ``gradients``. Every adapter."""

    @abstractmethod
    def zero_grad(self, set_to_none: bool) -> None:
        """Clear the gradients before a step's first microbatch, to ``None`` where
        ``set_to_none`` (``optimizer.zero_grad(set_to_none=...)``). Called once per step.
        Every adapter."""

    def train(self, mode: bool) -> None:
        """Training (True) or evaluation (False) mode, as a user sets it on what they hold.
        Called around an eval forward (``eval_between_steps``). Every adapter."""
        self.module.train(mode)

    @capability_method(Capability.NO_SYNC)
    def no_sync(self) -> ContextManager[None]:
        """A context inside which backwards accumulate gradients locally without
        synchronising (DDP's ``no_sync()``); the first synced backward after it reduces
        the accumulated sum. Called for the microbatches the scenario does not sync, and
        entered around them (nested where it nests them). Capability ``no_sync``."""
        raise NotImplementedError("no_sync")

    @capability_method(Capability.RETAIN_GRAPH)
    def backward_retaining(self, loss: Tensor) -> None:
        """A backward that keeps the graph for another backward of the same loss
        (``loss.backward(retain_graph=True)``). Called before the last of a microbatch's
        several backwards (``Scenario.backwards``). Capability ``retain_graph``."""
        raise NotImplementedError("backward_retaining")

    @capability_method(Capability.JOIN)
    def join(self, **join_kwargs: Any) -> ContextManager[None]:
        """Torch's ``Join([ddp], **join_kwargs)`` around the whole training loop, for
        uneven inputs: a rank that ran out of batches shadows the others' collectives.
        Called once, after the hooks are registered, and entered around the training loop.
        Capability ``join``."""
        raise NotImplementedError("join")

    @capability_method(Capability.COMM_HOOK)
    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        """DDP's ``register_comm_hook(state, hook)``: ``hook(state, bucket)`` reduces each
        bucket from now on. Called after ``set_optimizer``, before the first forward
        (twice where the scenario tests the refusal). Capability ``comm_hook``."""
        raise NotImplementedError("register_comm_hook")

    @capability_method(Capability.SYNC_STRATEGY)
    def sync_context(self, is_final_microbatch: bool, strategy: str) -> ContextManager[None]:
        """One microbatch's forward and backward under a Composer sync strategy
        (``single_auto_sync``, ``multi_auto_sync``, ``forced_sync``): called for each
        microbatch and entered around it, instead of ``no_sync``. Capability
        ``sync_strategy``."""
        raise NotImplementedError("sync_context")

    @capability_method(Capability.BUILTIN_COMM_HOOK)
    def register_builtin_comm_hook(self, hook_type: Any) -> None:
        """torch's ``_register_builtin_comm_hook(dist.BuiltinCommHookType.X)``: a C++ hook.
        Called where ``register_comm_hook`` would be. Capability ``builtin_comm_hook``."""
        raise NotImplementedError("register_builtin_comm_hook")

    @capability_method(Capability.BUFFER_COMM_HOOK)
    def register_buffer_comm_hook(self, state: Any, hook: Callable[..., Any], location: Any) -> None:
        """torch's ``_register_buffer_comm_hook(state, hook, location)``: buffers are synced
        by ``hook(state, named_buffers)`` where DDP would broadcast them. Called after the
        comm hook, before the first forward. Capability ``buffer_comm_hook``."""
        raise NotImplementedError("register_buffer_comm_hook")

    @capability_method(Capability.FUSED_OPTIM)
    def register_fused_optim(self, optim_cls: type, *args: Any, **kwargs: Any) -> None:
        """torch's ``_register_fused_optim``: each parameter is stepped in backward, right
        after its gradient is reduced; ``step`` then has nothing left to do. Called before
        the first forward. Capability ``fused_optim``."""
        raise NotImplementedError("register_fused_optim")

    @capability_method(Capability.UPDATE_PROCESS_GROUP)
    def update_process_group(self, group: Any) -> None:
        """torch's ``_update_process_group(group)``: reduce over ``group`` from now on.
        Called before the step the scenario names. Capability ``update_process_group``."""
        raise NotImplementedError("update_process_group")

    @capability_method(Capability.PICKLE)
    def copy_wrapper(self, copier: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """Go on with ``copier(wrapper)`` (pickle, deepcopy or torch.save of the wrapper);
        return the module the copy wraps. Called before the step the scenario names, then
        ``set_optimizer`` again over the copy. Capability ``pickle``."""
        raise NotImplementedError("copy_wrapper")

    @capability_method(Capability.SET_BROADCAST_BUFFERS)
    def set_broadcast_buffers(self, value: bool) -> None:
        """torch's ``ddp.broadcast_buffers = value`` (a property that sets
        ``forward_sync_buffers``): from the next forward on, buffers are broadcast before
        forwards or not. Called before the step the scenario names. Capability
        ``set_broadcast_buffers``."""
        raise NotImplementedError("set_broadcast_buffers")

    def gradients(self) -> dict[str, Tensor | None]:
        """Full, dense gradients by parameter name (a sparse gradient is reported
        densified; ``None`` where there is none). Called once per step, after the last
        backward and before ``step``. Every adapter."""
        return {n: None if p.grad is None else dense(p.grad)
                for n, p in self.module.named_parameters()}

    def parameters(self) -> dict[str, Tensor]:
        """Full copies of the parameters by name. Called after wrapping (the init sync) and
        after every ``step``. Every adapter."""
        return {n: p.detach().clone() for n, p in self.module.named_parameters()}

    def buffers(self) -> dict[str, Tensor]:
        """Copies of the buffers by name, called with ``parameters``. Every adapter."""
        return {n: b.detach().clone() for n, b in self.module.named_buffers()}


#: Capability -> the name of the :class:`Adapter` method bound to it (read from the
#: class: :func:`capability_method` is where each binding is written).
CAPABILITY_METHODS: dict[str, str] = {
    method.capability.value: name for name, method in vars(Adapter).items()
    if hasattr(method, "capability")}


def unimplemented(adapter_class: type[Adapter], capabilities: Iterable[str]) -> list[str]:
    """The capabilities among ``capabilities`` whose method ``adapter_class`` does not
    override (it claims them and the engine would reach ``NotImplementedError``)."""
    return sorted(c for c in capabilities if c in CAPABILITY_METHODS
                  and getattr(adapter_class, CAPABILITY_METHODS[c])
                  is getattr(Adapter, CAPABILITY_METHODS[c]))


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
