"""torch 2.13's quantization comm hooks fail on Gloo at their first step.

Standalone (torch only, no harness)::

    python tests/standalone/quantization_hooks_gloo.py

Two ranks on Gloo (CPU), a small MLP under ``DistributedDataParallel`` with
``quantization_pertensor_hook`` and then ``quantization_perchannel_hook``
(``torch.distributed.algorithms.ddp_comm_hooks.quantization_hooks``). Each hook quantizes
the bucket, all-gathers it with ``dist.all_gather(..., async_op=True).get_future()`` and
dequantizes in the future's callback by indexing ``fut.wait()[0]`` per rank. On Gloo that
future's value is laid out differently from NCCL's, and the callback raises ``IndexError``
("invalid index of a 0-dim tensor" per tensor, "too many indices" per channel), which the
backward re-raises as a ``RuntimeError``. torch's own tests run these hooks on NCCL only.
``allreduce_hook`` on the same model trains. Prints one line per hook (rank 0); exits 1 when
both quantization hooks failed where the allreduce hook trained.
"""
from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, quantization_hooks
from torch.nn.parallel import DistributedDataParallel

HOOKS = {
    "allreduce_hook": default_hooks.allreduce_hook,
    "quantization_pertensor_hook": quantization_hooks.quantization_pertensor_hook,
    "quantization_perchannel_hook": quantization_hooks.quantization_perchannel_hook,
}


def train(name: str) -> str:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)))
    model.register_comm_hook(None, HOOKS[name])
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(dist.get_rank()))
    try:
        model(x).sum().backward()
    except Exception as exc:  # noqa: BLE001 - the finding
        cause = next((line.strip() for line in str(exc).splitlines() if "IndexError" in line),
                     str(exc).splitlines()[0])
        return f"{name}: raised {type(exc).__name__}: {cause[:140]}"
    return f"{name}: trained"


def worker(rank: int, world_size: int, port: int, results: dict[str, str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    for name in HOOKS:
        line = train(name)
        if rank == 0:
            results[name] = line
        dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(2, port, results), nprocs=2)
        lines = dict(results)
    for line in lines.values():
        print(line)
    failed = all("raised" in lines[n] for n in HOOKS if n.startswith("quantization"))
    return 1 if failed and lines["allreduce_hook"].endswith("trained") else 0


if __name__ == "__main__":
    sys.exit(main())
