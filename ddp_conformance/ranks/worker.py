"""A rank process of the pool: receives jobs, runs them, answers; until told to stop.

Started by :mod:`ddp_conformance.ranks.pool` as ``python -m ddp_conformance.ranks.worker``.
It only transports: every job goes to :meth:`RankRuntime.execute
<ddp_conformance.ranks.runtime.RankRuntime.execute>`, the procedure torchrun mode uses
too. ``SIGUSR1`` dumps every thread's Python stack to the rank's stack file
(faulthandler), which is how the parent reports a TIMEOUT; a fatal signal dumps there too.

After every job the rank compares itself with its state before its first job
(:mod:`~ddp_conformance.ranks.hygiene`): what the job changed is put back, or the rank
answers and leaves, so that the next job runs on a fresh rank; and it ends every process the
job started (it is their subreaper: :mod:`~ddp_conformance.ranks.orphans`). Its answer
carries what it found.
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from ddp_conformance.ranks import coverage_hook
from ddp_conformance.ranks.leaks import Hygiene
from ddp_conformance.ranks.messages import (
    Done,
    Exit,
    Job,
    Raised,
    Ready,
    Release,
    Released,
    RunJob,
    receive,
    send,
)
from ddp_conformance.ranks.orphans import become_subreaper, end_descendants

if TYPE_CHECKING:
    from ddp_conformance.ranks.hygiene import Fingerprint
    from ddp_conformance.ranks.runtime import RankRuntime


def serve(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from ddp_conformance.ranks.hygiene import Fingerprint
    from ddp_conformance.ranks.placement import pin_device
    from ddp_conformance.ranks.runtime import RankRuntime
    from ddp_conformance.ranks.warmup import warm_up

    conn = Connection(args.fd)
    store = dist.TCPStore("127.0.0.1", args.store_port, None, False,
                          timeout=timedelta(seconds=args.store_timeout))
    device = pin_device(args.device, args.rank)  # the pool's ranks share one machine
    runtime = RankRuntime(args.rank, args.world_size, args.backend, device, store)
    warm_up(device)
    runtime.preload(args.preload.split(",") if args.preload else [])
    gc.collect()
    # The state every job starts from: a fresh rank's, candidates imported (a fresh rank
    # imports them too), before any job; the harness's own reaper thread is not a job's.
    fingerprint = Fingerprint(exempt_threads=lambda: [runtime.reaper_thread()])
    # Everything imported so far lives as long as the process: keep it out of the
    # collector's scans, so that the collection after each job costs microseconds.
    gc.freeze()
    send(conn, Ready(args.rank, os.getpid()))
    try:
        _serve_jobs(conn, runtime, fingerprint)
    finally:
        end_descendants()
        runtime.close()


def _serve_jobs(conn: Connection, runtime: RankRuntime, fingerprint: Fingerprint) -> None:
    """Answer the parent's messages until it says :class:`Exit` or goes away."""
    while True:
        try:
            message = receive(conn)
        except (EOFError, OSError):
            return  # the parent went away
        if isinstance(message, Exit):
            return
        if isinstance(message, Release):
            stays = _safely(runtime.release)
            send(conn, Released(runtime.rank, stays))
            if not stays:
                _leave()  # its exit closes the connections the groups still hold
            continue
        assert isinstance(message, RunJob), message
        coverage_hook.switch_context(_context(message.job))
        answer = runtime.execute(message.job)
        if isinstance(answer, Raised) and may_stay(answer, message.job.trace) \
                and _safely(runtime.cleaned_up):
            answer = replace(answer, stays=True)
        if isinstance(answer, Done) or answer.stays:
            answer = _checked(answer, fingerprint)
        send(conn, answer)
        if isinstance(answer, Raised) and not answer.stays or answer.hygiene.retire:
            # Leave. Destroying the group does not close its connections while C++
            # objects (a DDP reducer) still hold it; exiting does, which releases peers
            # blocked in a collective with this rank at once.
            _leave()


def _context(job: Job) -> str:
    """The coverage context of ``job``: its case id ``scenario-id[candidate]``, or the
    function a call job runs."""
    if job.scenario is not None:
        return f"{job.scenario.id}[{job.candidate}]"
    return job.function


def _checked(answer: Done | Raised, fingerprint: Fingerprint) -> Done | Raised:
    """``answer`` with what the job left in this rank (put back, or the rank retires: a
    Raised answer then no longer stays)."""
    try:
        hygiene = fingerprint.check()
    except Exception as exc:  # noqa: BLE001 - the state is unknown: retire
        hygiene = Hygiene(retired=(f"the rank's state could not be checked: "
                                   f"{type(exc).__name__}: {exc}",))
    if isinstance(answer, Raised) and hygiene.retire:
        return replace(answer, hygiene=hygiene, stays=False)
    return replace(answer, hygiene=hygiene)


def _leave() -> None:
    """Exit at once (no interpreter shutdown: C++ objects may still hold the groups),
    ending every process a job started here and keeping what ``--coverage`` measured."""
    end_descendants()
    coverage_hook.save()
    os._exit(0)


def _safely(step: Callable[[], bool]) -> bool:
    """``step()``, False if it raised (the rank then leaves: its state is unknown)."""
    try:
        return step()
    except BaseException:  # noqa: BLE001 - any failure here means: leave
        return False


#: How long a rank that raised waits for its collectives still in flight to complete before
#: it gives up staying in the pool. Matched collectives (the peer launched them too, as when
#: every rank raises the same error) complete within milliseconds; leaving costs a
#: replacement process (an import of torch, seconds of CPU).
SETTLE_S = 0.25


def may_stay(answer: Raised, traced: bool) -> bool:
    """Whether a rank that raised is sound enough to stay in the pool.

    It is when its exception only echoes a peer's failure, or when none of its own
    collectives is still in flight (the flight recorder counts them: only known when the
    job was traced), after waiting :data:`SETTLE_S` for them to complete. A rank with work
    still in flight leaves: that work would complete, or fail, inside a later job. A rank
    that stays keeps the job's groups (as after every job) until the parent sends
    :class:`Release`, when peers wait on it.
    """
    from ddp_conformance.ranks.tracing import TRACER

    if answer.released:
        return True
    return traced and TRACER.flight is not None and TRACER.flight.settle(SETTLE_S)


def die_with_parent(parent_pid: int) -> None:
    """End this rank when the parent process dies, however it dies (SIGKILL included).

    A rank blocked in a collective, or connecting to the parent's store, never reads its
    closed socket, so it would outlive a killed parent by the store's timeout. On Linux the
    kernel sends it SIGKILL instead (``PR_SET_PDEATHSIG``). The signal follows the *thread*
    that started the process: the pool must start ranks from a thread that lives as long as
    the pool. Elsewhere this does nothing: the socket still ends an idle rank.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ddp_conformance.ranks.worker")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--store-port", type=int, required=True)
    parser.add_argument("--store-timeout", type=float, default=300.0)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--stack-file", required=True)
    parser.add_argument("--flight-file", default="")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--preload", default="", help="candidate specs, comma-separated")
    args = parser.parse_args(argv)
    coverage_hook.start_from_env()  # before torch: module-level lines of a target count
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    become_subreaper()  # what a job starts stays in this rank's tree, to be ended
    stack_file = open(args.stack_file, "w")  # noqa: SIM115 - lives as long as the process
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable(file=stack_file)
    import torch

    torch.set_num_threads(args.threads)
    if args.flight_file:
        from ddp_conformance.ranks.flight import FlightRecorder
        from ddp_conformance.ranks.tracing import TRACER

        TRACER.flight = FlightRecorder(args.flight_file)
    serve(args)
    sys.exit(0)


if __name__ == "__main__":
    main()
