"""torch's DDP under ``Join`` fails on a joined rank when the model has a sparse gradient:
``RuntimeError: Expected a proper Tensor but got None (or an undefined Tensor in C++)``.

Standalone (torch only, no harness)::

    python tests/standalone/join_sparse_gradients.py

Three ranks on Gloo (CPU) train ``nn.Embedding(sparse=True)`` and a Linear head under
``DistributedDataParallel`` inside ``Join([ddp])`` with uneven inputs: rank r runs 3 - r
steps, so rank 2 joins after one step and shadows the others' reductions. The same loop
with a dense embedding runs to the end on every rank. Prints each run's outcome (rank 0
gathers what every rank raised); exits 1 when the sparse run raises on a joined rank while
the dense run does not.
"""
from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

WORLD = 3


def train(sparse: bool) -> str:
    """'' when the rank finished, else what it raised."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 4, sparse=sparse), nn.Flatten(), nn.Linear(8, 2))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    rank = dist.get_rank()
    try:
        with Join([ddp]):
            for step in range(3 - rank):
                gen = torch.Generator().manual_seed(10 * step + rank)
                opt.zero_grad()
                ddp(torch.randint(0, 16, (4, 2), generator=gen)).pow(2).mean().backward()
                opt.step()
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return ""


def worker(rank: int, port: int, out: dict[str, object]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    try:
        out[f"dense{rank}"] = train(sparse=False)
        out[f"sparse{rank}"] = train(sparse=True)
    finally:
        dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    try:
        mp.spawn(worker, args=(port, out), nprocs=WORLD)
    except Exception as exc:  # noqa: BLE001 - a rank that died still leaves its peers' words
        print(f"a rank died: {type(exc).__name__}")
    for kind in ("dense", "sparse"):
        errors = {r: out.get(f"{kind}{r}", "(no answer)") for r in range(WORLD)}
        print(f"{kind}: " + "; ".join(f"rank {r}: {e or 'finished'}" for r, e in errors.items()))
    sparse_failed = any(out.get(f"sparse{r}", "(no answer)") for r in range(WORLD))
    dense_failed = any(out.get(f"dense{r}", "(no answer)") for r in range(WORLD))
    defect = sparse_failed and not dense_failed
    print("torch's Join fails on a joined rank with sparse gradients" if defect
          else "no difference")
    return 1 if defect else 0


if __name__ == "__main__":
    sys.exit(main())
