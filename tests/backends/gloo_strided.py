"""Standalone (torch only, no harness): Gloo ignores the strides of a non-contiguous tensor.

Run: ``python tests/backends/gloo_strided.py``. On torch 2.13 (CPU) it prints, for a
stride-2 view of 1024 elements, 512 wrong elements after ``all_reduce`` and 512 on the
non-root rank after ``broadcast``, and 512 elements *between* the view's elements
overwritten: Gloo reduces or sends the first 1024 elements of the storage. torch's open
issue: pytorch/pytorch#192920 (scatter, broadcast, reduce). The collective checks find it
as ``collectives/*-strided[gloo]`` (shipped as expected failures of backend gloo).
"""
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    n = 1024
    base = torch.full((n, 2), 99.0)
    view = base[:, 0]  # stride 2: not contiguous
    view.copy_(torch.full((n,), float(rank + 1)))
    dist.all_reduce(view)  # every element must become 1 + 2 = 3
    wrong = (view != 3).nonzero().flatten()
    print(f"rank {rank}: all_reduce of a stride-2 view of {n}: {len(wrong)} wrong elements "
          f"(first {wrong[0].item() if len(wrong) else '-'}), "
          f"{int((base[:, 1] != 99).sum())} elements between them overwritten", flush=True)
    base = torch.full((n, 2), 99.0)
    view = base[:, 0]
    if rank == 0:
        view.copy_(torch.arange(n, dtype=torch.float32))
    dist.broadcast(view, src=0)
    wrong = (view != torch.arange(n, dtype=torch.float32)).nonzero().flatten()
    print(f"rank {rank}: broadcast of a stride-2 view from rank 0: {len(wrong)} wrong elements",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    print("torch", torch.__version__)
    mp.spawn(run, args=(free,), nprocs=2)
