"""FSDP2's full tensors read through the CPU (the adapter's path on Gloo with CUDA tensors,
``builtins/fsdp.py``) equal ``DTensor.full_tensor()`` bitwise, uneven and empty shards
included. Runs on CPU tensors, where both paths work: 2 real ranks, a real Gloo group."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ddp_conformance.builtins.fsdp import _full_tensor, gloo_serves_cuda
from ddp_conformance.ranks.pool import RankPool


def host_gather_equals_full_tensor(rank: int, world_size: int) -> list[str]:
    """Names of the parameters whose host-path gather differs from ``full_tensor()``."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    # 5 rows over 2 ranks: uneven (3 + 2); 1 row: rank 1's shard is empty.
    model = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 1))
    group = dist.group.WORLD
    fully_shard(model, mesh=DeviceMesh.from_group(group, "cpu"))
    host = DeviceMesh.from_group(group, "cpu")
    differ = []
    for name, p in model.named_parameters():
        a, b = p.full_tensor(), _full_tensor(p, host)
        if a.shape != b.shape or not torch.equal(a, b):
            differ.append(name)
    assert not gloo_serves_cuda(group, torch.device("cpu"))
    return differ


def test_host_path_gathers_the_same_full_tensors() -> None:
    with RankPool(2, spare=False) as pool:
        assert pool.call(f"{__name__}:host_gather_equals_full_tensor") == [[], []]
