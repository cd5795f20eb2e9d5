"""Any callable with the constructor of ``torch.nn.parallel.DistributedDataParallel``.

Such a callable (a class, or a factory function) is a candidate through
:func:`ddp_like_candidate`: it is called as ``factory(module, process_group=...,
**ddp_options)`` and the returned module is driven by :class:`DDPLikeAdapter`. Its
capabilities are read from what it accepts (constructor keywords) and has (``no_sync``,
the Joinable protocol, ``register_comm_hook`` taking torch's ``(state, hook)``); a factory
function's are known only once it has been called (``Candidate.late_capabilities``). A
``register_comm_hook`` of another signature is not the comm-hook capability: the harness
calls it as ``register_comm_hook(state, hook)``, so comm-hook scenarios are N/A, with the
signature in the reason, rather than errors.
"""
from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
from torch import nn

from ddp_conformance.contract.adapter import Adapter, WrappedModuleAdapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import (
    DDP_OPTIONS,
    JOINABLE_ATTRIBUTES,
    METHOD_CAPABILITIES,
    Capabilities,
    Capability,
)
from ddp_conformance.errors import UsageError


class DDPLikeAdapter(WrappedModuleAdapter):
    """Adapts any module with DDP's constructor and methods: ``loss.backward(); opt.step()``."""

    def __init__(self, ddp: nn.Module, module: nn.Module, accepted: frozenset[str]) -> None:
        self.ddp = self.wrapped = ddp
        self.module = module
        self.capabilities = accepted | _instance_capabilities(ddp)

    def no_sync(self) -> ContextManager[None]:
        return self.ddp.no_sync()  # type: ignore[operator]

    def backward_retaining(self, loss: torch.Tensor) -> None:
        loss.backward(retain_graph=True)

    def join(self, **join_kwargs: Any) -> ContextManager[None]:
        """Join over the DDP module and, when it is joinable, the optimizer (ZeRO); the
        DDP's own ``join(...)`` (torch's ``DistributedDataParallel.join``) where it has one
        and the optimizer is not joinable, as a user of DDP alone writes it."""
        from torch.distributed.algorithms.join import Join, Joinable

        if not isinstance(self.optimizer, Joinable) and callable(getattr(self.ddp, "join", None)):
            return self.ddp.join(**join_kwargs)  # type: ignore[operator, no-any-return]
        throw = join_kwargs.pop("throw_on_early_termination", False)
        joinables = [self.ddp] + ([self.optimizer] if isinstance(self.optimizer, Joinable) else [])
        return Join(joinables, throw_on_early_termination=throw, **join_kwargs)  # type: ignore[arg-type]

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        self.ddp.register_comm_hook(state, hook)  # type: ignore[operator]

    def sync_context(self, is_final_microbatch: bool, strategy: str) -> ContextManager[None]:
        from ddp_reference import ddp_sync_context

        return ddp_sync_context(self.ddp, is_final_microbatch, strategy)

    def register_builtin_comm_hook(self, hook_type: Any) -> None:
        self.ddp._register_builtin_comm_hook(hook_type)  # type: ignore[operator]

    def register_buffer_comm_hook(self, state: Any, hook: Callable[..., Any], location: Any) -> None:
        self.ddp._register_buffer_comm_hook(state, hook, location)  # type: ignore[operator]

    def register_fused_optim(self, optim_cls: type, *args: Any, **kwargs: Any) -> None:
        self.ddp._register_fused_optim(optim_cls, *args, **kwargs)  # type: ignore[operator]

    def update_process_group(self, group: Any) -> None:
        self.ddp._update_process_group(group)  # type: ignore[operator]

    def set_broadcast_buffers(self, value: bool) -> None:
        self.ddp.broadcast_buffers = value  # type: ignore[assignment]

    def copy_wrapper(self, copier: Callable[[nn.Module], nn.Module]) -> nn.Module:
        """Replace the DDP by ``copier(ddp)`` (a pickled, deep-copied or ``torch.save``d
        copy, as torch's ``__getstate__``/``__setstate__`` allow); return the copy's
        module, which the caller trains from now on. The optimizer is rebuilt by the
        caller over the copy's parameters."""
        self.ddp = self.wrapped = copier(self.ddp)
        self.module = self.ddp.module  # type: ignore[assignment]
        return self.module


def _instance_capabilities(obj: Any) -> Capabilities:
    """The features ``obj`` (a DDP-like instance, or its class) has, with a note for a
    ``register_comm_hook`` that does not take torch's ``(state, hook)``. Pickling is
    claimed for every DDP-like module (an ``nn.Module`` pickles; torch's DDP defines
    ``__getstate__``/``__setstate__`` for it), and judged by the copy scenarios; so is a
    backward that retains the graph (a DDP-like module trains by ``loss.backward()``).
    Setting ``broadcast_buffers`` is claimed where ``obj`` has that attribute (torch's
    property, or a plain attribute its forward reads)."""
    caps: set[str] = {Capability.PICKLE.value, Capability.RETAIN_GRAPH.value}
    notes: dict[str, str] = {}
    if callable(getattr(obj, "no_sync", None)):
        # Composer's strategies need only no_sync (forced_sync reduces by hand).
        caps.update((Capability.NO_SYNC.value, Capability.SYNC_STRATEGY.value))
    if all(hasattr(obj, a) for a in JOINABLE_ATTRIBUTES):
        caps.add(Capability.JOIN.value)
    caps.update(cap.value for name, cap in METHOD_CAPABILITIES.items()
                if callable(getattr(obj, name, None)))
    if hasattr(obj, "broadcast_buffers"):  # torch's property (an attribute before 2.13)
        caps.add(Capability.SET_BROADCAST_BUFFERS.value)
    if callable(getattr(obj, "register_comm_hook", None)):
        other = _other_signature(_as_bound(obj, "register_comm_hook"))
        if other is None:
            caps.add(Capability.COMM_HOOK.value)
        else:
            notes[Capability.COMM_HOOK.value] = (
                f"its register_comm_hook takes {other}, not torch's (state, hook)")
    return Capabilities(caps, notes)


def _as_bound(obj: Any, name: str) -> Any:
    """``obj.name`` as called on an instance: for a class, a plain function is bound (to
    the class, only to drop ``self`` from its signature)."""
    if inspect.isclass(obj):
        static = inspect.getattr_static(obj, name, None)
        if inspect.isfunction(static):
            return types.MethodType(static, obj)
    return getattr(obj, name)


def _other_signature(method: Any) -> str | None:
    """``None`` when ``method(state, hook)`` binds (two positional arguments, ``*args``
    included, anything else optional); otherwise its parameters, as ``(hook)``."""
    try:
        sig = inspect.signature(method)
    except (TypeError, ValueError):
        return None  # no signature to read (a builtin): given the benefit of the doubt
    try:
        sig.bind(None, None)
    except TypeError:
        return _bare(sig)
    return None


def _bare(sig: inspect.Signature) -> str:
    """``sig`` without its annotations, as ``(module, device_ids=None)``."""
    bare = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=bare, return_annotation=inspect.Signature.empty))


def check_constructor(name: str, factory: Callable[..., Any]) -> None:
    """Raise :class:`UsageError` (exit 2, before any case) when ``factory`` cannot be called
    as the harness calls every DDP-like candidate, ``factory(module, process_group=group,
    **ddp_options)``, as torch's DDP is: a constructor without ``process_group`` (and
    without ``**kwargs``) would fail every case with the same TypeError. A signature that
    cannot be read is given the benefit of the doubt."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(None, process_group=None)
    except TypeError as exc:
        called = getattr(factory, "__name__", "factory")
        raise UsageError(
            f"candidate {name!r} cannot be called as torch's DDP is, {called}(module, "
            f"process_group=group, **ddp_options): {exc} (its signature: {_bare(sig)}); "
            f"accept process_group=, or give a Candidate") from None


#: The note on an option granted only because the factory takes ``**kwargs``.
THROUGH_KWARGS = "taken only through **kwargs"
#: An option taken only through ``**kwargs`` by a factory whose module holds no torch
#: ``DistributedDataParallel`` to pass it to: nothing reads it.
NEVER_READ = f"{THROUGH_KWARGS} and passed to no torch DistributedDataParallel: never read"


def unread_options(ddp: nn.Module, capabilities: frozenset[str],
                   options: Iterable[str]) -> tuple[str, ...]:
    """Those of ``options`` that the candidate took only through ``**kwargs``
    (:func:`kwargs_only_options`) when the module it returned holds no torch
    ``DistributedDataParallel`` (itself or a submodule): no code reads them. Misusing
    such an option cannot be refused, and checks that only the option gives a meaning
    to cannot apply; the values are judged as always."""
    swallowed = kwargs_only_options(capabilities, options)
    if not swallowed:
        return ()
    from torch.nn.parallel import DistributedDataParallel

    if any(isinstance(m, DistributedDataParallel) for m in ddp.modules()):
        return ()
    return tuple(swallowed)


def _accepted_options(factory: Callable[..., Any]) -> tuple[Capabilities, bool]:
    """Constructor keywords ``factory`` accepts, and whether it takes ``device_ids``.

    A factory that takes ``**kwargs`` is granted every option it does not name (a wrapper
    forwarding them to torch's DDP is common), each with the note :data:`THROUGH_KWARGS`,
    so that a verdict it causes can say the option may have been swallowed
    (:func:`kwargs_only_options`)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return Capabilities(Capability.option(o) for o in DDP_OPTIONS), True
    named = [o for o in DDP_OPTIONS if o in params]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        swallowed = [o for o in DDP_OPTIONS if o not in params]
        return Capabilities((Capability.option(o) for o in DDP_OPTIONS),
                            {Capability.option(o): THROUGH_KWARGS for o in swallowed}), True
    return Capabilities(Capability.option(o) for o in named), "device_ids" in params


def kwargs_only_options(capabilities: frozenset[str], options: Iterable[str]) -> list[str]:
    """Those of ``options`` (constructor keywords a scenario gives) that ``capabilities``
    grant only because the candidate takes ``**kwargs``: it may swallow them."""
    notes = getattr(capabilities, "notes", None) or {}
    return [o for o in options if notes.get(Capability.option(o)) == THROUGH_KWARGS]


def kwargs_only_remark(capabilities: frozenset[str], options: Iterable[str]) -> str:
    """The words a verdict adds where the scenario's options were taken only through
    ``**kwargs`` ('' for none)."""
    swallowed = kwargs_only_options(capabilities, options)
    if not swallowed:
        return ""
    return (f"option{'s' if len(swallowed) > 1 else ''} {', '.join(swallowed)} "
            f"{'were' if len(swallowed) > 1 else 'was'} {THROUGH_KWARGS}")


def ddp_like_candidate(name: str, factory: Callable[..., nn.Module], version: str = "",
                       description: str = "") -> Candidate:
    """A :class:`Candidate` for a callable with DDP's constructor signature (a
    :class:`UsageError` for one that takes no ``process_group``: :func:`check_constructor`)."""
    check_constructor(name, factory)
    accepted, takes_device_ids = _accepted_options(factory)

    def wrap(module: nn.Module, process_group: Any, device: torch.device,
             **ddp_options: Any) -> Adapter:
        kwargs: dict[str, Any] = dict(ddp_options)
        if "device_mesh" not in kwargs:  # torch refuses both (the mesh names the group)
            kwargs["process_group"] = process_group
        if takes_device_ids and device.type == "cuda" and "device_ids" not in kwargs:
            kwargs["device_ids"] = [device]
        adapter = DDPLikeAdapter(factory(module, **kwargs), module, accepted)
        adapter.unread_options = unread_options(adapter.ddp, accepted, ddp_options)
        return adapter

    is_class = inspect.isclass(factory)
    caps = accepted | (_instance_capabilities(factory) if is_class else frozenset())
    return Candidate(name=name, wrap=wrap, capabilities=caps, version=version,
                     description=description or _first_doc_line(factory),
                     late_capabilities=not is_class)


def _first_doc_line(obj: Any) -> str:
    """The first line of ``obj``'s own docstring ('' for none): a class without one does
    not describe itself with its base's (``nn.Module``: "Base class for all neural
    network modules.")."""
    own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    doc = inspect.cleandoc(own) if isinstance(own, str) else ""
    return doc.splitlines()[0] if doc else ""
