"""fairseq's legacy DDP (``legacy_distributed_data_parallel.py``, vendored under its MIT
licence, ``LICENSE``) as a DDP-like candidate: ``tests.fairseq:legacy_ddp``.

fairseq's trainer calls ``all_reduce_grads()`` after backward; here a post-accumulate
hook queues it once per autograd run (a backward, or each nested backward of a reentrant
checkpoint, as a hook-driven DDP would). The buffer is fairseq's default ``2**28``
elements (capped by fairseq at the model's size), or ``bucket_cap_mb`` worth of the
first parameter's dtype when the scenario sets a cap, so a small cap exercises the buffer
reused chunk after chunk and the gradients larger than it reduced straight from
``.grad``. Everything else (no initial broadcast, no buffer broadcast, zeros for unused
parameters, the buffer in the first parameter's dtype, ``no_sync`` without ``finally``)
is fairseq's own. Other DDP options are accepted and never read.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .legacy_distributed_data_parallel import LegacyDistributedDataParallel


class _Hooked(LegacyDistributedDataParallel):
    def __init__(self, module: nn.Module, process_group: Any, buffer_size: int) -> None:
        super().__init__(module, process_group, buffer_size)
        self._queued: set[int] = set()
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._queue)

    def _queue(self, _: torch.Tensor) -> None:
        task = torch._C._current_graph_task_id()
        if task not in self._queued:
            self._queued.add(task)
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self._reduce(task))

    def _reduce(self, task: int) -> None:
        self._queued.discard(task)
        self.all_reduce_grads()


def legacy_ddp(module: nn.Module, device_ids: Any = None, output_device: Any = None,
               process_group: Any = None, bucket_cap_mb: float | None = None,
               **options: Any) -> nn.Module:
    """fairseq's ``LegacyDistributedDataParallel`` over ``process_group``."""
    size = 2**28
    if bucket_cap_mb is not None:
        first = next(module.parameters())
        size = max(1, int(bucket_cap_mb * 2**20) // first.element_size())
    return _Hooked(module, process_group, size)
