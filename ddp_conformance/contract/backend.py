"""The backend under test: ``--backend gloo``, ``nccl``, or ``MODULE:NAME``.

docs/CONTRACT.md, "Backends and scale": ``--backend MODULE:NAME`` runs on any c10d backend that
MODULE registers under NAME with ``torch.distributed.Backend.register_backend`` when it is
imported (a third-party package's ``import`` registers its backend the same way). The
registration says which device types the backend serves (its ``devices`` argument,
kept by torch in ``Backend.backend_capability``); the run's ``--device`` must be one of
them. A plain NAME is a built-in (``gloo``, ``nccl``) or a backend registered already.

Every process that runs collectives resolves the same spec: the parent to check it (exit 2
with one line when the module cannot be imported, registers nothing under NAME, or the
backend lacks the device), each rank before its first process group.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ddp_conformance.errors import UsageError
from ddp_conformance.user_import import import_user_module

#: The backends torch builds in that the harness knows how to run and trace.
BUILTIN = ("gloo", "nccl")


@dataclass(frozen=True)
class BackendSpec:
    """A resolved ``--backend``: ``name`` is what ``init_process_group`` is given."""

    spec: str
    name: str
    #: The module that registered it ('' for a built-in).
    module: str = ""
    #: Device types it serves, as registered.
    devices: tuple[str, ...] = ("cpu", "cuda")

    @property
    def custom(self) -> bool:
        """Whether it is a backend other than torch's own Gloo and NCCL."""
        return self.name not in BUILTIN


def name_of(spec: str) -> str:
    """The name ``init_process_group`` is given for ``--backend SPEC`` (NAME of
    ``MODULE:NAME``, lower-cased as torch registers it), without importing anything."""
    return spec.partition(":")[2].lower() if ":" in spec else spec.lower()


def registered(name: str) -> bool:
    """Whether ``name`` is a backend registered through ``Backend.register_backend``."""
    return name.upper() in dist.Backend._plugins


def capability(name: str) -> tuple[str, ...]:
    """The device types backend ``name`` declared (torch's ``backend_capability``)."""
    if name == "gloo":
        return ("cpu", "cuda")
    if name == "nccl":
        return ("cuda",)
    return tuple(dist.Backend.backend_capability.get(name.lower(), ()))


def resolve_backend(spec: str) -> BackendSpec:
    """Turn ``--backend SPEC`` into a :class:`BackendSpec`, importing MODULE if named; raise
    :class:`UsageError` with one line when it names no usable backend."""
    if not spec or spec != spec.strip():
        raise UsageError(f"--backend {spec!r}: empty or padded with spaces")
    if ":" not in spec:
        if spec in BUILTIN or registered(spec):
            return BackendSpec(spec, name_of(spec), "", capability(spec))
        raise UsageError(f"unknown backend {spec!r}; choose gloo, nccl, or MODULE:NAME for a "
                         "backend that MODULE registers with torch.distributed.Backend."
                         "register_backend")
    module_name, _, name = spec.partition(":")
    if not name or ":" in name:
        raise UsageError(f"--backend {spec!r}: expected MODULE:NAME, NAME the backend that "
                         "MODULE registers")
    if name.lower() in BUILTIN:
        raise UsageError(f"--backend {spec!r}: {name} is torch's own backend; say "
                         f"--backend {name.lower()}")
    import_user_module(module_name, f"backend {spec!r}")
    if not registered(name):
        others = sorted(n.lower() for n in dist.Backend._plugins
                        if not n.lower().startswith("traced_"))
        raise UsageError(f"backend {spec!r}: importing {module_name!r} registered no backend "
                         f"named {name!r} (registered: {', '.join(others) or 'none'})")
    return BackendSpec(spec, name_of(spec), module_name, capability(name))
