"""A rank process of the pool: runs jobs until told to stop.

Started by :mod:`ddp_conformance.pool` as ``python -m ddp_conformance.worker``. For every
job it starts clean (seeded RNG, grad mode on, float32 default dtype, garbage collected),
creates a fresh default process group over the parent's TCP store under a job-unique
prefix, runs the job, and destroys the group even when the job raised: destroying a Gloo
group closes its connections, which releases peers blocked in a collective at once rather
than at the collective timeout. ``SIGUSR1`` dumps every thread's Python stack to the rank's
stack file (faulthandler), which is how the parent reports a TIMEOUT.
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import importlib
import os
import random
import signal
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from .jobs import Job, receive, send, was_released
from .trace import traced_backend


def _resolve_function(ref: str) -> Callable[..., Any]:
    module_name, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch
        import torch.distributed as dist

        self.rank: int = args.rank
        self.world_size: int = args.world_size
        self.backend: str = args.backend
        self.conn = Connection(args.fd)
        self._retired_groups: list[Any] = []
        self.store = dist.TCPStore("127.0.0.1", args.store_port, None, False,
                                   timeout=timedelta(seconds=args.store_timeout))
        if args.device == "cuda":
            index = self.rank % torch.cuda.device_count()
            torch.cuda.set_device(index)
            self.device = torch.device("cuda", index)
        else:
            self.device = torch.device("cpu")
        self.candidates: dict[str, Any] = {}

    def serve(self) -> None:
        send(self.conn, ("ready", self.rank, os.getpid()))
        while True:
            try:
                message = receive(self.conn)
            except (EOFError, OSError):
                return  # the parent went away
            if message[0] == "exit":
                return
            self.execute(message[1])

    def _reset(self, seed: int) -> None:
        import torch

        random.seed(seed)
        torch.manual_seed(seed)
        torch.set_grad_enabled(True)
        torch.set_default_dtype(torch.float32)

    def execute(self, job: Job) -> None:
        """Run one job in a fresh default process group.

        The job's own cleanup (its objects collected, its groups destroyed: ~20 ms) is
        part of the job and done before answering, so that a finalizer that hangs or aborts
        is charged to the job that left it, within its deadline, not to the next one. On
        failure the rank reports and exits, unless its failure only echoes a peer's.
        """
        import torch.distributed as dist

        self._reset(job.seed)
        failure: str | None = None
        try:
            backend = traced_backend(self.backend) if job.trace else self.backend
            dist.init_process_group(
                backend, store=dist.PrefixStore(job.store_prefix, self.store),
                rank=self.rank, world_size=self.world_size,
                timeout=timedelta(seconds=job.collective_timeout_s))
            result = self._run(job)
        except BaseException:  # noqa: BLE001 - every failure is reported, none kills the rank
            failure = traceback.format_exc()
        if failure is None:
            try:
                self._destroy_groups()
            except BaseException:  # noqa: BLE001 - a cleanup failure is the job's failure
                failure = traceback.format_exc()
        if failure is not None:
            send(self.conn, ("raised", self.rank, failure))
            if was_released(failure):
                self._destroy_groups()  # only a peer failed: this process is sound
                return
            # The job failed here: leave. Destroying the group does not close its
            # connections while C++ objects (a DDP reducer) still hold it; exiting does,
            # which releases peers blocked in a collective with this rank at once.
            os._exit(0)
        send(self.conn, ("done", self.rank, result))

    def _destroy_groups(self) -> None:
        """Collect the job's objects while its groups still live, then destroy the groups.

        In that order: a candidate object that still holds work on a group (replicate's
        reducer) must be finalised while its peers can still complete that work.

        The destroyed groups are kept until the next job's cleanup. A future callback
        (PowerSGD's hook captures its group) is released by the Gloo thread that ran it,
        a moment after the future completed; were that the group's last reference, the
        group would be destroyed on its own worker thread, which joins itself and aborts
        the process ("Resource deadlock avoided", 1 job in 7 of the PowerSGD tests).
        Held here, the last reference is always dropped on this thread.
        """
        import torch.distributed as dist

        gc.collect(1)
        self._retired_groups = []
        if dist.is_initialized():
            self._retired_groups = list(dist.distributed_c10d._world.pg_map)
            dist.destroy_process_group()

    def _run(self, job: Job) -> Any:
        return run_job(job, self.rank, self.world_size, self.device, self.candidates)


def run_job(job: Job, rank: int, world_size: int, device: Any, candidates: dict[str, Any]) -> Any:
    """What a rank does for one job, in the default group already initialised: call the
    function, or run the scenario with the candidate (resolved once per process)."""
    import torch.distributed as dist

    if job.kind == "call":
        return _resolve_function(job.function)(rank, world_size, *job.args)
    from .candidate import resolve_candidate
    from .engine import run_scenario

    candidate = candidates.get(job.candidate)
    if candidate is None:
        candidate = candidates[job.candidate] = resolve_candidate(job.candidate)
    assert job.scenario is not None
    return run_scenario(job.scenario, candidate, rank, world_size, device, dist.group.WORLD)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ddp_conformance.worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--store-timeout", type=float, default=300.0)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--stack-file", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    stack_file = open(args.stack_file, "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=stack_file)
    import torch

    torch.set_num_threads(args.threads)
    worker = Worker(args)
    # Everything imported so far lives as long as the process: keep it out of the
    # collector's scans, so that the collection after each job costs microseconds.
    gc.collect()
    gc.freeze()
    worker.serve()
    sys.exit(0)


if __name__ == "__main__":
    main()
