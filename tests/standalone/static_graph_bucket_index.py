"""torch's DDP with ``static_graph=True`` hands a comm hook the wrong bucket position in the
first iteration when the model has several buckets: ``GradBucket.index()`` is 0 for every
bucket and ``is_last()`` is never True.

Standalone (torch only, no harness)::

    python tests/standalone/static_graph_bucket_index.py

Two ranks on Gloo (CPU) wrap a model with a float32 and a float64 layer (DDP buckets per
dtype: two buckets) and register an allreduce hook that records ``(bucket.index(),
bucket.is_last())`` on every call; two steps each, without and with ``static_graph``.
Without it every iteration reports ``(0, False), (1, True)``. With it the first iteration
(where a static graph delays its all-reduce to the end of backward) reports ``(0, False),
(0, False)``: a hook that relies on the position (PowerSGD's and post-local SGD's state,
or any per-iteration bookkeeping ended by ``is_last()``) miscounts. Prints what each run
saw (rank 0); exits 1 when the static graph's first iteration repeats an index or has no
last bucket while the dynamic graph's do not.
"""
from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class TwoDtypes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)).double())


def positions(static_graph: bool) -> list[list[tuple[int, bool]]]:
    """Per iteration, the (index(), is_last()) of every hook call."""
    seen: list[list[tuple[int, bool]]] = []

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # torch reads annotations
        seen[-1].append((bucket.index(), bucket.is_last()))
        buffer = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(buffer, async_op=True).get_future().then(
            lambda fut: fut.value()[0])

    torch.manual_seed(0)
    ddp = DistributedDataParallel(TwoDtypes(), static_graph=static_graph)
    ddp.register_comm_hook(None, hook)
    for step in range(2):
        seen.append([])
        ddp(torch.randn(4, 8, generator=torch.Generator().manual_seed(step))).sum().backward()
    return seen


def wrong(iteration: list[tuple[int, bool]]) -> bool:
    indices = [i for i, _ in iteration]
    return len(set(indices)) != len(indices) or not any(last for _, last in iteration)


def worker(rank: int, port: int, out: dict[str, object]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        for static_graph in (False, True):
            seen = positions(static_graph)
            if rank == 0:
                out[str(static_graph)] = seen
    finally:
        dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=2)
    dynamic, static = out["False"], out["True"]
    print(f"static_graph=False: (index, is_last) per iteration {dynamic}")
    print(f"static_graph=True:  (index, is_last) per iteration {static}")
    defect = wrong(static[0]) and not any(wrong(it) for it in dynamic)
    print("torch's static graph reports a wrong bucket position in its first iteration"
          if defect else "positions as expected")
    return 1 if defect else 0


if __name__ == "__main__":
    sys.exit(main())
