"""A pure-Python reference DistributedDataParallel: the executable specification the
conformance harness compares candidates against (installed as ``ddp_reference``).

It reproduces torch 2.13's ``torch.nn.parallel.DistributedDataParallel`` with
``torch.distributed`` collectives and autograd hooks only: same bucket layouts, same
collectives in the same order, same gradients, parameters and buffers.
"""
from __future__ import annotations

from .buckets import BucketCapacity, assign_buckets, initial_bucket_layout
from .comm_hook import GradBucket
from .ddp import DistributedDataParallel
from .sync_strategy import SyncStrategy, ddp_sync_context

__all__ = [
    "BucketCapacity",
    "DistributedDataParallel",
    "GradBucket",
    "SyncStrategy",
    "assign_buckets",
    "ddp_sync_context",
    "initial_bucket_layout",
]
