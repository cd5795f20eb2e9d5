"""A backend whose rank lies, the way torchft 0.2.0's process groups do.

torchft builds every Python wrapper as ``ProcessGroup(0, 1)``: its C++ rank is 0 and its
C++ size 1 on every process; only its Python ``size()`` answers the job's size, and its
collectives go to a real Gloo group that knows the true rank. torch's own DDP on such a
group raises in its constructor; what the harness must do is say so before any case::

    --backend tests.backends.lying:lying_rank

Importing this module registers ``lying_rank`` (CPU).
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import Store

from tests.backends.example import ExampleProcessGroup, register


class LyingRankProcessGroup(ExampleProcessGroup):
    """The example backend's collectives (Gloo, true ranks), under a C++ ``(0, 1)``."""

    backend_name = "lying_rank"

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta) -> None:
        dist.ProcessGroup.__init__(self, 0, 1)  # torchft's wrapper: rank 0 of 1, everywhere
        self._size = size
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._pg = dist.ProcessGroup(rank, size)
        self._pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                                   self._gloo)
        self._pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)

    def size(self) -> int:
        """The job's size (the only answer that is true)."""
        return self._size


register(LyingRankProcessGroup)
lying_rank = LyingRankProcessGroup.backend_name
