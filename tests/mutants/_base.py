"""The correct DDP each mutant starts from, and the small tools mutants share.

A mutant is ``ddp_reference.DistributedDataParallel`` (faithful to torch's DDP) with one
piece overridden. :class:`MutantDDP` keeps torch's constructor signature exactly (so the
harness reads the same capabilities as for the reference) and lets a mutant

* change the constructor options it passes on (:meth:`MutantDDP.options`), or
* swap the reducer for a subclass with one method changed (``reducer_class``, a class
  attribute of the reference: its constructor builds ``self.reducer_class(...)``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from ddp_reference import DistributedDataParallel
from ddp_reference.reducer import Reducer
from torch import nn


class MutantDDP(DistributedDataParallel):
    """The reference DDP, unchanged unless a subclass overrides something."""

    def __init__(
        self,
        module: nn.Module,
        device_ids: Sequence[int | torch.device] | None = None,
        output_device: int | torch.device | None = None,
        *,
        broadcast_buffers: bool = True,
        process_group: dist.ProcessGroup | None = None,
        bucket_cap_mb: float | None = None,
        find_unused_parameters: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        init_sync: bool = True,
    ) -> None:
        opts = self.options(dict(
            broadcast_buffers=broadcast_buffers, process_group=process_group,
            bucket_cap_mb=bucket_cap_mb, find_unused_parameters=find_unused_parameters,
            gradient_as_bucket_view=gradient_as_bucket_view, static_graph=static_graph,
            init_sync=init_sync))
        object.__setattr__(self, "_constructing", True)
        super().__init__(module, device_ids, output_device, **opts)
        self._constructing = False
        self.mutate()

    def mutate(self) -> None:
        """Change the constructed DDP (runs at the end of the constructor)."""

    @classmethod
    def options(cls, opts: dict[str, Any]) -> dict[str, Any]:
        """The constructor options actually used (a mutant may ignore or change some)."""
        return opts


class DoneWork:
    """A ``dist.Work`` stand-in for a collective that was never issued."""

    def wait(self, timeout: Any = None) -> bool:
        return True


def done_future(value: torch.Tensor) -> torch.futures.Future:
    """A future already holding ``value`` (a bucket 'reduced' without any collective)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(value)
    return fut


def force_divisor(reducer: Reducer, factor: float) -> None:
    """Make the reducer divide by ``factor`` this iteration (clearing its reciprocal cache)."""
    if factor != reducer.div_factor_last:
        reducer._reciprocals = {}
        reducer.div_factor_last = factor
    reducer.div_factor = factor
