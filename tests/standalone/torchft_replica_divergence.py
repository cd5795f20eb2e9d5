"""torchft 0.2.0's DDP on CPU: three ways replicas end up differing from DDP's result.

Standalone (torch and torchft only, no harness)::

    python tests/standalone/torchft_replica_divergence.py

Two replica groups of one process each on one machine, a lighthouse, a ``Manager`` per
replica (its own ``TCPStore``, ``use_async_quorum=False`` so that the step-0 heal is
applied before the forward), ``torchft.ddp.DistributedDataParallel(manager, model)`` and
``torchft.optim.OptimizerWrapper``, the loop of torchft's own ``ddp_train_loop``; identical
initial weights. One step each of:

1. **unused**: a layer ``extra`` used by rank 0 only. torchft builds torch's DDP over a
   one-rank ``ProcessGroupDummy`` and forces ``find_unused_parameters=True``; the
   reducer's "which parameters did any rank use" bitmap is all-reduced over that dummy
   group, so rank 1 judges ``extra`` globally unused and leaves its gradient ``None``
   while rank 0 gets the averaged gradient: after ``step()`` the replicas' ``extra``
   weights differ (torch's DDP gives both ranks the averaged gradient).
2. **heal**: a BatchNorm model. At step 0 rank 1 heals from rank 0 through the HTTP
   checkpoint transport, which keeps CPU tensors by reference (``_to_cpu`` copies only
   CUDA/XPU tensors), so rank 1 receives rank 0's buffers as they are when it reads
   them, after rank 0's own step-0 forward: rank 1's ``num_batches_tracked`` is 2 after
   its first forward (torch's DDP: 1). It is a race; on this machine rank 1 read late in
   every run.
3. **fp16**: float16 gradients near the top of the range. ``Manager.allreduce`` sums
   (``ReduceOp.SUM``) and divides afterwards, so two gradients of 40000 overflow to inf;
   torch's DDP divides each by the world size first and gets 40000.

Prints one line per case and rank; exits 1 when any of the three shows.
"""
from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2
TIMEOUT = timedelta(seconds=30)


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.extra = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        y = self.body(x)
        return self.extra(y) if use_extra else y


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


def build(case: str) -> nn.Module:
    torch.manual_seed(0)
    if case == "unused":
        return Branchy()
    if case == "heal":
        return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    return Scale()


def one_step(case: str, rank: int, ddp: nn.Module) -> None:
    gen = torch.Generator().manual_seed(rank)
    if case == "unused":
        ddp(torch.randn(3, 4, generator=gen), rank == 0).sum().backward()
    elif case == "heal":
        ddp(torch.randn(3, 4, generator=gen)).sum().backward()
    else:  # d(sum(w * x))/dw = x: each rank's gradient is 40000
        ddp(torch.full((4,), 40000.0, dtype=torch.float16)).sum().backward()


def report(case: str, rank: int, module: nn.Module) -> tuple[str, bool]:
    """A line, and whether it shows the defect."""
    if case == "unused":
        grad = module.extra.weight.grad
        total = module.extra.weight.detach().double().sum().item()
        return (f"unused: rank {rank}: extra.weight.grad is {'None' if grad is None else 'a tensor'}, "
                f"sum(extra.weight) after step = {total:.6f}", grad is None)
    if case == "heal":
        tracked = int(module[1].num_batches_tracked.item())
        return f"heal: rank {rank}: num_batches_tracked after step 0 = {tracked} (DDP: 1)", tracked != 1
    grad = module.w.grad
    assert grad is not None
    return (f"fp16: rank {rank}: reduced gradient {grad.tolist()} (DDP: 40000.0 each)",
            not bool(torch.isfinite(grad).all()))


def replica(case: str, rank: int, lighthouse: str, out: mp.Queue[tuple[str, bool]]) -> None:
    from torchft.ddp import DistributedDataParallel
    from torchft.manager import Manager
    from torchft.optim import OptimizerWrapper
    from torchft.process_group import ProcessGroupGloo

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    module = build(case)
    ddp: nn.Module = nn.Module()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)

    def load(state: dict) -> None:
        ddp.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optim"])

    def save() -> dict:
        return {"model": ddp.state_dict(), "optim": optimizer.state_dict()}

    manager = Manager(pg=ProcessGroupGloo(timeout=TIMEOUT), load_state_dict=load, state_dict=save,
                      min_replica_size=WORLD, timeout=TIMEOUT, quorum_timeout=TIMEOUT,
                      connect_timeout=TIMEOUT, rank=0, world_size=1, store_addr="127.0.0.1",
                      store_port=store.port, lighthouse_addr=lighthouse,
                      replica_id=f"replica_{rank}", hostname="localhost", use_async_quorum=False)
    try:
        ddp = DistributedDataParallel(manager, module)
        wrapped = OptimizerWrapper(manager, optimizer)
        wrapped.zero_grad()
        one_step(case, rank, ddp)
        wrapped.step()
        out.put(report(case, rank, module))
    finally:
        manager.shutdown(wait=False)


def run(case: str) -> list[tuple[str, bool]]:
    from torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=WORLD, join_timeout_ms=10_000)
    ctx = mp.get_context("spawn")
    out: mp.Queue[tuple[str, bool]] = ctx.Queue()
    procs = [ctx.Process(target=replica, args=(case, r, lighthouse.address(), out))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    try:
        return sorted(out.get(timeout=120) for _ in range(WORLD))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
        lighthouse.shutdown()


def main() -> int:
    shown = False
    for case in ("unused", "heal", "fp16"):
        for line, defect in run(case):
            print(line)
            shown = shown or defect
    return 1 if shown else 0


if __name__ == "__main__":
    sys.exit(main())
