"""The rank pool: one process per rank, started once and reused for every job.

Starting a rank costs a Python process and an ``import torch`` (~1.5 s each here, ~3.5 s
for two ranks with a Gloo group); a job on a warm pool costs a process group (~20 ms) and
the job itself. ``fresh=True`` starts new processes for every job instead, the way torch's
``MultiProcessTestCase`` does: for isolation, and to measure what the pool saves.

Rendezvous never leaves this machine and never collides with another run: the parent hosts
a TCP store on 127.0.0.1 with a port the OS chooses, talks to each rank over a private
socket pair, and keeps logs, stack files and flight logs in a private temporary directory.

Every wait has a deadline. :meth:`RankPool.run` ends in one of four ways (the job's
transitions and its status are :class:`~ddp_conformance.ranks.job.JobRun`'s; the grace
periods, ``RAISE_GRACE_S`` and ``CRASH_GRACE_S``, are in :mod:`ddp_conformance.ranks.job`):

- ``done``: every rank answered;
- ``raised``: some rank raised. A rank with no collective of its own in flight cleans up
  and stays in the pool; one with work in flight leaves (its exit closes its connections).
  When peers still wait in a collective on a rank that stayed (the flight logs show it at
  once; or ``RAISE_GRACE_S`` passed), it is sent :class:`Release`: it lets the job's
  groups go, which closes their connections and so releases the peers, and stays
  (:meth:`RankRuntime.release <ddp_conformance.ranks.runtime.RankRuntime.release>`); or,
  when something still holds a group (a candidate that leaks itself), it leaves, its exit
  closing them (Gloo's ``abort`` and ``shutdown`` do not, measured on torch 2.13). Peers
  released that way only echo the failure, report it, and stay;
- ``timeout``: the deadline passed, or — with the trace on — the ranks' collective streams
  can never match again (a desync, :mod:`ddp_conformance.ranks.desync`, decided within
  about a second by :mod:`ddp_conformance.ranks.watch`); every rank still running has its
  Python stack taken (SIGUSR1 → faulthandler) and is ended;
- ``crash``: a rank process died; its exit code or signal and the end of its log are kept,
  the ranks still running after ``CRASH_GRACE_S`` have their stacks taken and are ended.

Ranks are **forked from a zygote** (:mod:`ddp_conformance.ranks.zygote`): one process per
pool that has imported torch, paid the lazy imports and resolved the run's candidates and
the reference, and started no thread. A rank then costs a fork and a store connection
(tens of milliseconds), not an interpreter and ``import torch`` (seconds). Ranks that ended
are replaced before the next job by forking new ones: a fault costs a fork ("fork when
needed"). The zygote dies with the pool's process and the ranks with the zygote
(``PR_SET_PDEATHSIG``); what a killed rank started reparents to the zygote (a subreaper),
which ends it when the pool asks.

Without a zygote — off Linux, with ``fresh=True`` (new processes per job, as torch's
``MultiProcessTestCase``: that is what it measures), under ``--coverage`` (a forked rank
would not see the module-level lines of what the zygote imported), or when the zygote
failed to start (said once in :attr:`RankPool.notes`) — ranks are started as processes
(``python -m ddp_conformance.ranks.worker``), and after the first replacement the pool keeps
a **spare** process per rank, started in the background while cases run (at most one spare
per rank), so a later replacement is a hand-over, not a start. :meth:`RankPool.close` ends
active and spare ranks and the zygote.

A world size that does not fit the machine (:mod:`ddp_conformance.ranks.capacity`) is
refused at :meth:`RankPool.start` unless ``allow_oversubscribe``.

A rank retires itself after a job that left what cannot be put back
(:mod:`ddp_conformance.ranks.hygiene`): it answers, then exits, and is replaced like any
rank that left. Every process a job starts is ended: by its rank after the job
(:mod:`ddp_conformance.ranks.orphans`), or, for a rank the pool had to end, by the pool,
through the marker in every rank's environment; once more at :meth:`RankPool.close`.
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
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

from ddp_conformance.errors import PoolError, UsageError
from ddp_conformance.ranks.capacity import check_cores, check_memory
from ddp_conformance.ranks.communicator import Generations
from ddp_conformance.ranks.desync import mismatch
from ddp_conformance.ranks.endings import Endings
from ddp_conformance.ranks.flight import FlightLog
from ddp_conformance.ranks.job import CRASH_GRACE_S, CallsFunctions, JobRun
from ddp_conformance.ranks.leaks import Hygiene
from ddp_conformance.ranks.memory import resident_mib
from ddp_conformance.ranks.messages import (
    Exit,
    Job,
    Ready,
    Release,
    Released,
    RunJob,
    receive,
    send,
)
from ddp_conformance.ranks.orphans import end_marked, marker_env
from ddp_conformance.ranks.outcome import Outcome
from ddp_conformance.ranks.stack_watch import StackWatch
from ddp_conformance.ranks.warmup import warm_up
from ddp_conformance.ranks.watch import POLL_S, JobWatch
from ddp_conformance.ranks.zygote import ForkedProcess, Zygote, zygote_or_why


class Pool(Protocol):
    """What the runner needs of a pool: the rank pool here, or ranks started by torchrun."""

    threads: int
    #: Whether a job's rank 0 runs in this very process (torchrun's leader): the runner then
    #: leaves torch's process-wide state (RNG, thread count) alone while a job runs.
    in_process: bool

    def start(self) -> None: ...

    def close(self, force: bool = False) -> None: ...

    def run(self, job: Job, timeout_s: float) -> Outcome: ...

    def call(self, function: str, *args: Any, timeout_s: float = 120.0) -> list[Any]: ...


@dataclass
class _Rank:
    """One rank process: its socket to the parent and its private files."""

    rank: int
    serial: int
    proc: subprocess.Popen[bytes] | ForkedProcess
    conn: Connection
    log: str
    stack: str
    flight: FlightLog
    ready: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


class RankPool(CallsFunctions):
    """``world_size`` rank processes for one (backend, device)."""

    def __init__(self, world_size: int, backend: str = "gloo", device: str = "cpu",
                 fresh: bool = False, startup_timeout_s: float = 120.0,
                 threads_per_rank: int | None = None, spare: bool = True,
                 reuse_communicators: bool = True, preload: Sequence[str] = (),
                 fork: bool = True, allow_oversubscribe: bool = False) -> None:
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.fresh = fresh
        self.spare = spare and not fresh
        self.startup_timeout_s = startup_timeout_s
        self.threads = threads_per_rank or max(1, (os.cpu_count() or 1) // max(1, world_size))
        self.in_process = False  # every rank is a process of its own
        #: Candidates each rank resolves (imports) before it says Ready: spares and
        #: replacements then pay a framework's import outside any case.
        self.preload = tuple(preload)
        #: Rank processes started (spares included), and replacements taken from a spare.
        self.spawned = 0
        self.handovers = 0
        #: Fork ranks from a zygote where one can run (see the module docstring).
        self.fork = fork and not fresh
        self.allow_oversubscribe = allow_oversubscribe
        #: What the run should be told about how its ranks start (each said once).
        self.notes: list[str] = []
        #: Seconds the last :meth:`start` spent on the zygote, and on the ranks after it.
        self.start_costs: dict[str, float] = {}
        self._zygote: Zygote | None = None
        #: Processes started by jobs that the pool itself ended (their rank could not).
        self.ended: list[str] = []
        self._active: list[_Rank | None] = []
        self._spares: list[_Rank | None] = []
        self._spares_wanted = False
        self._tmp: str | None = None
        self._store: Any = None
        self._jobs = 0
        #: Which communicator generation traced jobs may reuse (ranks/communicator.py).
        self.communicators = Generations(enabled=reuse_communicators)
        #: Each candidate's identical endings before any collective (the fail-fast rule).
        self.endings = Endings()

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        """Start every rank afresh (ending any still running): forked from the zygote,
        which starts first, or started as processes (see the module docstring). A world
        size that does not fit the machine is refused (:class:`UsageError`) before any rank
        starts, unless :attr:`allow_oversubscribe`."""
        import torch.distributed as dist

        check_cores(self.world_size, self.allow_oversubscribe)
        self.close()
        self.communicators.renew()
        self._tmp = tempfile.mkdtemp(prefix="ddp-conformance-pool-")
        self._store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False,
                                    timeout=timedelta(seconds=300))
        started = time.monotonic()
        self._start_zygote()
        warm = time.monotonic()
        try:
            check_memory(self.world_size, self._zygote.rank_mib if self._zygote is not None
                         else resident_mib(), self.allow_oversubscribe)
        except UsageError:
            self.close()
            raise
        self._active, self._spares = [None] * self.world_size, [None] * self.world_size
        for rank in range(self.world_size):  # each recorded at once: close() can end it
            self._active[rank] = self._spawn(rank)
        warm_up()  # the parent's share of torch's one-time costs, while the ranks start
        self._await_ready([r for r in self._active if r is not None])
        self.start_costs = {"zygote": warm - started, "ranks": time.monotonic() - warm}

    def _start_zygote(self) -> None:
        """Start the zygote (the parent warms up meanwhile) if this pool forks its ranks;
        where it cannot, ranks are started as processes and the notes say why, once."""
        if not self.fork:
            return
        env = {**self._worker_env(), **marker_env(self._marker() + "zygote:")}
        self._zygote, why = zygote_or_why(env, self._path("zygote.log"), self.preload,
                                          meanwhile=warm_up)
        if why and why not in self.notes:
            self.notes.append(why)

    def pids(self, spares: bool = False) -> list[int]:
        """The active ranks' process ids, in rank order; the spares' too if asked."""
        ranks = [*self._active, *self._spares] if spares else self._active
        return [r.pid for r in ranks if r is not None]

    def _spawn(self, rank: int) -> _Rank:
        """Start one rank process, forked from the zygote or as a process of its own; it
        becomes ready on its own (see :meth:`_await_ready`)."""
        self.spawned += 1
        serial = self.spawned
        parent_sock, child_sock = socket.socketpair()
        log_path, stack_path = self._path(f"p{serial}.log"), self._path(f"p{serial}.stack")
        flight_path = self._path(f"p{serial}.flight")
        args = ["--rank", str(rank), "--world-size", str(self.world_size),
                "--store-port", str(self._store.port), "--backend", self.backend,
                "--device", self.device, "--stack-file", stack_path,
                "--flight-file", flight_path, "--threads", str(self.threads),
                *(["--preload", ",".join(self.preload)] if self.preload else [])]
        env = {**self._worker_env(), **marker_env(self._marker(serial))}
        try:
            proc = (self._zygote.fork(args, env, log_path, child_sock.fileno())
                    if self._zygote is not None else
                    _start_process(args, env, log_path, child_sock.fileno()))
        finally:
            child_sock.close()
        return _Rank(rank, serial, proc, Connection(parent_sock.detach()), log_path,
                     stack_path, FlightLog(flight_path))

    def _await_ready(self, ranks: list[_Rank]) -> None:
        """Wait (within the start-up deadline) until every one of ``ranks`` said Ready."""
        deadline = time.monotonic() + self.startup_timeout_s
        pending = {id(r.conn): r for r in ranks if not r.ready}
        while pending:
            remaining = deadline - time.monotonic()
            ready = wait([r.conn for r in pending.values()], timeout=max(0.0, remaining))
            if not ready:
                names = sorted(r.rank for r in pending.values())
                self.close(force=True)
                raise PoolError(f"rank processes {names} did not start within "
                                f"{self.startup_timeout_s:.0f}s")
            for conn in ready:
                r = pending.pop(id(conn))
                try:
                    hello = receive(r.conn)
                    assert isinstance(hello, Ready), hello
                except (EOFError, OSError):
                    tail = _tail(r.log)
                    self.close(force=True)
                    raise PoolError(f"rank {r.rank} failed to start: {tail}") from None
                r.ready = True

    def _replace_ended(self) -> float:
        """Fill every rank whose process ended: from the spares (a hand-over) or by starting
        one. Returns the seconds it took; the first replacement makes the pool keep spares."""
        holes = [i for i, r in enumerate(self._active) if r is None or not r.alive()]
        if not holes:
            return 0.0
        started = time.monotonic()
        self.communicators.renew()  # a new process has no communicator to reuse
        for i in holes:
            old = self._active[i]
            if old is not None:
                self._end([old])
            spare = self._spares[i]
            if spare is not None and spare.alive():
                self._active[i], self._spares[i] = spare, None
                self.handovers += 1
            else:
                if spare is not None:
                    self._end([spare])
                    self._spares[i] = None
                self._active[i] = self._spawn(i)
        self._await_ready([r for r in self._active if r is not None])
        self._spares_wanted = self.spare and self._zygote is None  # else: fork when needed
        self._fill_spares()
        return time.monotonic() - started

    def _fill_spares(self) -> None:
        """Start a spare for every rank that has none (they start while cases run)."""
        if not self._spares_wanted:
            return
        for i, spare in enumerate(self._spares):
            if spare is None or not spare.alive():
                if spare is not None:
                    self._end([spare])
                self._spares[i] = self._spawn(i)

    def _worker_env(self) -> dict[str, str]:
        env = dict(os.environ)
        paths = [p or os.getcwd() for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([os.getcwd(), *paths]))
        env["PYTHONUNBUFFERED"] = "1"
        if "lo" in {name for _, name in socket.if_nameindex()}:
            env["GLOO_SOCKET_IFNAME"] = "lo"  # Gloo's own connections stay on loopback
        return env

    def _marker(self, serial: int | None = None) -> str:
        """The environment marker of rank process ``serial`` (of every rank: None)."""
        assert self._tmp is not None
        return f"{os.path.basename(self._tmp)}:" + (f"{serial}:" if serial is not None else "")

    def _path(self, name: str) -> str:
        assert self._tmp is not None
        return os.path.join(self._tmp, name)

    def close(self, force: bool = False) -> None:
        """End every rank process, spares included (politely unless ``force``, then by
        force), then the zygote, and remove the private files."""
        everyone = [r for r in [*self._active, *self._spares] if r is not None]
        self._end(everyone, polite=not force)
        self._active, self._spares, self._store = [], [], None
        self._spares_wanted = False
        if self._zygote is not None:
            self._zygote.close()  # nothing it forked is left: they died with it
            self._zygote = None
        if self._tmp:
            self.ended += end_marked(self._marker())  # what no rank could end: the run's end
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _end(self, ranks: list[_Rank], polite: bool = False) -> list[str]:
        """End ``ranks``: ask them to exit (idle ones do at once), then kill what is left.
        A process never handed over (a spare, maybe still starting: it would read the
        request only once started) is killed at once: it holds nothing. A rank that was
        killed could not end what its jobs started: those are ended here by their marker
        (described in the list returned, and kept in :attr:`ended`)."""
        killed: list[_Rank] = []
        for r in ranks:
            if polite and r.alive() and r.ready:
                try:
                    send(r.conn, Exit())
                except OSError:
                    pass
            elif r.alive():
                r.proc.kill()
                killed.append(r)
        deadline = time.monotonic() + 2.0
        for r in ranks:
            try:
                r.proc.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
                killed.append(r)
            r.conn.close()
        ended = [e for r in killed if self._tmp for e in end_marked(self._marker(r.serial))]
        if killed and self._zygote is not None:
            ended += self._zygote.end_orphans()  # forked, not exec'd: no marker of their own
        self.ended += ended
        return ended

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- jobs -------------------------------------------------------------------------

    def run(self, job: Job, timeout_s: float) -> Outcome:
        """Run ``job`` on every rank; never waits longer than ``timeout_s`` plus graces.
        A job of a candidate the fail-fast rule cut short is not run (:mod:`.endings`)."""
        skipped = self.endings.cut(job)
        if skipped is not None:
            return skipped
        started = time.monotonic()
        if self.fresh or not self._active:
            self.start()
        else:
            self._replace_ended()
        handover = time.monotonic() - started
        try:
            out = self._run(job, timeout_s)
            out.handover_s = handover
            return out
        finally:
            if self.fresh:
                self.close()

    def _run(self, job: Job, timeout_s: float) -> Outcome:
        """The job on the active ranks, through its transitions (:mod:`.job`); then the
        evidence of how it ended, and the ranks that cannot go on are ended."""
        self._jobs += 1
        ranks: list[_Rank] = [r for r in self._active if r is not None]
        state = JobRun(self.world_size)
        state.dispatch(job, self._jobs, self.communicators, timeout_s)
        # Where each rank's stack file ends now: what faulthandler writes past it when a
        # rank dies of a fatal signal is that rank's Python stack at the moment of death.
        stack_marks = {r.rank: _size(r.stack) for r in ranks}
        watch = JobWatch({r.rank: r.flight for r in ranks}, {r.rank: r.pid for r in ranks},
                         lambda which: self._dump_stacks([ranks[i] for i in which]),
                         self.endings.hang(job)) if job.trace else None
        # No trace (--no-trace): a hang is told from the ranks' CPU time and stacks.
        stack_watch = None if job.trace else StackWatch(
            {r.rank: r.pid for r in ranks}, lambda which: self._dump_stacks([ranks[i] for i in which]))
        for r in ranks:
            try:
                send(r.conn, RunJob(job))
            except OSError:  # it died between jobs
                state.died(r.rank, _exit_code(r), _tail(r.log), grace=False)
        while state.waiting(time.monotonic()):
            wake = state.wake(time.monotonic(), POLL_S)
            for conn in wait([ranks[p].conn for p in state.pending], timeout=wake):
                self._take_answer(state, next(x for x in ranks if x.conn is conn))
            if state.pending:
                self._next_step(state, ranks, watch or stack_watch)
        out = state.conclude(self.communicators)
        if watch is not None and out.status in ("crash", "raised"):
            watch.read()
            out.desync = mismatch(watch.flights())  # why it died or raised, if they say
        collectives = watch.launched() if watch is not None else None
        self._gather_stacks(out, [ranks[i] for i in sorted(state.pending)],
                            {rank: (ranks[rank].stack, stack_marks[rank])
                             for rank in out.exit_codes},
                            watch.taken if watch else stack_watch.taken if stack_watch else {})
        # Stuck ranks cannot be recovered (they wait in C++): end them; the next job
        # replaces them and every other rank that left.
        ended = self._end([ranks[i] for i in state.pending])
        if ended:  # the pool ended them: charged to the job, with the ranks' own findings
            out.hygiene[min(state.pending)] = Hygiene(ended=tuple(ended))
        self._await_released([ranks[i] for i in state.releasing])
        self.endings.record(job, out, collectives)
        return out

    @staticmethod
    def _take_answer(state: JobRun, r: _Rank) -> None:
        """Rank ``r``'s connection is readable: its answer, or its death."""
        try:
            answer = receive(r.conn)
        except (EOFError, OSError):
            state.died(r.rank, _exit_code(r), _tail(r.log))
            return
        if state.answer(r.rank, answer):
            _reap(r)  # it leaves the pool after answering

    @staticmethod
    def _next_step(state: JobRun, ranks: list[_Rank], watch: JobWatch | StackWatch | None
                   ) -> None:
        """Between waits: release ranks that raised if peers wait on them (the flight logs
        say so, or the grace is over: those let the job's groups go, or leave; either
        closes the connections the peers wait on); else end the grace after a raise; else
        ask the watch whether the ranks still running hang for good."""
        now = time.monotonic()
        if state.release_due(now, lambda: watch is not None and watch.structural(
                state.pending, state.gone) is not None):
            for i in state.release(now):
                try:
                    send(ranks[i].conn, Release())
                except OSError:
                    pass
        elif state.expire_grace(now):
            pass
        elif watch is not None and state.watching():
            found = watch.poll(state.pending, state.gone, now)
            if found is not None:
                state.desync(found)

    def _gather_stacks(self, out: Outcome, stuck: list[_Rank],
                       dead: dict[int, tuple[str, int]], taken: dict[int, str]) -> None:
        """Into ``out.stacks``: every ``stuck`` rank's stack now (or as the watch took it
        to decide the job's end: ``taken``), and for every rank that died, what
        faulthandler wrote past its mark (its stack at a fatal signal)."""
        if not stuck and not dead:
            return
        out.stacks = {r.rank: taken[r.rank] for r in stuck if r.rank in taken}
        out.stacks.update(self._dump_stacks([r for r in stuck if r.rank not in taken]))
        for rank, (path, mark) in dead.items():
            fatal = _read_from(path, mark)
            if fatal:
                out.stacks[rank] = fatal

    def _await_released(self, released: list[_Rank]) -> None:
        """Wait for the answers to :class:`Release`: a rank that leaves is reaped, one that
        does not answer in time is ended."""
        deadline = time.monotonic() + CRASH_GRACE_S
        for r in released:
            answer = None
            if r.conn.poll(max(0.0, deadline - time.monotonic())):
                try:
                    answer = receive(r.conn)
                except (EOFError, OSError):
                    pass
            if isinstance(answer, Released) and answer.stays:
                continue
            self._end([r])

    # -- evidence ---------------------------------------------------------------------

    def _dump_stacks(self, ranks: list[_Rank]) -> dict[int, str]:
        """Every listed live rank's Python stacks, through faulthandler on SIGUSR1."""
        before = {r.rank: _size(r.stack) for r in ranks}
        for r in ranks:
            if r.alive():
                os.kill(r.pid, signal.SIGUSR1)
        # Wait until every file grew and then stayed the same size for 0.1 s (2 s at most).
        deadline = time.monotonic() + 2.0
        last, quiet_since = dict(before), time.monotonic()
        while ranks and time.monotonic() < deadline:
            time.sleep(0.05)
            sizes = {r.rank: _size(r.stack) for r in ranks}
            if sizes != last:
                last, quiet_since = sizes, time.monotonic()
            elif all(sizes[r] > before[r] for r in sizes) and \
                    time.monotonic() - quiet_since >= 0.1:
                break
        return {r.rank: _read_from(r.stack, before[r.rank])
                or "(no stack: the process did not answer SIGUSR1)" for r in ranks}


def _start_process(args: list[str], env: dict[str, str], log: str,
                   fd: int) -> subprocess.Popen[bytes]:
    """Start ``python -m ddp_conformance.ranks.worker ARGS`` with the rank socket ``fd``, in
    a session of its own (a terminal's SIGINT is the parent's to handle)."""
    cmd = [sys.executable, "-m", "ddp_conformance.ranks.worker", *args, "--fd", str(fd),
           "--parent-pid", str(os.getpid())]
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, pass_fds=(fd,), start_new_session=True)


def _reap(r: _Rank) -> None:
    """Wait for a rank that announced it leaves (kill it if it does not)."""
    try:
        r.proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        r.proc.kill()
        r.proc.wait()


def _exit_code(r: _Rank) -> int:
    try:
        return r.proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        return 0


def _tail(path: str, limit: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _read_from(path: str, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0
