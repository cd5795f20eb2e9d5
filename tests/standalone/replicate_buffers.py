"""torch's composable ``replicate`` never broadcasts the module's buffers.

Standalone (torch only, no harness)::

    python tests/standalone/replicate_buffers.py

Two ranks on Gloo (CPU). A conv + BatchNorm model whose BatchNorm running statistics differ
per rank (``running_mean`` filled with the rank) is wrapped with ``broadcast_buffers=True``
by ``DistributedDataParallel`` and by ``torch.distributed._composable.replicate``, then run
one forward (in eval mode, so the forward itself leaves the statistics alone).

DDP broadcasts rank 0's buffers at construction and before each forward: every rank then
holds rank 0's statistics. ``replicate`` builds its ``DistributedDataParallel`` over an
``nn.ParameterList`` of the module's parameters (``_ReplicateState.init``:
``DistributedDataParallel(self._param_list, **kwargs)``), which has no buffers, so neither
the construction-time broadcast nor the per-forward buffer sync sends any:
``broadcast_buffers`` is accepted and has no effect, and the ranks' statistics (and so their
outputs) stay different.

Prints one line per wrapper (from rank 0); exits 1 when ``replicate`` left the buffers
different where DDP made them equal.
"""
from __future__ import annotations

import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
TIMEOUT = timedelta(seconds=30)  # every collective and store wait gives up after this


def model(rank: int) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    net[1].running_mean.fill_(float(rank))  # type: ignore[operator]
    return net


def wrap(name: str, rank: int) -> nn.Module:
    if name == "DDP":
        return nn.parallel.DistributedDataParallel(model(rank), broadcast_buffers=True)
    from torch.distributed._composable import replicate

    return replicate(model(rank), broadcast_buffers=True)


def running_means_after_forward(name: str, rank: int) -> str:
    net = wrap(name, rank)
    net.eval()
    net(torch.ones(1, 3, 5, 5))  # replicate builds its DDP here, at the first forward
    inner = net.module if name == "DDP" else net
    mine = inner[1].running_mean.detach().clone()  # type: ignore[index, union-attr]
    every = [torch.zeros_like(mine) for _ in range(WORLD)]
    dist.all_gather(every, mine)
    if all(torch.equal(every[0], b) for b in every):
        return f"equal on every rank (rank 0's, running_mean[0] = {float(every[0][0])})"
    return f"differ: running_mean[0] per rank {[float(b[0]) for b in every]}"


def run(rank: int, port: int, out: mp.Queue[str]) -> None:
    warnings.simplefilter("ignore", FutureWarning)  # torch 2.13 deprecates broadcast_buffers
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD, timeout=TIMEOUT)
    for name in ("DDP", "replicate"):
        line = running_means_after_forward(name, rank)
        if rank == 0:
            out.put(f"{name:10s} broadcast_buffers=True, after one forward: {line}")
    dist.destroy_process_group()


def main() -> int:
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                          timeout=TIMEOUT)  # the ranks' store, served from here
    ctx = mp.get_context("spawn")
    out: mp.Queue[str] = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, store.port, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    lines = [out.get(timeout=120) for _ in range(2)]
    for p in procs:
        p.join(timeout=60)
    print("\n".join(lines))
    ddp_equal = "equal" in lines[0]
    replicate_differs = "differ" in lines[1]
    return 1 if ddp_equal and replicate_differs else 0


if __name__ == "__main__":
    sys.exit(main())
