"""Custom DDPs as people first write them: they hang or raise the way custom DDPs do. For
the tests of desync diagnosis and fault handling, and the fault-cost benchmark
(``benchmarks/fault_cost.py``).

- :class:`NewcomerDDP`: a first custom DDP as people write it — broadcast the weights in
  the constructor, allreduce each gradient in a post-accumulate hook, average; DDP's other
  keyword arguments accepted and ignored. It has no bucketing, no unused-parameter handling
  and no ``no_sync``: where ranks disagree on which gradients exist, their collective
  streams part ways and it hangs.
- :class:`NeedsReset`: a DDP whose every step must be preceded by a ``reset()`` the
  generic training loop never calls: it raises on every rank, in every case (the
  third-party DDP of issue 10 raised on 44 cases).
- :class:`SlowRank1`: correct, but rank 1 sleeps 2.5 s before its first step while rank 0
  waits in the gradient allreduce: merely slow, never a desync.
- :class:`RaisesOnRank1`: raises on rank 1 only, in the first forward, while rank 0 goes on
  into the gradient allreduce: rank 0 waits on rank 1 until rank 1 leaves.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class NewcomerDDP(nn.Module):
    def __init__(self, module: nn.Module, device_ids: Any = None, output_device: Any = None,
                 process_group: Any = None, **ignored: Any) -> None:
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        source = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p.data, source, group=process_group)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, p: torch.Tensor) -> None:
        assert p.grad is not None
        dist.all_reduce(p.grad, group=self.process_group)
        p.grad.div_(self.world_size)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class NeedsReset(NewcomerDDP):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.armed = False

    def reset(self) -> None:
        self.armed = True

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self.armed:
            raise RuntimeError("NeedsReset: call reset() before every step")
        self.armed = False
        return super().forward(*args, **kwargs)


class RaisesOnRank1(NewcomerDDP):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if dist.get_rank() == 1:
            raise RuntimeError("RaisesOnRank1: rank 1 fails in forward")
        return super().forward(*args, **kwargs)


class SlowRank1(NewcomerDDP):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slept = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if dist.get_rank() == 1 and not self.slept:
            self.slept = True
            time.sleep(2.5)
        return super().forward(*args, **kwargs)
