"""Any callable with the constructor of ``torch.nn.parallel.DistributedDataParallel``.

Such a callable (a class, or a factory function) is a candidate through
:func:`ddp_like_candidate`: it is called as ``factory(module, process_group=...,
**ddp_options)`` and the returned module is driven by :class:`DDPLikeAdapter`. Its
capabilities are read from what it accepts (constructor keywords) and has (``no_sync``,
the Joinable protocol, ``register_comm_hook``); a factory function's are known only once
it has been called (``Candidate.late_capabilities``).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
from torch import nn

from ddp_conformance.contract.adapter import Adapter, WrappedModuleAdapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import DDP_OPTIONS, JOINABLE_ATTRIBUTES, Capability


class DDPLikeAdapter(WrappedModuleAdapter):
    """Adapts any module with DDP's constructor and methods: ``loss.backward(); opt.step()``."""

    def __init__(self, ddp: nn.Module, module: nn.Module, accepted: frozenset[str]) -> None:
        self.ddp = self.wrapped = ddp
        self.module = module
        self.capabilities = accepted | _instance_capabilities(ddp)

    def no_sync(self) -> ContextManager[None]:
        return self.ddp.no_sync()  # type: ignore[operator]

    def join(self, **join_kwargs: Any) -> ContextManager[None]:
        """Join over the DDP module and, when it is joinable, the optimizer (ZeRO)."""
        from torch.distributed.algorithms.join import Join, Joinable

        throw = join_kwargs.pop("throw_on_early_termination", False)
        joinables = [self.ddp] + ([self.optimizer] if isinstance(self.optimizer, Joinable) else [])
        return Join(joinables, throw_on_early_termination=throw, **join_kwargs)  # type: ignore[arg-type]

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        self.ddp.register_comm_hook(state, hook)  # type: ignore[operator]

    def sync_context(self, is_final_microbatch: bool, strategy: str) -> ContextManager[None]:
        from ddp_reference import ddp_sync_context

        return ddp_sync_context(self.ddp, is_final_microbatch, strategy)


def _instance_capabilities(obj: Any) -> frozenset[str]:
    caps: set[str] = set()
    if callable(getattr(obj, "no_sync", None)):
        # Composer's strategies need only no_sync (forced_sync reduces by hand).
        caps.update((Capability.NO_SYNC.value, Capability.SYNC_STRATEGY.value))
    if all(hasattr(obj, a) for a in JOINABLE_ATTRIBUTES):
        caps.add(Capability.JOIN.value)
    if callable(getattr(obj, "register_comm_hook", None)):
        caps.add(Capability.COMM_HOOK.value)
    return frozenset(caps)


def _accepted_options(factory: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    """Constructor keywords ``factory`` accepts, and whether it takes ``device_ids``."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return frozenset(Capability.option(o) for o in DDP_OPTIONS), True
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return frozenset(Capability.option(o) for o in DDP_OPTIONS), True
    return frozenset(Capability.option(o) for o in DDP_OPTIONS if o in params), "device_ids" in params


def ddp_like_candidate(name: str, factory: Callable[..., nn.Module], version: str = "",
                       description: str = "") -> Candidate:
    """A :class:`Candidate` for a callable with DDP's constructor signature."""
    accepted, takes_device_ids = _accepted_options(factory)

    def wrap(module: nn.Module, process_group: Any, device: torch.device,
             **ddp_options: Any) -> Adapter:
        kwargs: dict[str, Any] = dict(ddp_options, process_group=process_group)
        if takes_device_ids and device.type == "cuda":
            kwargs["device_ids"] = [device]
        return DDPLikeAdapter(factory(module, **kwargs), module, accepted)

    is_class = inspect.isclass(factory)
    caps = accepted | (_instance_capabilities(factory) if is_class else frozenset())
    return Candidate(name=name, wrap=wrap, capabilities=caps, version=version,
                     description=description or _first_doc_line(factory),
                     late_capabilities=not is_class)


def _first_doc_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.splitlines()[0] if doc else ""
