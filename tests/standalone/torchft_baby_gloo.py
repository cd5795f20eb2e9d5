"""torchft 0.2.0: ``ProcessGroupBabyGloo`` (collectives in a child process) (1) completes an
allreduce whose ``get_future()`` value is empty, and (2) makes torch's own DDP die with
SIGSEGV in its first backward.

Standalone (torch and torchft only, no harness)::

    python tests/standalone/torchft_baby_gloo.py

Two processes, one ``TCPStore`` served by the parent. torchft builds its C++ base as
``ProcessGroup(0, 1)`` (see ``torchft_gloo_rank_zero_of_one.py``), on which DDP cannot even
be constructed; so ``TrueBabyGloo`` here slots a base with the true rank and size under
torchft's class in the MRO (torchft's ``__init__`` runs unchanged). Each rank
``configure``-s it, then: ``allreduce([ones(4)])`` and prints ``wait()``'s tensor and the
length of ``get_future().value()``; then wraps ``nn.Linear(4, 1)`` in
``DistributedDataParallel(process_group=group)`` and runs one forward and backward, in a
grandchild process so that a crash is seen as its exit code. Prints one line per rank; exits
1 when the future's value is empty or the DDP step died by a signal.
"""
from __future__ import annotations

import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torchft.process_group import ProcessGroupBabyGloo

WORLD = 2


class _TrueBase(dist.ProcessGroup):
    _true: tuple[int, int]

    def __init__(self, *_ignored: Any) -> None:
        rank, size = self._true
        dist.ProcessGroup.__init__(self, rank, size)  # type: ignore[call-arg]  # stubs: store first


class TrueBabyGloo(ProcessGroupBabyGloo, _TrueBase):
    def __init__(self, rank: int, size: int) -> None:
        self._true = (rank, size)
        ProcessGroupBabyGloo.__init__(self, timeout=timedelta(seconds=30))


def group(rank: int, port: int, prefix: str) -> TrueBabyGloo:
    pg = TrueBabyGloo(rank, WORLD)
    pg.configure(f"127.0.0.1:{port}/{prefix}", "replica", rank, WORLD)
    return pg


def future_value(rank: int, port: int, out: mp.Queue[str]) -> None:
    pg = group(rank, port, "future")
    tensor = torch.ones(4)
    work = pg.allreduce([tensor], dist.AllreduceOptions())
    work.wait()
    second = torch.ones(4)
    value = pg.allreduce([second], dist.AllreduceOptions()).get_future().wait()
    out.put(f"rank {rank}: allreduce wait() gave {tensor.tolist()}; get_future() value "
            f"{value!r:.60} (length {len(value) if value is not None else 'None'})")
    pg.shutdown()


def ddp_step(rank: int, port: int) -> None:
    pg = group(rank, port, "ddp")
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Linear(4, 1), process_group=pg)
    model(torch.ones(2, 4)).sum().backward()
    pg.shutdown()


def main() -> int:
    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    ctx = mp.get_context("spawn")
    out: mp.Queue[str] = ctx.Queue()
    procs = [ctx.Process(target=future_value, args=(r, store.port, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    lines = sorted(out.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    procs = [ctx.Process(target=ddp_step, args=(r, store.port)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=90)
    codes = [p.exitcode for p in procs]
    lines += [f"rank {r}: DDP forward+backward process exit code {c}" for r, c in enumerate(codes)]
    print("\n".join(lines))
    empty = any("(length 0)" in line or "(length None)" in line for line in lines)
    signalled = any(c is not None and c < 0 for c in codes)
    return 1 if empty or signalled else 0


if __name__ == "__main__":
    sys.exit(main())
