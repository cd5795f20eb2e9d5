"""A first hand-written DDP, as the tutorial writes it (it has a bug: find it with
ddp-conformance, then fix it).

Broadcast rank 0's weights in the constructor, allreduce each gradient as soon as it is
accumulated, and average. DDP's other keyword arguments are accepted and ignored.
"""
import torch
import torch.distributed as dist
from torch import nn


class MyDDP(nn.Module):
    def __init__(self, module, device_ids=None, output_device=None, process_group=None,
                 **ignored):
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

    def _reduce(self, p):
        dist.all_reduce(p.grad, group=self.process_group)  # sums over the ranks

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)
