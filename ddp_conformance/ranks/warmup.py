"""Paying torch's one-time costs when a process starts, not inside a case's deadline.

The first optimizer a process creates imports ``torch._dynamo`` (torch 2.x optimizers
consult it): about 2 s on this machine, measured, which the first case on every rank —
and on every rank that replaced one — used to pay in its own deadline and time. Each rank
pays it before it says it is ready (so a spare pays it in the background), and the parent
pays it, for its oracle's optimizers, while its ranks start. A rank on a CUDA device also
creates its CUDA context there, outside any case's deadline.
"""
from __future__ import annotations

import importlib

import torch

#: Modules that a case would otherwise import lazily, at a cost.
LAZY_IMPORTS = ("torch._dynamo",)


def warm_up(device: torch.device | None = None) -> None:
    """Import :data:`LAZY_IMPORTS` now (a module that fails to import is left to fail later,
    where it is used); on a CUDA ``device``, create the CUDA context and run a kernel there
    too (CUDA start-up took 12 s in a first case on an H100 before it was paid here).
    The rank has pinned its device before this (``torch.cuda.set_device``)."""
    for name in LAZY_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not this module's verdict to give
            pass
    if device is not None and device.type == "cuda":
        torch.ones(1, device=device).add_(1).sum().item()
