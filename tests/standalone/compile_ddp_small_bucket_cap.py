"""torch.compile(DistributedDataParallel) refuses ``bucket_cap_mb`` below 1 MiB (torch 2.13).

Standalone (torch only, no harness). Run from anywhere::

    python tests/standalone/compile_ddp_small_bucket_cap.py    # or: torchrun --nproc-per-node 2 ...

Two Gloo ranks train the same MLP under ``DistributedDataParallel(bucket_cap_mb=CAP)``,
eager and compiled (``torch.compile(ddp, backend="aot_eager")``, the default
``optimize_ddp=True``, i.e. the DDP optimizer), for caps of 25 (the default), 1, 0.5 and
0.001 MiB. Eager DDP trains with every cap. Compiled DDP raises at the first forward for
every cap below 1 MiB: dynamo builds its ``DDPOptimizer`` with the DDP module's
``bucket_bytes_cap`` but not DDP's first-bucket cap, so the optimizer's first bucket is
``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) and it asserts "First bucket
should be smaller/equal to other buckets to get comms warmed up ASAP". (Eager DDP makes
its first bucket the user's cap when ``bucket_cap_mb`` is given.) Prints one line per
case; exits 1 when compiled DDP failed where eager DDP trained.
"""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

WORLD = 2
CAPS = (25.0, 1.0, 0.5, 0.001)


def train(cap: float, compiled: bool) -> str:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = DistributedDataParallel(model, bucket_cap_mb=cap)
    run = torch.compile(ddp, backend="aot_eager") if compiled else ddp
    try:
        for step in range(2):
            torch.manual_seed(100 * step + dist.get_rank())
            run(torch.randn(4, 8)).square().sum().backward()
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the point is to show what is raised
        return f"FAIL at step {step}: {type(exc).__name__}: {str(exc).splitlines()[0]}"


def main(rank: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29518")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    failed = False
    for cap in CAPS:
        eager, compiled = train(cap, False), train(cap, True)
        failed |= eager == "ok" and compiled != "ok"
        if rank == 0:
            print(f"bucket_cap_mb={cap:<6} eager DDP: {eager:3}  torch.compile(DDP): {compiled}",
                  flush=True)
    dist.destroy_process_group()
    if failed and rank == 0:
        sys.exit(1)


if __name__ == "__main__":
    if "RANK" in os.environ:  # under torchrun
        main(int(os.environ["RANK"]))
    else:
        try:
            mp.spawn(main, nprocs=WORLD)
        except mp.ProcessExitedException:
            sys.exit(1)
