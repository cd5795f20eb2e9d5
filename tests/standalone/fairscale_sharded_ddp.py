"""fairscale's ShardedDataParallel: an exception inside ``no_sync()`` leaves reduction off,
the construction-time sync leaves non-persistent buffers per rank, and gradients do not
accumulate across synced backwards.

Standalone (torch and fairscale, no harness)::

    python tests/standalone/fairscale_sharded_ddp.py

Two ranks on Gloo (CPU), fairscale 0.4.13, ``ShardedDataParallel(model, OSS(params, SGD))``.

1. ``no_sync`` is a generator context manager without ``try``/``finally``
   (``self._should_accumulate_grads = True; yield; ... = old``): when the body raises, the
   restore after ``yield`` never runs. The next backward outside the window should reduce
   each gradient to its owner (the mean over ranks, as DDP's); it only accumulates locally.
   ``DistributedDataParallel.no_sync`` restores in ``finally``.
2. ``sync_models_at_startup`` broadcasts ``module.state_dict()`` (``_sync_params_and_buffers``),
   which leaves out buffers registered with ``persistent=False``: a non-persistent buffer
   that differs per rank stays different after construction. DDP's construction broadcasts
   every buffer of ``module.named_buffers()``.
3. Two synced backwards before one step (gradient accumulation without ``no_sync``): DDP
   reduces each backward's gradient and accumulates, so ``.grad`` is the sum of the two
   means over ranks (1.5 + 11.5 = 13 here). ShardedDDP scales each rank's gradient by
   1/world_size in place and reduces it to its owner rank, so the second backward reduces
   the owner's already-reduced mean again, divided by the world size once more. With
   gradient buckets (the default ``reduce_buffer_size``) the other ranks also keep their
   scaled local gradient in the bucket, and it is summed in again: the owner ends with
   (1.5 + 11 + 2 / 2 + 12) / 2 = 12.75. Without buckets (``reduce_buffer_size=0``, or a
   parameter larger than the bucket) the other ranks drop theirs after the reduce, and
   the owner ends with 1.5 / 2 + 11.5 = 12.25. Accumulation inside ``no_sync()`` is right.

Prints one line per case (rank 0); exits 1 when ShardedDDP deviated from DDP.
"""
from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


class Net(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(4, 2)
        self.register_buffer("offset", torch.full((2,), float(rank)), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.offset


def wrapped(rank: int, sharded: bool, **options: int) -> nn.Module:
    """``ShardedDataParallel(Net, OSS(SGD), **options)``, or DDP over the same ``Net``."""
    if not sharded:
        return nn.parallel.DistributedDataParallel(Net(rank))
    from fairscale.nn.data_parallel import ShardedDataParallel
    from fairscale.optim import OSS

    module = Net(rank)
    oss = OSS(module.parameters(), optim=torch.optim.SGD, lr=0.1)
    return ShardedDataParallel(module, oss, **options)


def every_rank(mine: torch.Tensor) -> list[torch.Tensor]:
    """``mine`` as each rank holds it."""
    every = [torch.zeros_like(mine) for _ in range(WORLD)]
    dist.all_gather(every, mine)
    return every


def first_grad_per_rank(model: nn.Module) -> list[float]:
    """``fc.weight.grad[0, 0]`` on each rank (0 where it is None)."""
    grad = model.module.fc.weight.grad
    mine = torch.zeros(1) if grad is None else grad.detach().clone().flatten()[:1]
    return [float(v[0]) for v in every_rank(mine)]


def buffers_after_construction(rank: int, sharded: bool) -> str:
    every = every_rank(wrapped(rank, sharded).module.offset.clone())
    same = all(torch.equal(every[0], b) for b in every)
    return "equal on every rank" if same else f"differ: {[b.tolist() for b in every]}"


def grad_after_exception_in_no_sync(rank: int, sharded: bool) -> str:
    model = wrapped(rank, sharded)
    try:
        with model.no_sync():
            raise ValueError("raised inside no_sync")
    except ValueError:
        pass
    x = torch.full((3, 4), float(rank + 1))
    model(x).sum().backward()
    # The owner of fc.weight (rank 0 with OSS's greedy partition, by size) must hold the
    # mean over ranks of the local gradients: (1 + 2) / 2 * 3 = 4.5 in every element.
    return (f"fc.weight.grad[0, 0] per rank {first_grad_per_rank(model)} "
            f"(the mean over ranks is 4.5)")


def grad_after_two_synced_backwards(rank: int, sharded: bool, **options: int) -> str:
    model = wrapped(rank, sharded, **options)
    for base in (1.0, 11.0):  # local gradients rank + 1, then rank + 11: means 1.5, 11.5
        model(torch.full((1, 4), base + rank)).sum().backward()
    return (f"fc.weight.grad[0, 0] per rank {first_grad_per_rank(model)} "
            f"(the sum of the means is 13.0)")


def worker(rank: int, port: int, out: dict[str, str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    cases = [("non-persistent buffer, DDP", lambda: buffers_after_construction(rank, False)),
             ("non-persistent buffer, ShardedDDP", lambda: buffers_after_construction(rank, True)),
             ("exception in no_sync, DDP", lambda: grad_after_exception_in_no_sync(rank, False)),
             ("exception in no_sync, ShardedDDP",
              lambda: grad_after_exception_in_no_sync(rank, True)),
             ("two synced backwards, DDP", lambda: grad_after_two_synced_backwards(rank, False)),
             ("two synced backwards, ShardedDDP",
              lambda: grad_after_two_synced_backwards(rank, True)),
             ("two synced backwards, unbucketed",
              lambda: grad_after_two_synced_backwards(rank, True, reduce_buffer_size=0))]
    for name, run in cases:
        result = run()
        if rank == 0:
            out[name] = result
            print(f"{name:36s} {result}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=WORLD, join=True)
    buffers = out["non-persistent buffer, ShardedDDP"].startswith("differ")
    no_sync = "[4.5" not in out["exception in no_sync, ShardedDDP"]
    accumulate = any("[13.0" not in out[f"two synced backwards, {how}"]
                     for how in ("ShardedDDP", "unbucketed"))
    return 1 if buffers or no_sync or accumulate else 0


if __name__ == "__main__":
    sys.exit(main())
