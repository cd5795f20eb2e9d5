"""The rank pool: one process per rank, started once and reused for every job.

Starting a rank costs a Python process and an ``import torch`` (~1.5 s each here, ~3.5 s
for two ranks with a Gloo group); a job on a warm pool costs a process group (~20 ms) and
the job itself. ``fresh=True`` starts new processes for every job instead, the way torch's
``MultiProcessTestCase`` does: for isolation, and to measure what the pool saves.

Rendezvous never leaves this machine and never collides with another run: the parent hosts
a TCP store on 127.0.0.1 with a port the OS chooses, talks to each rank over a private
socket pair, and keeps logs and stack files in a private temporary directory.

Every wait has a deadline. :meth:`RankPool.run` ends in one of four ways:

- ``done``: every rank answered;
- ``raised``: some rank raised; it reports and leaves the pool (its process state is
  suspect, and its exit closes its Gloo connections, which releases peers blocked in a
  collective with it at once); the others answer within a short grace, or are stopped with
  their stacks taken; ranks that left are restarted before the next job;
- ``timeout``: the deadline passed; every rank's Python stack is taken (SIGUSR1 →
  faulthandler), the pool is ended and started afresh for the next job;
- ``crash``: a rank process died; its exit code or signal and the end of its log are kept,
  the other ranks' stacks taken, the pool ended and started afresh.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol, cast

from ddp_conformance.errors import PoolError
from ddp_conformance.ranks.messages import Done, Exit, Job, Ready, RunJob, receive, send
from ddp_conformance.ranks.outcome import Outcome, describe_outcome

#: After one rank raised, how long the others get to answer before they are stopped.
RAISE_GRACE_S = 2.0
#: After a rank died, how long the others get (they are usually released at once).
CRASH_GRACE_S = 2.0


class Pool(Protocol):
    """What the runner needs of a pool: the rank pool here, or ranks started by torchrun."""

    threads: int

    def start(self) -> None: ...

    def close(self) -> None: ...

    def run(self, job: Job, timeout_s: float) -> Outcome: ...


class RankPool:
    """``world_size`` rank processes for one (backend, device)."""

    def __init__(self, world_size: int, backend: str = "gloo", device: str = "cpu",
                 fresh: bool = False, startup_timeout_s: float = 120.0,
                 threads_per_rank: int | None = None) -> None:
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.fresh = fresh
        self.startup_timeout_s = startup_timeout_s
        self.threads = threads_per_rank or max(1, (os.cpu_count() or 1) // max(1, world_size))
        self.starts = 0
        self._procs: list[subprocess.Popen[bytes]] = []
        self._conns: list[Connection] = []
        self._tmp: str | None = None
        self._store: Any = None
        self._jobs = 0

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start every rank process afresh (ending any still running)."""
        import torch.distributed as dist

        self.close()
        self.starts += 1
        self._tmp = tempfile.mkdtemp(prefix="ddp-conformance-pool-")
        self._store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                                    timeout=timedelta(seconds=300))
        self._procs = [None] * self.world_size  # type: ignore[list-item]
        self._conns = [None] * self.world_size  # type: ignore[list-item]
        self._spawn(list(range(self.world_size)))

    def _replace_dead(self) -> None:
        """Restart the ranks that left (a rank that raised exits: its state is suspect)."""
        dead = [r for r, p in enumerate(self._procs) if p.poll() is not None]
        if dead:
            for rank in dead:
                self._conns[rank].close()
            self._spawn(dead)

    def _spawn(self, ranks: list[int]) -> None:
        env = self._worker_env()
        for rank in ranks:
            parent_sock, child_sock = socket.socketpair()
            log = open(self._path(f"rank{rank}.log"), "ab")  # noqa: SIM115
            cmd = [sys.executable, "-m", "ddp_conformance.ranks.worker", "--rank", str(rank),
                   "--world-size", str(self.world_size), "--fd", str(child_sock.fileno()),
                   "--store-port", str(self._store.port), "--backend", self.backend,
                   "--device", self.device, "--stack-file", self._path(f"rank{rank}.stack"),
                   "--threads", str(self.threads), "--parent-pid", str(os.getpid())]
            self._procs[rank] = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(child_sock.fileno(),), start_new_session=True)
            log.close()
            child_sock.close()
            self._conns[rank] = Connection(parent_sock.detach())
        deadline = time.monotonic() + self.startup_timeout_s
        pending = set(ranks)
        while pending:
            remaining = deadline - time.monotonic()
            ready = wait([self._conns[r] for r in pending], timeout=max(0.0, remaining))
            if not ready:
                self.close()
                raise PoolError(f"rank processes {sorted(pending)} did not start within "
                                f"{self.startup_timeout_s:.0f}s")
            for ready_conn in ready:
                rank = self._conns.index(cast(Connection, ready_conn))
                try:
                    hello = receive(self._conns[rank])
                    assert isinstance(hello, Ready), hello
                except (EOFError, OSError):
                    log_tail = self._log_tail(rank)
                    self.close()
                    raise PoolError(f"rank {rank} failed to start: {log_tail}") from None
                pending.discard(rank)

    def _worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *paths]))
        env["PYTHONUNBUFFERED"] = "1"
        if "lo" in {name for _, name in socket.if_nameindex()}:
            env["GLOO_SOCKET_IFNAME"] = "lo"  # Gloo's own connections stay on loopback
        return env

    def _path(self, name: str) -> str:
        assert self._tmp is not None
        return os.path.join(self._tmp, name)

    def close(self, force: bool = False) -> None:
        """End the rank processes (politely, then by force) and remove the private files."""
        for conn, proc in zip(self._conns, self._procs, strict=True):
            if force:
                proc.kill()
                continue
            try:
                send(conn, Exit())
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._store = [], [], None
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs -------------------------------------------------------------------------

    def run(self, job: Job, timeout_s: float) -> Outcome:
        """Run ``job`` on every rank; never waits longer than ``timeout_s`` plus graces."""
        if self.fresh or not self._procs:
            self.start()
        else:
            self._replace_dead()
        try:
            return self._run(job, timeout_s)
        finally:
            if self.fresh:
                self.close()

    def _run(self, job: Job, timeout_s: float) -> Outcome:
        self._jobs += 1
        job.store_prefix = f"job{self._jobs}"
        started = time.monotonic()
        deadline = started + timeout_s
        out = Outcome("done")
        pending = set(range(self.world_size))
        # Where each rank's stack file ends now: what faulthandler writes past it when a
        # rank dies of a fatal signal is that rank's Python stack at the moment of death.
        stack_marks = {r: _size(self._path(f"rank{r}.stack")) for r in pending}
        for rank, conn in enumerate(self._conns):
            try:
                send(conn, RunJob(job))
            except OSError:  # it died between jobs
                pending.discard(rank)
                out.exit_codes[rank] = self._exit_code(rank)
                out.logs[rank] = self._log_tail(rank)
        while pending:
            remaining = deadline - time.monotonic()
            ready = wait([self._conns[r] for r in pending], timeout=max(0.0, remaining)) \
                if remaining > 0 else []
            if not ready:
                break
            for ready_conn in ready:
                rank = self._conns.index(cast(Connection, ready_conn))
                pending.discard(rank)
                try:
                    answer = receive(self._conns[rank])
                except (EOFError, OSError):
                    out.exit_codes[rank] = self._exit_code(rank)
                    out.logs[rank] = self._log_tail(rank)
                    deadline = min(deadline, time.monotonic() + CRASH_GRACE_S)
                    continue
                if out.record(answer):
                    self._reap(rank)  # it leaves the pool after reporting
                if not isinstance(answer, Done):
                    deadline = min(deadline, time.monotonic() + RAISE_GRACE_S)
        out.elapsed_s = time.monotonic() - started
        if out.exit_codes:
            out.status = "crash"
        elif out.tracebacks:
            out.status = "raised"
        elif pending:
            out.status = "timeout"
        if pending or out.exit_codes:
            out.stacks = self._dump_stacks(sorted(pending))
            for rank in out.exit_codes:
                fatal = self._read_from(self._path(f"rank{rank}.stack"), stack_marks[rank])
                if fatal:
                    out.stacks[rank] = fatal
            self.close(force=True)
        return out

    def call(self, function: str, *args: Any, timeout_s: float = 120.0) -> list[Any]:
        """Run ``function(rank, world_size, *args)`` on every rank; return the results."""
        out = self.run(Job("call", "", timeout_s, function=function, args=args, trace=False),
                       timeout_s)
        if out.status != "done":
            raise RuntimeError(describe_outcome(out))
        return [out.results[r] for r in range(self.world_size)]

    # -- evidence ---------------------------------------------------------------------

    def _reap(self, rank: int) -> None:
        try:
            self._procs[rank].wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self._procs[rank].kill()
            self._procs[rank].wait()

    def _exit_code(self, rank: int) -> int:
        try:
            return self._procs[rank].wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return 0

    def _log_tail(self, rank: int, limit: int = 4000) -> str:
        try:
            with open(self._path(f"rank{rank}.log"), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - limit))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _dump_stacks(self, ranks: list[int]) -> dict[int, str]:
        """Every listed live rank's Python stacks, through faulthandler on SIGUSR1."""
        paths = {r: self._path(f"rank{r}.stack") for r in ranks}
        before = {r: _size(p) for r, p in paths.items()}
        for rank in ranks:
            if self._procs[rank].poll() is None:
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
        # Wait until every file grew and then stayed the same size for 0.1 s (2 s at most).
        deadline = time.monotonic() + 2.0
        last, quiet_since = dict(before), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            sizes = {r: _size(p) for r, p in paths.items()}
            if sizes != last:
                last, quiet_since = sizes, time.monotonic()
            elif all(sizes[r] > before[r] for r in ranks) and \
                    time.monotonic() - quiet_since >= 0.1:
                break
        return {rank: self._read_from(path, before[rank])
                or "(no stack: the process did not answer SIGUSR1)" for rank, path in paths.items()}

    @staticmethod
    def _read_from(path: str, offset: int) -> str:
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace").strip()
        except OSError:
            return ""


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0
