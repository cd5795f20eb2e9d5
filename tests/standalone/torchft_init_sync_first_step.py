"""torchft 0.2.0: with ``init_sync`` (its default) and the default asynchronous quorum, the
first step's reduced gradient is the primary replica's gradient divided by the number of
replicas: the healing replicas' gradients are replaced by zeros, yet still counted.

Standalone (torch and torchft only, no harness)::

    python tests/standalone/torchft_init_sync_first_step.py

Two replica groups of one process each on one machine, a lighthouse, a ``Manager`` per
replica (its own ``TCPStore``), ``torchft.ddp.DistributedDataParallel(manager,
nn.Linear(4, 1))`` with identical initial weights (seeded alike) and
``torchft.optim.OptimizerWrapper``, the loop of torchft's own ``ddp_train_loop``: three
steps, each rank on its own batch. Each rank compares the gradient DDP left with the mean
of both ranks' local gradients (computed here by plain autograd). At step 0 the Rust
quorum (``compute_quorum_results``: ``force_recover = init_sync && max_step == 0``) makes
every replica but the primary heal, while every replica is at the max step, so
``max_world_size`` (the divisor, ``num_participants()``) counts them all; in Python a
healing replica is not participating (``Manager.is_participating`` is False while
``_healing``), so ``Manager.allreduce`` zeroes its tensor before the sum. Rank 0 and rank 1
both end up with ``g0 / 2`` where DDP gives ``(g0 + g1) / 2``; later steps are right.
The same loop with ``Manager(use_async_quorum=False)`` (the heal is applied in
``start_quorum``, before the forward, and the healed replica then takes part) gives the
mean at every step. Prints one line per mode, rank and step; exits 1 when the default
(asynchronous) mode's step-0 gradient is ``g0 / world`` while the synchronous mode's
gradients are all the mean.
"""
from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
STEPS = 3
TIMEOUT = timedelta(seconds=30)


def data(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 4, generator=gen), torch.randn(8, 1, generator=gen)


def local_grad(model: nn.Module, rank: int, step: int) -> torch.Tensor:
    """This rank's gradient of ``model.weight`` on its own batch (no communication)."""
    copy = nn.Linear(4, 1)
    copy.load_state_dict(model.state_dict())
    x, y = data(rank, step)
    nn.functional.mse_loss(copy(x), y).backward()
    assert copy.weight.grad is not None
    return copy.weight.grad


def replica(rank: int, lighthouse: str, use_async_quorum: bool, out: mp.Queue[str]) -> None:
    from torchft.ddp import DistributedDataParallel
    from torchft.manager import Manager
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    torch.manual_seed(0)
    module = nn.Linear(4, 1)
    ddp: nn.Module = nn.Module()
    optimizer: torch.optim.Optimizer = torch.optim.SGD(module.parameters(), lr=0.1)

    def load(state: dict) -> None:
        ddp.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def save() -> dict:
        return {"model": ddp.state_dict(), "optim": optimizer.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(timeout=TIMEOUT), load_state_dict=load, state_dict=save,
                      min_replica_size=WORLD, timeout=TIMEOUT, quorum_timeout=TIMEOUT,
                      connect_timeout=TIMEOUT, rank=0, world_size=1, store_addr="127.0.0.1",
                      store_port=store.port, lighthouse_addr=lighthouse,
                      replica_id=f"replica_{rank}", hostname="localhost",
                      use_async_quorum=use_async_quorum)
    try:
        ddp = DistributedDataParallel(manager, module)
        wrapped = OptimizerWrapper(manager, optimizer)
        for step in range(STEPS):
            wrapped.zero_grad()
            x, y = data(rank, step)
            nn.functional.mse_loss(ddp(x), y).backward()
            mean = sum(local_grad(module, r, step) for r in range(WORLD)) / WORLD
            got = module.weight.grad
            assert got is not None
            primary_only = local_grad(module, 0, step) / WORLD
            verdict = ("mean (DDP)" if torch.allclose(got, mean, atol=1e-6) else
                       "g0 / world" if torch.allclose(got, primary_only, atol=1e-6) else "other")
            out.put(f"use_async_quorum={use_async_quorum} rank {rank} step {step}: gradient is {verdict}; "
                    f"max |got - mean| = {(got - mean).abs().max().item():.3g}")
            wrapped.step()
    finally:
        manager.shutdown(wait=False)


def run(use_async_quorum: bool) -> list[str]:
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=WORLD, join_timeout_ms=10_000)
    ctx = mp.get_context("spawn")
    out: mp.Queue[str] = ctx.Queue()
    procs = [ctx.Process(target=replica, args=(r, lighthouse.address(), use_async_quorum, out))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    lines = []
    try:
        for _ in range(WORLD * STEPS):
            lines.append(out.get(timeout=120))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        lighthouse.shutdown()
    return sorted(lines)


def main() -> int:
    lines = run(use_async_quorum=True) + run(use_async_quorum=False)
    for line in lines:
        print(line)
    async_wrong = any(line.startswith("use_async_quorum=True") and "step 0: gradient is g0 / world"
                      in line for line in lines)
    sync_right = all("mean (DDP)" in line for line in lines if line.startswith("use_async_quorum=False"))
    return 1 if async_wrong and sync_right else 0


if __name__ == "__main__":
    sys.exit(main())
