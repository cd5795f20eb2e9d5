"""What the built-in adapters share: package checks, versions, option policies, gathering."""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_conformance.contract.capability import DDP_OPTIONS, Capability
from ddp_conformance.errors import UsageError

EXPECTATIONS_DIR = os.path.join(os.path.dirname(__file__), "expectations")

#: An option policy: for each DDP keyword the adapter honours, ``None`` (any value) or a
#: predicate on the value (e.g. only ``broadcast_buffers=False``, what FSDP does anyway).
OptionPolicy = Mapping[str, Callable[[Any], bool] | None]


def require(candidate: str, module: str, distribution: str, extra: str = "ecosystem") -> ModuleType:
    """Import ``module`` or raise one line saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(f"candidate {candidate!r} needs {distribution}: pip install -e .[{extra}] "
                         f"({type(exc).__name__}: {exc})") from None


def version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def expectations_file(name: str) -> str | None:
    path = os.path.join(EXPECTATIONS_DIR, f"{name}.txt")
    return path if os.path.exists(path) else None


def static_capabilities(policy: OptionPolicy, *features: Capability) -> frozenset[str]:
    """What a candidate may accept before wrapping: every option it honours for some value."""
    return frozenset(Capability.option(o) for o in policy) | {f.value for f in features}


def honoured(policy: OptionPolicy, ddp_options: Mapping[str, Any],
             *features: Capability) -> frozenset[str]:
    """The adapter's final capabilities for the options it was given.

    An option given with a value the framework cannot honour is left out, so the scenario
    is N/A ("candidate lacks option:...") rather than run with the option ignored.
    """
    caps = {f.value for f in features}
    for name in DDP_OPTIONS:
        if name not in policy:
            continue
        check = policy[name]
        if name not in ddp_options or check is None or check(ddp_options[name]):
            caps.add(Capability.option(name))
    return frozenset(caps)


def unknown_options(ddp_options: Mapping[str, Any]) -> None:
    """Options outside DDP's keyword set are a harness bug, not the candidate's."""
    extra = set(ddp_options) - set(DDP_OPTIONS)
    if extra:
        raise TypeError(f"unexpected DDP options {sorted(extra)}")


def group_size(process_group: Any) -> int:
    return dist.get_world_size(process_group)


def set_launcher_env(device: torch.device, **extra: str) -> None:
    """Set what a launcher (torchrun, ``accelerate launch``, DeepSpeed's) would have set,
    from the live default group, where absent: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``
    (the CUDA device's index, else the rank: one machine), plus ``extra``."""
    rank = dist.get_rank()
    local = device.index if device.type == "cuda" and device.index is not None else rank
    for key, value in {"RANK": str(rank), "WORLD_SIZE": str(dist.get_world_size()),
                       "LOCAL_RANK": str(local), **extra}.items():
        os.environ.setdefault(key, value)


def bucket_elements(module: nn.Module, bucket_cap_mb: float) -> int:
    """DDP's ``bucket_cap_mb`` as a bucket size in elements of the module's parameters
    (frameworks that size buckets in elements: DeepSpeed, fairscale)."""
    element = next((p.element_size() for p in module.parameters()), 4)
    return int(bucket_cap_mb * 2**20) // element


@contextlib.contextmanager
def sync_through_no_sync(no_sync: Callable[[], contextlib.AbstractContextManager[Any]],
                         gradients: Callable[[], list[torch.Tensor]], process_group: Any,
                         is_final_microbatch: bool, strategy: str) -> Iterator[None]:
    """One microbatch under a Composer sync strategy, for a framework whose only
    accumulation switch is its ``no_sync`` (``Adapter.sync_context``, as
    ``ddp_reference.ddp_sync_context`` drives torch's DDP): ``single_auto_sync`` is
    ``no_sync`` but for the final microbatch, ``multi_auto_sync`` syncs every one, and
    ``forced_sync`` runs every one under ``no_sync`` and then averages, over
    ``process_group``, the gradients the framework's optimizer steps with
    (``gradients()``), as Composer's forced sync does with ``.grad``."""
    if strategy == "multi_auto_sync" or (strategy == "single_auto_sync" and is_final_microbatch):
        yield
        return
    try:
        with no_sync():
            yield
    finally:
        if strategy == "forced_sync" and is_final_microbatch:
            size = dist.get_world_size(process_group)
            with torch.no_grad():
                for grad in gradients():
                    dist.all_reduce(grad, group=process_group)
                    grad.div_(size)


class SyncWindows:
    """``no_sync`` over a framework's ``set_requires_gradient_sync(bool)`` switch (FSDP2's
    ``fully_shard``, ``replicate``): gradient sync off inside every window, back on only
    when the outermost window closes, so a nested window leaves the outer one off as DDP's
    nested ``no_sync`` does (switching sync on at every exit reduced inside the outer one)."""

    def __init__(self, switch: Callable[[bool], None]) -> None:
        self._switch = switch
        #: How many windows are open (nested ones inside the outermost).
        self._depth = 0

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        self._depth += 1
        self._switch(False)
        try:
            yield
        finally:
            self._depth -= 1
            self._switch(self._depth == 0)
