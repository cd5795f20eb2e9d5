"""torch.compile(DistributedDataParallel(nn.Sequential(...))) compiles nothing (torch 2.13).

Standalone (torch only, no harness). Run from anywhere::

    python tests/standalone/compile_ddp_sequential.py      # or: torchrun --nproc-per-node 2 ...

Two Gloo ranks compile the same eight ``nn.Linear(512, 512)`` layers with a backend that
counts the FX graphs it is given, four ways: the ``nn.Sequential`` alone, the
``nn.Sequential`` inside ``DistributedDataParallel(bucket_cap_mb=1)``, and the same two
with the ``nn.Sequential`` held by a one-line user-defined module. Compiled alone, each is
one graph. Under DDP, the user-defined module is compiled and split by the DDP optimizer
into one graph per 1 MiB bucket (eight), but the bare ``nn.Sequential`` is not compiled at
all: dynamo inlines DDP's ``forward``, breaks the graph at ``_inside_ddp_forward`` (marked
skip), and the module call that follows runs as a new top-level frame of ``torch.nn``,
which dynamo skips, so training runs entirely eagerly, silently
(pytorch/pytorch#140416, open). Prints one line per case (rank 0); exits 1 when the
DDP-wrapped ``nn.Sequential`` compiled no graph.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

WORLD = 2


class Holder(nn.Module):
    """A user-defined module around the ``nn.Sequential``: its forward is user code."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x)


def graphs_compiled(held: bool, ddp: bool) -> list[int]:
    """Compile and train two steps; the number of ops of each graph the backend was given."""
    torch._dynamo.reset()
    graphs: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        graphs.append(sum(n.op in ("call_function", "call_module", "call_method")
                          for n in gm.graph.nodes))
        return gm.forward

    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(*[nn.Linear(512, 512) for _ in range(8)])
    if held:
        model = Holder(model)
    if ddp:
        model = DistributedDataParallel(model, bucket_cap_mb=1)
    compiled = torch.compile(model, backend=counting)
    for _ in range(2):
        compiled(torch.randn(4, 512)).sum().backward()
    return graphs


def main(rank: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29521")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results = {(held, ddp): graphs_compiled(held, ddp)
               for held in (False, True) for ddp in (False, True)}
    if rank == 0:
        for (held, ddp), graphs in results.items():
            what = "Holder(nn.Sequential)" if held else "nn.Sequential"
            what = f"DistributedDataParallel({what})" if ddp else what
            print(f"torch.compile({what}): {len(graphs)} graph(s), ops per graph {graphs}",
                  flush=True)
    dist.destroy_process_group()
    if rank == 0 and not results[(False, True)]:
        sys.exit(1)


if __name__ == "__main__":
    if "RANK" in os.environ:  # under torchrun
        main(int(os.environ["RANK"]))
    else:
        try:
            mp.spawn(main, nprocs=WORLD)
        except mp.ProcessExitedException:
            sys.exit(1)
