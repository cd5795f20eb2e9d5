"""The candidate contract (SPEC.md, "The candidate contract").

A candidate is chosen by ``--candidate SPEC``: a built-in name or ``package.module:attr``.
``attr`` is either a :class:`Candidate` (name, capabilities, supported backends and a
``wrap`` returning an :class:`Adapter`), or any callable with the constructor signature of
``torch.nn.parallel.DistributedDataParallel`` returning an ``nn.Module``; such a callable is
adapted by :class:`DDPLikeAdapter`, and its capabilities are read from what it accepts
(constructor keywords) and has (``no_sync``, the Joinable protocol, ``register_comm_hook``).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .errors import UsageError
from .scenario import Capability

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]

#: Constructor keywords of torch's DDP that scenarios may set.
DDP_OPTIONS = (
    "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters",
    "gradient_as_bucket_view", "static_graph", "init_sync",
)
JOINABLE_ATTRIBUTES = ("join_hook", "join_device", "join_process_group")


class Adapter(ABC):
    """What the engine drives on each rank: one wrapped model and its optimizer.

    It must report *full* gradients and parameters keyed by the wrapped module's parameter
    names, even where the candidate shards them (DeepSpeed, FSDP), so that every check can
    compare them with the oracle.
    """

    module: nn.Module
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

    def no_sync(self) -> ContextManager[None]:
        raise NotImplementedError("no_sync")

    def join(self, **join_kwargs: Any) -> ContextManager[None]:
        raise NotImplementedError("join")

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        raise NotImplementedError("register_comm_hook")

    def sync_context(self, is_final_microbatch: bool, strategy: str) -> ContextManager[None]:
        """One microbatch's forward and backward under a Composer sync strategy."""
        raise NotImplementedError("sync_context")

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


@dataclass
class Candidate:
    """A DDP implementation under test.

    ``wrap(module, process_group, device, **ddp_options)`` returns an :class:`Adapter`.
    ``capabilities`` are what the harness may know before wrapping (options accepted,
    features); the adapter's own ``capabilities`` are final.
    """

    name: str
    wrap: Callable[..., Adapter]
    capabilities: frozenset[str] = frozenset()
    backends: frozenset[str] = frozenset({"gloo", "nccl"})
    version: str = ""
    description: str = ""
    #: When True, capabilities are only known once the model is wrapped (a factory function).
    late_capabilities: bool = False
    #: An expectations file shipped with the candidate (built-in adapters), applied with
    #: any ``--expectations`` file the user gives.
    expectations: str | None = None


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

    def step(self) -> None:
        assert self.optimizer is not None, "set_optimizer first"
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool) -> None:
        assert self.optimizer is not None, "set_optimizer first"
        self.optimizer.zero_grad(set_to_none=set_to_none)


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


# --- resolution -----------------------------------------------------------------------


def _torch_candidate() -> Candidate:
    from torch.nn.parallel import DistributedDataParallel

    return ddp_like_candidate("torch", DistributedDataParallel, torch.__version__,
                              "torch.nn.parallel.DistributedDataParallel (C++ reducer)")


def _reference_candidate() -> Candidate:
    import ddp_reference

    return ddp_like_candidate("reference", ddp_reference.DistributedDataParallel,
                              _distribution_version("ddp-conformance"),
                              "ddp_reference: the pure-Python reference DDP")


BUILTINS: dict[str, Callable[[], Candidate]] = {
    "torch": _torch_candidate,
    "reference": _reference_candidate,
}


def _distribution_version(dist_name: str) -> str:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return ""


@contextlib.contextmanager
def _cwd_importable() -> Iterator[None]:
    """Make the current directory importable, as ``python -m`` does."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def builtin_candidates() -> dict[str, Callable[[], Candidate]]:
    """Every built-in name: torch, reference, and the ecosystem adapters."""
    from .adapters import ADAPTERS

    return {**BUILTINS, **ADAPTERS}


def resolve_candidate(spec: str) -> Candidate:
    """Turn ``--candidate SPEC`` into a :class:`Candidate`, or raise :class:`UsageError`."""
    builtins = builtin_candidates()
    if spec in builtins:
        return builtins[spec]()
    if ":" not in spec:
        raise UsageError(f"unknown candidate {spec!r}: not a built-in "
                         f"({', '.join(builtins)}) and not of the form package.module:attr")
    module_name, _, attr_path = spec.partition(":")
    try:
        with _cwd_importable():
            obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"unknown candidate {spec!r}: cannot import {module_name!r} ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - the candidate's own import-time error
        raise UsageError(f"candidate {spec!r}: importing {module_name!r} raised "
                         f"{type(exc).__name__}: {exc}") from None
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"unknown candidate {spec!r}: {module_name!r} has no attribute "
                             f"{attr_path!r}") from None
    if isinstance(obj, Candidate):
        return obj
    if callable(obj):
        top = module_name.split(".")[0]
        version = getattr(sys.modules.get(top), "__version__", "") or _distribution_version(top)
        return ddp_like_candidate(spec, obj, str(version))
    raise UsageError(f"candidate {spec!r} is neither a Candidate nor a DDP-like callable")
