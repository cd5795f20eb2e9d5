"""torch 2.13's ``batched_powerSGD_hook`` raises ``AssertionError`` at its first compressed
step, on any backend and device.

Standalone (torch only, no harness)::

    python tests/standalone/batched_powersgd_hook.py

Two ranks on Gloo (CPU), a small MLP under ``DistributedDataParallel`` with
``batched_powerSGD_hook`` (``PowerSGDState(start_powerSGD_iter=2)``). The first two steps
are vanilla allreduces and pass. At the third, the hook builds its low-rank ``Q`` as a 2-D
``(side, rank)`` tensor (``create_low_rank_tensor``) and hands it to ``_orthogonalize``,
which since the batched orthogonalisation rewrite accepts only a 3-D batch of matrices
(``len(matrices.shape) == 3``) and raises a bare ``AssertionError`` otherwise. The
per-tensor ``powerSGD_hook`` stacks its matrices into 3-D batches and works. Prints one
line per hook (rank 0); exits 1 when the batched hook failed where the other worked.
"""
from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
from torch.nn.parallel import DistributedDataParallel


def train(hook_name: str) -> str:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                        start_powerSGD_iter=2)
    model.register_comm_hook(state, getattr(powerSGD_hook, hook_name))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        opt.zero_grad()
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * 10 + dist.get_rank()))
        try:
            model(x).sum().backward()
        except Exception as exc:  # noqa: BLE001 - the finding
            return f"{hook_name}: step {step} raised {type(exc).__name__}: {exc!s:.80}"
        opt.step()
    return f"{hook_name}: 4 steps trained"


def worker(rank: int, world_size: int, port: int, results: dict[str, str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    for name in ("powerSGD_hook", "batched_powerSGD_hook"):
        line = train(name)
        if rank == 0:
            results[name] = line
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
    return 1 if "raised" in lines["batched_powerSGD_hook"] and "trained" in lines["powerSGD_hook"] \
        else 0


if __name__ == "__main__":
    sys.exit(main())
