"""Resolving ``--candidate SPEC``: a built-in name or ``package.module:attr``.

The built-ins are ``torch``, ``reference`` and the ecosystem adapters of
:mod:`ddp_conformance.builtins` (imported when first listed; each imports its package only
when resolved). ``attr`` is a :class:`~ddp_conformance.contract.candidate.Candidate` or a
DDP-like callable (:mod:`ddp_conformance.contract.ddp_like`).
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import sys
from collections.abc import Callable
from typing import Any

import torch

from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.ddp_like import ddp_like_candidate
from ddp_conformance.errors import UsageError
from ddp_conformance.user_import import import_user_module


def _torch_candidate() -> Candidate:
    from torch.nn.parallel import DistributedDataParallel

    from ddp_conformance.builtins._common import expectations_file

    candidate = ddp_like_candidate("torch", DistributedDataParallel, torch.__version__,
                                   "torch.nn.parallel.DistributedDataParallel (C++ reducer)")
    # torch's own defects, each shown by a standalone script (tests/standalone/).
    return dataclasses.replace(candidate, expectations=expectations_file("torch"))


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


def builtin_candidates() -> dict[str, Callable[[], Candidate]]:
    """Every built-in name: torch, reference, and the ecosystem adapters."""
    from ddp_conformance.builtins import ADAPTERS

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
    obj: Any = import_user_module(module_name, f"candidate {spec!r}")
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
