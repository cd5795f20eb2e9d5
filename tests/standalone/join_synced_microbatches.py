"""Under ``Join`` with ``divide_by_initial_world_size=True`` (the default), torch 2.13's DDP
weighs the samples of a step's earlier synced backwards less than those of its last one,
once a rank has joined: contrary to what the option promises.

Standalone (torch only, no harness)::

    python tests/standalone/join_synced_microbatches.py

torch's documentation of ``DistributedDataParallel.join``: "Set
divide_by_initial_world_size=True to ensure every input sample including the uneven
inputs have equal weight in terms of how much they contribute to the global gradient.
This is achieved by always dividing the gradient by the initial world_size even when we
encounter uneven inputs."

Two ranks on Gloo (CPU), ``nn.Linear(4, 2, bias=False)`` under DDP; rank 0 has two
steps of inputs, rank 1 one, so rank 1 joins after step 0. Every step runs two
microbatches, each with its own forward and a synced backward (no ``no_sync``): DDP's
second backward reduces the accumulated gradient (the first microbatch's already reduced
average plus the second's local gradient). At step 1, only rank 0 trains; its local
gradients are ``g1`` and ``g2``. Equal weight for every sample, divided by the initial
world size 2, is ``(g1 + g2) / 2``. torch gives ``g1 / 4 + g2 / 2``: the joined rank
shadows the second reduction with zeros where, active, it would have contributed its
copy of the first microbatch's average, so that average is halved once more. With
``divide_by_initial_world_size=False`` (divisor: the one active rank) the re-reduction
keeps it, and torch gives ``g1 + g2``, as documented. Without Join, two active ranks give
the average of every sample, as documented.

The data are small integers, so every sum is exact and the comparisons are bitwise.
Prints one line per case (rank 0); exits 1 when the default case weighs the first
microbatch as ``g1 / 4`` while the others match their documented values.
"""
from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

#: (rank, step, microbatch) -> the input row; target 0, loss sum((w x)^2) / 2: grad w x x^T.
STEPS = {0: 2, 1: 1}


def sample(rank: int, step: int, microbatch: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 * rank + 10 * step + microbatch)
    return torch.randint(-2, 3, (1, 4), generator=gen).float()


def local_grad(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """d/dw of sum((x w^T)^2) / 2: the gradient one rank's backward computes alone."""
    return (x @ weight.T).T @ x


def train(divide: bool, join: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank 0's reduced gradient at its last step, and its local g1, g2 there."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 2, bias=False))
    with torch.no_grad():
        model.module.weight.copy_(torch.tensor([[1.0, -1.0, 2.0, 0.0], [0.0, 1.0, -2.0, 1.0]]))
    steps = STEPS[rank] if join else 2
    grad = g1 = g2 = torch.zeros(2, 4)
    context = model.join(divide_by_initial_world_size=divide) if join else _Null()
    with context:
        for step in range(steps):
            model.zero_grad(set_to_none=True)
            weight = model.module.weight.detach().clone()
            for mb in range(2):
                x = sample(rank, step, mb)
                (model(x) ** 2).sum().div(2).backward()
            g1, g2 = local_grad(weight, sample(rank, step, 0)), local_grad(weight, sample(rank, step, 1))
            grad = model.module.weight.grad.clone()
            # no optimizer step: the weight stays, so the local gradients are easy to state
    return grad, g1, g2


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def worker(rank: int, world_size: int, port: int, results: dict[str, str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    cases = {"join, divide_by_initial_world_size=True": (True, True),
             "join, divide_by_initial_world_size=False": (False, True),
             "no join, both ranks active": (True, False)}
    for name, (divide, join) in cases.items():
        grad, g1, g2 = train(divide, join)
        if rank != 0:
            continue
        if not join:
            other = [local_grad(torch.tensor([[1.0, -1.0, 2.0, 0.0], [0.0, 1.0, -2.0, 1.0]]),
                                sample(1, 1, mb)) for mb in range(2)]
            documented = (g1 + g2 + other[0] + other[1]) / 2
        else:
            documented = (g1 + g2) / 2 if divide else g1 + g2
        verdict = "as documented" if torch.equal(grad, documented) else (
            "g1/4 + g2/2" if torch.equal(grad, g1 / 4 + g2 / 2) else "neither")
        results[name] = f"{name}: {verdict}"
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(2, port, results), nprocs=2)
        lines = dict(results)
    for line in lines.values():
        print(line)
    found = lines["join, divide_by_initial_world_size=True"].endswith("g1/4 + g2/2")
    others = all(v.endswith("as documented") for k, v in lines.items()
                 if not k.endswith("=True"))
    return 1 if found and others else 0


if __name__ == "__main__":
    sys.exit(main())
