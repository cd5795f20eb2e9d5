"""The zygote process: warmed once, it forks the pool's rank processes on request.

Started by :class:`~ddp_conformance.ranks.zygote.Zygote` as ``python -m
ddp_conformance.ranks.zygote_server``. It imports torch, pays the lazy imports
(:func:`~ddp_conformance.ranks.warmup.warm_up`), resolves the run's candidates and the
modules a rank runs, and so holds what every rank would otherwise spend seconds on. It
starts **no thread** and no backend: no Gloo group, no CUDA context, no OpenMP pool (torch
creates that at its first parallel kernel; the thread count is each rank's, set after the
fork), no BLAS pool (``OPENBLAS_NUM_THREADS=1`` here only: numpy's OpenBLAS otherwise starts
one at import), and asks CUDA nothing (``PYTORCH_NVML_BASED_CUDA_CHECK=1`` here: a device
count through NVML, not the CUDA runtime, which a forked child could not initialise again).
Its hello says how many threads it has and whether CUDA is initialised; with more than one
thread, or CUDA, the pool does not fork from it (a fork copies one thread; a lock another
held stays locked in the child; CUDA cannot be used in a child forked after it started).

Protocol, over a ``SOCK_SEQPACKET`` Unix socket to the pool (one pickled tuple a packet):

- pool → zygote ``("fork", request)`` with the rank's socket as an ancillary fd; zygote →
  pool ``("forked", pid)``. The child becomes ``python -m ddp_conformance.ranks.worker
  ARGV`` (see :func:`become_rank`) and never returns into this loop;
- zygote → pool ``("exit", pid, returncode)`` when a rank ended (the ranks are the
  zygote's children: only it can wait for them), ``returncode`` as :class:`subprocess.Popen`
  gives it (negative: the signal);
- pool → zygote ``("orphans",)``; zygote → pool ``("orphans", descriptions)``: the zygote is a
  subreaper, so what a killed rank started reparents to it; it ends those on request;
- the pool closing its end: the zygote kills its children and exits. It dies with the pool
  (``PR_SET_PDEATHSIG``) and every rank dies with it, however it ends.
"""
from __future__ import annotations

import argparse
import gc
import os
import pickle
import select
import signal
import socket
import sys
import traceback
from typing import Any

#: What every rank imports before its first job (the worker, the job's procedure).
RANK_MODULES = ("ddp_conformance.ranks.worker", "ddp_conformance.ranks.runtime",
                "ddp_conformance.ranks.engine", "ddp_conformance.ranks.hygiene",
                "ddp_conformance.ranks.placement", "ddp_conformance.ranks.flight",
                "ddp_conformance.ranks.tracing", "ddp_conformance.catalog.scenario")
#: The largest packet either side sends (a fork request: argv and environment).
PACKET = 1 << 20


def preload(specs: list[str]) -> None:
    """Import torch, pay its lazy imports, and resolve ``specs`` and the rank's modules (a
    spec that fails is left to fail in its job, as a spawned rank leaves it)."""
    import importlib

    from ddp_conformance.contract.registry import resolve_candidate
    from ddp_conformance.ranks.warmup import warm_up

    warm_up()
    for name in RANK_MODULES:
        importlib.import_module(name)
    for spec in specs:
        try:
            resolve_candidate(spec)
        except Exception:  # noqa: BLE001 - reported by the job that needs it
            pass
    # What is imported now lives as long as every rank: out of the collector's scans, so
    # that a rank's collections neither take long nor touch (and so copy) these pages.
    gc.collect()
    gc.freeze()


def threads() -> int:
    """How many threads this process has (native ones included); 1 where there is no /proc."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def send(sock: socket.socket, message: tuple[Any, ...]) -> None:
    sock.send(pickle.dumps(message))


def serve(sock: socket.socket) -> None:
    """Answer fork and orphan requests, and report every rank's end, until the pool closes
    its end of ``sock``; then kill what is left and return."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # its wake-up byte is what matters
    ranks: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
            if wake_r in readable:
                os.read(wake_r, 4096)
            _reap(sock, ranks)
            if sock.fileno() not in readable:
                continue
            data, fds, _, _ = socket.recv_fds(sock, PACKET, 1)
            if not data:
                return
            message = pickle.loads(data)
            if message[0] == "fork":
                pid = _fork(message[1], fds[0], (sock.fileno(), wake_r, wake_w))
                ranks.add(pid)
                send(sock, ("forked", pid))
            elif message[0] == "orphans":
                send(sock, ("orphans", _end_orphans(ranks)))
    finally:
        _end_children(ranks)


def _reap(sock: socket.socket, ranks: set[int]) -> None:
    """Wait for every child that ended; tell the pool about the ranks among them."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in ranks:
            ranks.discard(pid)
            try:
                send(sock, ("exit", pid, os.waitstatus_to_exitcode(status)))
            except OSError:
                pass


def _end_orphans(ranks: set[int]) -> list[str]:
    """End the zygote's children that are not ranks: what ranks that were killed started
    (they reparented here); describe them."""
    from ddp_conformance.ranks.orphans import end_descendants

    return end_descendants(skip=ranks)


def _end_children(ranks: set[int]) -> None:
    from ddp_conformance.ranks.orphans import end_descendants

    for pid in ranks:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    end_descendants()


def _fork(request: dict[str, Any], fd: int, inherited: tuple[int, ...]) -> int:
    """Fork a rank from this process; return its pid (the child never returns)."""
    me = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for own in inherited:
            os.close(own)
        become_rank(request, fd, me)
    os.close(fd)
    return pid


def become_rank(request: dict[str, Any], fd: int, zygote: int) -> None:
    """In a freshly forked child: become a rank process as the spawn path starts one (its
    own session, its environment, its log as stdout and stderr, the RNG state of a fresh
    process), run the worker on ``request['argv']`` with the rank socket ``fd``, and exit."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    code = 1
    try:
        os.setsid()
        os.environ.clear()
        os.environ.update(request["env"])
        _redirect(request["log"])
        _fresh_rng()
        from ddp_conformance.ranks import worker

        worker.main([*request["argv"], "--fd", str(fd), "--parent-pid", str(zygote)])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the child must never return into the zygote
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _redirect(log: str) -> None:
    """stdin from /dev/null, stdout and stderr to ``log`` (appended), as the spawn path."""
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)


def _fresh_rng() -> None:
    """The random state a freshly started process has: torch's default generator at its
    initial seed, numpy's seeded from the OS (Python's ``random`` reseeds itself at fork).
    Every job then seeds its own (:meth:`RankRuntime.reset
    <ddp_conformance.ranks.runtime.RankRuntime.reset>`)."""
    import torch

    torch.manual_seed(torch.initial_seed())
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="ddp_conformance.ranks.zygote_server")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--preload", default="", help="candidate specs, comma-separated")
    args = parser.parse_args(argv)
    from ddp_conformance.ranks.orphans import become_subreaper
    from ddp_conformance.ranks.worker import die_with_parent

    die_with_parent(args.parent_pid)
    become_subreaper()
    sock = socket.socket(fileno=args.fd)
    preload([s for s in args.preload.split(",") if s])
    import torch

    from ddp_conformance.ranks.memory import resident_mib

    count, cuda = threads(), torch.cuda.is_initialized()
    send(sock, ("hello", os.getpid(), resident_mib(), count, cuda))
    if count == 1 and not cuda:
        serve(sock)
    os._exit(0)


if __name__ == "__main__":
    main()
