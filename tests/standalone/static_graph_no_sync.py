"""torch's DDP with ``static_graph=True`` fails an INTERNAL ASSERT when the first
iteration accumulates over ``no_sync``.

Standalone (torch only, no harness)::

    python tests/standalone/static_graph_no_sync.py

Two ranks on Gloo, ``DistributedDataParallel(Linear, static_graph=True)``; the first
optimizer step accumulates two microbatches, the first inside ``no_sync()`` (the usual
gradient-accumulation loop). torch 2.13 raises ``RuntimeError: expect_autograd_hooks_
INTERNAL ASSERT FAILED at .../reducer.cpp`` in the second backward: the static graph's
first iteration queues ``delay_all_reduce`` at the end of the first backward (the one
inside ``no_sync``), whose ``finalize_backward`` then finds no backward expected. The same
loop without ``static_graph`` works. Prints one line per setting; exits 1 when the static
graph run raised where the dynamic one did not. Known: pytorch/pytorch#143580 (open;
the fix is pytorch/pytorch#187732, open).
"""
from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


def train(static_graph: bool) -> str:
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2), static_graph=static_graph)
    try:
        for _step in range(2):
            with model.no_sync():
                model(torch.randn(3, 4)).sum().backward()
            model(torch.randn(3, 4)).sum().backward()
        return "ok"
    except RuntimeError as exc:
        return f"RuntimeError: {str(exc).splitlines()[0][:100]}"


def worker(rank: int, port: int, out: dict[str, str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    for static in (False, True):
        result = train(static)
        if rank == 0:
            out[str(static)] = result
            print(f"static_graph={static}: {result}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=2, join=True)
    return 1 if out["False"] == "ok" and out["True"] != "ok" else 0


if __name__ == "__main__":
    sys.exit(main())
