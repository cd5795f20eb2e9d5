"""torch 2.13: ``DistributedDataParallel(find_unused_parameters=True)`` under ``Join`` with
uneven inputs cannot run on any process group written in Python (a ``dist.ProcessGroup``
subclass, the way c10d backends such as torchft's are written): the joined rank's hook,
``DistributedDataParallel._match_unused_params_allreduce``, calls
``self.process_group.allreduce(tensor)``, the pybind convenience overload
``allreduce(tensor, op=SUM)`` of the C++ class. A Python subclass implements the virtual
``allreduce(tensors, opts)`` that every other caller (c10d, the reducer) uses, and that
override hides the overload: ``TypeError: ... missing 1 required positional argument:
'opts'``. torchft 0.2.0's ``ProcessGroupWrapper.allreduce(tensors, opts)`` meets the same
line.

Standalone (torch only, no harness)::

    python tests/standalone/ddp_join_python_process_group.py

Two processes; each registers ``ForwardingGroup`` as the c10d backend ``forwarding`` (a
``dist.ProcessGroup`` subclass with the true rank and size, forwarding ``allreduce``,
``broadcast`` and ``allgather`` to a real Gloo group), initialises it, then runs DDP with
``find_unused_parameters=True`` under ``Join``, rank 0 on one batch and rank 1 on two. The
same loop on ``gloo`` completes. Prints one line per rank and backend; exits 1 when the
Python group raises that ``TypeError`` while Gloo completes (rank 1 then sees its peer
leave: "Connection closed by peer").
"""
from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel

WORLD = 2


class ForwardingGroup(dist.ProcessGroup):
    """A c10d process group in Python: each collective forwarded to Gloo."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        backend = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._gloo = dist.ProcessGroup(rank, size)  # type: ignore[call-arg]  # as torch builds "gloo"
        self._gloo._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                                     backend)
        self._gloo._set_default_backend(dist.ProcessGroup.BackendType.GLOO)

    def allreduce(self, tensors: list[torch.Tensor], opts: object) -> dist.Work:  # type: ignore[override]  # the finding
        return self._gloo.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: object) -> dist.Work:  # type: ignore[override]  # the finding
        return self._gloo.broadcast(tensors, opts)

    def allgather(  # type: ignore[override]  # the finding: no convenience overloads
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: object
    ) -> dist.Work:
        return self._gloo.allgather(outputs, inputs, opts)

    def getBackendName(self) -> str:
        return "forwarding"


def train(group: dist.ProcessGroup | None, rank: int) -> str:
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1), process_group=group,
                                    find_unused_parameters=True)
    try:
        with Join([model]):
            for _ in range(rank + 1):  # uneven: rank 0 joins first
                model(torch.ones(2, 4)).sum().backward()
    except Exception as exc:  # noqa: BLE001 - what torch's DDP says is the finding
        return f"raised {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    return "completed"


def run(rank: int, port: int, out: mp.Queue[str]) -> None:
    store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=30))
    dist.Backend.register_backend("forwarding", ForwardingGroup, devices=["cpu"])
    for name in ("gloo", "forwarding"):
        dist.init_process_group(name, store=dist.PrefixStore(name, store), rank=rank,
                                world_size=WORLD, timeout=timedelta(seconds=10))
        out.put(f"{name} rank {rank}: {train(dist.group.WORLD, rank)}")
        dist.destroy_process_group()


def main() -> int:
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))  # the ranks' store, served from here
    ctx = mp.get_context("spawn")
    out: mp.Queue[str] = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, store.port, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    lines = sorted(out.get(timeout=90) for _ in range(2 * WORLD))
    for p in procs:
        p.join(timeout=60)
    print("\n".join(lines))
    gloo_ok = all(line.endswith("completed") for line in lines if line.startswith("gloo"))
    python_fails = any("missing 1 required positional argument: 'opts'" in line
                       for line in lines if line.startswith("forwarding"))
    return 1 if gloo_ok and python_fails else 0


if __name__ == "__main__":
    sys.exit(main())
