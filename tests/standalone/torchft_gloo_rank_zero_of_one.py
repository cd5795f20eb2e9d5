"""torchft 0.2.0: ``torchft.process_group.ProcessGroupGloo`` builds its C++ ``ProcessGroup``
as ``ProcessGroup(0, 1)`` on every process (``ProcessGroupWrapper.__init__``), so torch
reads rank 0 and size 1 on every rank; only torchft's Python ``size()`` says the truth.

Standalone (torch and torchft only, no harness)::

    python tests/standalone/torchft_gloo_rank_zero_of_one.py

Two processes, one ``TCPStore`` (served by the parent); each builds ``ProcessGroupGloo()``
and ``configure``-s it with the store's ``host:port/prefix``, its rank and world size 2, as
torchft's ``Manager`` does, and then (1) prints what the group says of itself (``rank()``, ``size()``, and the
C++ answers through ``dist.ProcessGroup.rank/size``) and (2) wraps ``nn.Linear`` in torch's
own ``DistributedDataParallel(process_group=group)``. Prints one line per rank; exits 1
when rank 1's group says rank 0 (the defect), 0 otherwise.
"""
from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchft.process_group import ProcessGroupGloo

WORLD = 2


def run(rank: int, port: int, out: mp.Queue[str]) -> None:
    group = ProcessGroupGloo(timeout=timedelta(seconds=30))
    group.configure(f"127.0.0.1:{port}/standalone", "replica", rank, WORLD)
    said = (f"rank {rank}: rank() {group.rank()}, size() {group.size()}, C++ rank "
            f"{dist.ProcessGroup.rank(group)}, C++ size {dist.ProcessGroup.size(group)}")
    try:
        torch.manual_seed(0)
        DistributedDataParallel(nn.Linear(4, 1), process_group=group)
        said += "; DDP constructed"
    except Exception as exc:  # noqa: BLE001 - what torch's DDP says is the finding
        said += f"; DDP raised {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    out.put(said)


def main() -> int:
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))  # the ranks' store, served from here
    port = store.port
    ctx = mp.get_context("spawn")
    out: mp.Queue[str] = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, port, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    lines = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    print("\n".join(lines))
    return 1 if lines[1].startswith("rank 1: rank() 0") else 0


if __name__ == "__main__":
    sys.exit(main())
