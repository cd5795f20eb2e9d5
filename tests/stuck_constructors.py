"""Candidates whose constructor never gets to DDP's work: the fail-fast rule's cases
(ddp_conformance/ranks/endings.py, tests/test_fail_fast.py)."""
from __future__ import annotations

import threading
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel


class HangsInConstructor(DistributedDataParallel):
    """A tutorial DDP whose constructor waits for an event nobody sets: a hang outside
    any collective, on every rank, in every case."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        threading.Event().wait()
        super().__init__(module, *args, **kwargs)


class RaisesInConstructor(DistributedDataParallel):
    """A DDP that refuses every model in its constructor, before any collective."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("this DDP runs on its own accelerator only")


class RaisesWithBuffers(DistributedDataParallel):
    """Refuses, before any collective, only models that have buffers: it fails some
    cases, and the rest must still run (the rule never cuts such a candidate short)."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        if any(True for _ in module.buffers()):
            raise RuntimeError("buffers are not supported")
        super().__init__(module, *args, **kwargs)
