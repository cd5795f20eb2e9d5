"""torch 2.13's DDP with ``static_graph=True``, copied after training has begun
(``copy.deepcopy``, pickle or ``torch.save``), does not reduce the copy's first backward.

Standalone (torch only, no harness)::

    python tests/standalone/static_graph_deepcopy.py

Two ranks on Gloo (CPU) train a small MLP under ``DistributedDataParallel(static_graph=
True)`` for two steps on rank-dependent data, deep-copy the wrapper (torch's
``__getstate__``/``__setstate__``: a new reducer, static graph set again) and backward
once through the copy. The copy's gradients differ across the ranks: they are each rank's
local gradient, never all-reduced. ``__getstate__`` keeps ``_static_graph_delay_allreduce_
enqueued`` (True after the first iteration) in the copied state, so the copy's first
forward skips the ``_DDPSink`` that queues the reducer's delayed all-reduce of a static
graph's first iteration, while its new reducer is in that first iteration. Without
``static_graph`` the copy's gradients agree. Prints one line per case (rank 0); exits 1
when the static-graph copy's gradients differ across ranks while the plain copy's agree.
"""
from __future__ import annotations

import copy
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def grads_after_copy(static_graph: bool) -> torch.Tensor:
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)),
                                  static_graph=static_graph)
    rank = dist.get_rank()
    for step in range(2):
        ddp.zero_grad()
        ddp(torch.randn(4, 8, generator=torch.Generator().manual_seed(10 * step + rank))).sum().backward()
    copied = copy.deepcopy(ddp)
    copied.zero_grad()
    copied(torch.randn(4, 8, generator=torch.Generator().manual_seed(100 + rank))).sum().backward()
    return copied.module[0].weight.grad.detach().clone()


def worker(rank: int, world_size: int, port: int, results: dict[str, str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    for static_graph in (False, True):
        grad = grads_after_copy(static_graph)
        gathered = [torch.empty_like(grad) for _ in range(world_size)]
        dist.all_gather(gathered, grad)
        if rank == 0:
            same = all(torch.equal(gathered[0], g) for g in gathered[1:])
            results[str(static_graph)] = "agree" if same else "differ"
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(2, port, results), nprocs=2)
        found = dict(results)
    for static_graph in ("False", "True"):
        print(f"static_graph={static_graph}: the copy's first gradients {found[static_graph]} "
              f"across ranks")
    return 1 if found["True"] == "differ" and found["False"] == "agree" else 0


if __name__ == "__main__":
    sys.exit(main())
