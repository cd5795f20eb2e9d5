"""FSDP1 NO_SHARD all-reduces its whole flat gradient again per reentrant checkpoint.

Standalone (torch only, no harness)::

    python tests/standalone/fsdp1_no_shard_reentrant_reduces_twice.py

Two ranks on Gloo (CPU). A model of two blocks, each run as
``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)``, and a head, is
wrapped in one ``FullyShardedDataParallel(..., NO_SHARD)`` unit (all parameters in one
``FlatParameter``) and trained one forward and backward on per-rank batches.
``torch.distributed.all_reduce`` is wrapped to count the calls and to keep a copy of the
tensor each call is handed.

Reentrant checkpointing runs each block's recomputed forward and backward in a nested
``torch.autograd.backward``. The ``FlatParameter``'s ``AccumulateGrad``, where FSDP1 hooks
its post-backward, runs once in the outer backward and again at the end of each nested
backward (three times here); torch 2.13 permits that on purpose ("the post-backward
hook may run multiple times in one backward", ``_runtime_utils._post_backward_hook``).
Under NO_SHARD each run all-reduces ``flat_param.grad`` in place
(``_reduce_grad_no_shard``), so one backward all-reduces the whole flat gradient once
per run, and each later call sums again the elements an earlier call already averaged
(bitwise the same on every rank, printed below) beside the new block's local gradient.
The averaged values stay right (averaging equal values returns them, up to rounding of
the pre- and post-division); the traffic is several times DDP's one reduction of every
gradient element, which DDP's reducer enforces ("Expected to mark a variable ready only
once").

Prints (rank 0) the all-reduce calls of one backward with their sizes, how many elements
of each later call held, bitwise equal on both ranks, values an earlier call had left,
and the largest difference of the gradient from DDP's. Exits 1 when the flat gradient is
all-reduced more than once in one backward.
"""
from __future__ import annotations

import socket
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

WORLD = 2
WIDTH = 8


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                                    for _ in range(2))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return self.head(x)


def backward(wrapped: nn.Module, x: torch.Tensor) -> None:
    x = x.clone().requires_grad_(True)  # reentrant checkpointing needs an input with grad
    wrapped(x).square().mean().backward()


def worker(rank: int, port: int, out: Any) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    torch.manual_seed(1 + rank)
    x = torch.randn(4, WIDTH)
    torch.manual_seed(0)
    model = Model()
    ddp = DistributedDataParallel(model)
    backward(ddp, x)
    ref = torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    torch.manual_seed(0)
    fsdp = FSDP(Model(), sharding_strategy=ShardingStrategy.NO_SHARD,
                device_id=torch.device("cpu"))
    before: list[torch.Tensor] = []  # what each all_reduce was handed
    after: list[torch.Tensor] = []  # what it left
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        before.append(tensor.detach().clone())
        work = real_all_reduce(tensor, *args, **kwargs)
        after.append(tensor.detach().clone())
        return work

    dist.all_reduce = counting_all_reduce  # type: ignore[assignment]
    try:
        backward(fsdp, x)
    finally:
        dist.all_reduce = real_all_reduce
    flat = next(fsdp.parameters())
    assert flat.grad is not None
    got = flat.grad.detach().reshape(-1)[:ref.numel()]  # the flat gradient, parameters' order
    numel = ref.numel()
    lines = [f"model: {numel} gradient elements; one FSDP NO_SHARD unit, "
             f"{len(before)} all_reduce call(s) in one backward"]
    # FSDP divides the gradient by this before the all_reduce (2 for 2 ranks: exact)
    pre = float(fsdp._gradient_predivide_factor)
    for i, handed in enumerate(before):
        # elements handed to call i that an earlier call had left, unchanged since
        stale = torch.zeros(handed.numel(), dtype=torch.bool)
        for j in range(i):
            if after[j].numel() == handed.numel():
                stale |= (handed == after[j] / pre) & (after[j] != 0)
        mine = stale.to(torch.int64)
        theirs = [torch.zeros_like(mine) for _ in range(WORLD)]
        dist.all_gather(theirs, mine)  # stale on every rank
        equal = [torch.zeros_like(handed) for _ in range(WORLD)]
        dist.all_gather(equal, handed)  # and bitwise the same values on every rank
        same = torch.stack([t.bool() for t in theirs]).all(0) & (equal[0] == equal[1])
        lines.append(f"  call {i}: {handed.numel()} elements, {int(same.sum())} of them "
                     f"values an earlier call had already reduced (same on every rank)")
    lines.append(f"max |gradient - DDP's| {float((got - ref).abs().max()):.3g}")
    if rank == 0:
        print("\n".join(lines), flush=True)
        out["calls"] = sum(1 for t in before if t.numel() >= numel)
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=WORLD, join=True)
    return 1 if out.get("calls", 0) > 1 else 0


if __name__ == "__main__":
    sys.exit(main())
