"""torch 2.13's ``DistributedDataParallel`` reduces only the first backward of a forward:
a second ``backward`` of the same loss (the first with ``retain_graph=True``) adds its
local gradient unreduced, so on per-rank data the replicas' gradients differ.

Standalone (torch only, no harness)::

    python tests/standalone/retain_graph_second_backward_local.py

Two ranks on Gloo (CPU), ``Linear(3, 1, bias=False)`` under DDP, rank ``r`` trains on a
row of ``r + 1``: the local gradient is ``[r + 1] * 3``, the average ``[1.5] * 3``. After
``loss.backward(retain_graph=True)`` every rank holds the average; after the second
``loss.backward()`` rank ``r`` holds ``1.5 + (r + 1)``: 2.5 on rank 0, 3.5 on rank 1. The
reducer is prepared in the forward (``prepare_for_backward``) and, once the first backward
has finalized, ignores autograd hooks until the next forward (``expect_autograd_hooks_``).
Prints each rank's gradients; exits 1 when the ranks disagree after the second backward
(torch's behaviour, the reason the catalog's ``procedures/backward-twice-retain-graph``
runs on the same batch on every rank).
"""
from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def worker(rank: int, world_size: int, port: int, results: dict[int, tuple[float, float]]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 1, bias=False)
    model = DistributedDataParallel(module)
    loss = model(torch.full((1, 3), float(rank + 1))).sum()
    loss.backward(retain_graph=True)
    assert module.weight.grad is not None
    first = float(module.weight.grad[0, 0])
    loss.backward()
    results[rank] = (first, float(module.weight.grad[0, 0]))
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(2, port, results), nprocs=2)
        grads = dict(results)
    for rank, (first, second) in sorted(grads.items()):
        print(f"rank {rank}: after the first backward {first}, after the second {second}")
    return 1 if grads[0][1] != grads[1][1] else 0


if __name__ == "__main__":
    sys.exit(main())
