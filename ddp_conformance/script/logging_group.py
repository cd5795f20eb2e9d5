"""A reproducer's process groups: Gloo behind a group that logs every collective (DDP's
C++ reducer goes through it too), a short deadline for every collective, and which
collective a rank was in when it gave up.

Every group of the script is a :class:`LoggingGroup` (the backend ``logged_gloo``: the
world and every ``new_group``), which records each collective in :data:`TRACE` with
where the training loop was (stage, step, microbatch) and, for a backward reduction, the
storage it summed (:mod:`.extents`, while :attr:`Trace.memory`: the script's trace checks
are on), as the harness's tracing group does. A desync
(ranks in collectives that cannot match) would wait Gloo's default 120 s or more; the
script's groups give up after :func:`collective_timeout_s` instead, and every rank then
says the collective it was waiting in (:meth:`Trace.waiting`): from the error the
timeout raises, or, when torchrun ends the peers of a failed rank, from SIGTERM
(:func:`report_on_termination`).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ddp_conformance.script.collective import REDUCING, Collective
from ddp_conformance.script.extents import BOOK, reduced_memory

#: A collective's deadline by default, in seconds. The script's collectives move a few
#: kilobytes between processes of one machine (milliseconds); what a rank may legitimately
#: make its peers wait for is its own work between two collectives: at most one step of
#: a catalog model and the single-process result before training, a few seconds on a
#: loaded 2-core machine. 30 s is ten times that, and a quarter of Gloo's 120 s.
DEFAULT_TIMEOUT_S = 30.0
#: The environment variable that overrides it (the script's ``--timeout S`` wins).
TIMEOUT_ENV = "REPRO_TIMEOUT_S"


def collective_timeout_s(argv: Sequence[str], environ: dict[str, str]) -> float:
    """``--timeout S`` in ``argv``, else ``$REPRO_TIMEOUT_S``, else the default."""
    if "--timeout" in argv[:-1]:
        return float(argv[list(argv).index("--timeout") + 1])
    return float(environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S)


class Trace:
    """This process's collectives in issue order, where the training loop is (``stage``,
    ``step``, ``microbatch``: what every collective is recorded with), and the works of
    the last collectives (to tell which one a rank is waiting in)."""

    def __init__(self) -> None:
        self.log: list[Collective] = []
        self.stage, self.step, self.microbatch = "setup", -1, -1
        self.works: list[tuple[int, Any]] = []  # (index in log, work), the last 64
        #: Whether a backward reduction's storage is recorded (for ``trace.reduced_once``).
        self.memory = False

    def at(self, stage: str, step: int = -1, microbatch: int = -1) -> None:
        self.stage, self.step, self.microbatch = stage, step, microbatch

    def record(self, kind: str, tensors: list[Tensor], group_size: int) -> Collective:
        dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else "-"
        numel = sum(t.numel() for t in tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        entry = Collective(self.step, self.microbatch, self.stage, kind, dtype, numel, group_size,
                           nbytes, time.monotonic())
        self.log.append(entry)
        return entry

    def waiting(self) -> str:
        """The collective this rank waits in (the first of its last ones whose work has not
        completed; else its last one), in words."""
        if not self.log:
            return "no collective issued yet"
        index = next((i for i, work in self.works if not _completed(work)), None)
        state = "waiting in" if index is not None else "after"
        index = len(self.log) - 1 if index is None else index
        c = self.log[index]
        where = f"step {c.step}, microbatch {c.microbatch}, {c.stage}" if c.step >= 0 else c.stage
        return (f"{state} its collective #{index} ({where}): {c.describe()}, issued "
                f"{time.monotonic() - c.launched:.1f} s ago")


def _completed(work: Any) -> bool:
    try:
        return work is None or bool(work.is_completed())
    except RuntimeError:  # a work that failed: it is what the rank gave up in
        return False


#: This process's trace.
TRACE = Trace()


class LoggingGroup(dist.ProcessGroup):
    """A Gloo process group that logs every collective it is asked for in :data:`TRACE`,
    also by DDP's C++ reducer. Registered as the backend "logged_gloo": the world and every
    new_group are made of it. (As the harness's tracing group, every operation goes to
    Gloo's backend object directly.)"""

    def __init__(self, gloo: Any) -> None:
        super().__init__(gloo.rank(), gloo.size())  # type: ignore[call-arg]
        self.gloo = gloo
        # A plain group over the same Gloo, for what the Gloo object does not bind in Python.
        self.plain = dist.ProcessGroup(gloo.rank(), gloo.size())  # type: ignore[call-arg]
        for group in (self, self.plain):
            group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
        self.plain._set_default_backend(dist.ProcessGroup.BackendType.GLOO)

    @staticmethod
    def create(opts: Any, backend_options: Any) -> LoggingGroup:
        return LoggingGroup(dist.ProcessGroupGloo(opts.store, opts.group_rank, opts.group_size,
                                                  opts.timeout))

    def getBackendName(self) -> str:
        return "logged_gloo"


def _flat(tensors: Any) -> list[Tensor]:
    while isinstance(tensors, (list, tuple)) and tensors and isinstance(tensors[0], (list, tuple)):
        tensors = [t for ts in tensors for t in ts]
    return [tensors] if isinstance(tensors, Tensor) else list(tensors)


def _logged(kind: str, data: int | None) -> Any:
    """LoggingGroup's method ``kind``, whose argument ``data`` holds the tensors."""
    def call(self: LoggingGroup, *args: Any, **kwargs: Any) -> Any:
        entry = TRACE.record(kind, _flat(args[data]) if data is not None and args else [],
                             self.size())
        if TRACE.memory:
            entry.extents, entry.again, entry.blocks = reduced_memory(TRACE, kind, args, REDUCING)
        target = self.gloo if hasattr(self.gloo, kind) else self.plain
        work = getattr(target, kind)(*args, **kwargs)
        if TRACE.memory:
            BOOK.bind(work)
        TRACE.works = [*TRACE.works[-63:], (len(TRACE.log) - 1, work)]
        return work
    return call


# Every operation goes straight to Gloo (the argument holding the data: what is logged).
for _data, _kinds in ((0, "allreduce allreduce_coalesced reduce broadcast scatter send recv"),
                      (1, "reduce_scatter _reduce_scatter_base reduce_scatter_tensor_coalesced "
                          "reduce_scatter_single reduce_scatter_single_coalesced allgather "
                          "allgather_coalesced _allgather_base allgather_into_tensor_coalesced "
                          "all_gather_single all_gather_single_coalesced alltoall_base "
                          "all_to_all_single alltoall gather"),
                      (None, "barrier")):
    for _kind in _kinds.split():
        setattr(LoggingGroup, _kind, _logged(_kind, _data))


def report_on_termination(rank: int) -> None:
    """When SIGTERM comes (torchrun ends the peers of a rank that failed), say which
    collective this rank was in, then exit 143. SIGTERM is blocked in every thread but a
    watcher's (call before any other thread starts): a rank blocked inside Gloo gets to
    say it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def watch() -> None:
        signal.sigwait({signal.SIGTERM})
        print(f"rank {rank} was ended (SIGTERM) {TRACE.waiting()}", file=sys.stderr, flush=True)
        os._exit(143)

    threading.Thread(target=watch, name="repro-sigterm", daemon=True).start()
