"""torch.compile(DistributedDataParallel) on a c10d backend written in Python: dynamo hard-errors.

Standalone (torch only, no harness). Run from anywhere::

    python tests/standalone/compile_python_backend.py      # or: torchrun --nproc-per-node 2 ...

Two ranks; the process group is a minimal Python ``dist.ProcessGroup`` subclass that
forwards ``allreduce``/``broadcast``/``allgather``/``barrier`` to Gloo (what a c10d backend
author writes, e.g. a tracing or a new-hardware backend). A two-layer MLP is wrapped in
``DistributedDataParallel`` and compiled with ``torch.compile(ddp, backend="aot_eager")``.
Eager DDP trains on this backend; compiled DDP raises at the second forward, when DDP's
C++ reducer broadcasts its rebuilt bucket layout from ``_pre_forward``: dynamo compiles the
backend's Python ``broadcast`` (called from C++ inside the compiled call) and raises
``InternalTorchDynamoError`` (here "ProcessGroup name not set"; on the harness's tracing
group, "UnsafeScriptObjectError: Attempted to access unregistered member on an
OpaqueObject"), a hard error rather than a graph break or a fallback to eager. On plain
Gloo the same compiled script trains.
Prints one line per case and exits 1 when compiled DDP failed on the Python backend.
"""
from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions, BarrierOptions, BroadcastOptions
from torch.distributed import Work
from torch.nn.parallel import DistributedDataParallel

WORLD = 2


class ForwardingProcessGroup(dist.ProcessGroup):
    """A Python process group that forwards each collective to a Gloo backend."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self.gloo: Any = dist.ProcessGroupGloo(store, rank, size, timeout)

    def getBackendName(self) -> str:
        return "python_forwarding"

    def allreduce(self, tensors: list[Tensor], opts: AllreduceOptions) -> Work:  # type: ignore[override]
        return self.gloo.allreduce(tensors, opts)

    def broadcast(self, tensors: list[Tensor], opts: BroadcastOptions) -> Work:  # type: ignore[override]
        return self.gloo.broadcast(tensors, opts)

    def allgather(self, outputs: list[list[Tensor]], inputs: list[Tensor],  # type: ignore[override]
                  opts: AllgatherOptions) -> Work:
        return self.gloo.allgather(outputs, inputs, opts)

    def barrier(self, opts: BarrierOptions) -> Work:  # type: ignore[override]
        return self.gloo.barrier(opts)


dist.Backend.register_backend("python_forwarding", ForwardingProcessGroup, devices=["cpu"])


def train(backend: str, compiled: bool) -> str:
    torch.manual_seed(0)
    group = dist.new_group(backend=backend)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = DistributedDataParallel(model, process_group=group)
    run = torch.compile(ddp, backend="aot_eager") if compiled else ddp
    torch._dynamo.reset()
    try:
        for step in range(3):
            torch.manual_seed(100 * step + dist.get_rank())
            run(torch.randn(4, 8)).square().sum().backward()
        return "ok"
    except Exception as exc:  # noqa: BLE001 - the point is to show what is raised
        text = str(exc)
        where = text.split("from user code:")[-1].strip().splitlines()[0] if "from user code:" in text else ""
        return f"FAIL at step {step}: {type(exc).__name__}: {text.splitlines()[0]} ({where.strip()})"


def main(rank: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    failed = False
    for backend in ("gloo", "python_forwarding"):
        for compiled in (False, True):
            line = train(backend, compiled)
            failed |= line != "ok" and backend == "python_forwarding" and compiled
            if rank == 0:
                mode = "torch.compile(DDP)" if compiled else "eager DDP        "
                print(f"{backend:18} {mode}: {line}", flush=True)
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
