"""What the built-in adapters share: package checks, versions, option policies, gathering."""
from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import torch.distributed as dist

from ..candidate import DDP_OPTIONS
from ..errors import UsageError
from ..scenario import Capability

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
