"""The pool's side of the zygote: ranks that cost a fork, not a process start.

A rank started by ``python -m ddp_conformance.ranks.worker`` pays an interpreter, ``import
torch``, the lazy imports and the candidates' frameworks: seconds, on every replacement after
a crash, a timeout or a desync. The zygote (:mod:`~ddp_conformance.ranks.zygote_server`, one
per pool, i.e. per backend and device) pays them once; the pool asks it to fork each rank
(:meth:`Zygote.fork`), which then connects to the pool's store and says Ready like any rank.

The ranks are the zygote's children, so only the zygote can wait for them: it reports each
rank's end, and :class:`ForkedProcess` gives the pool the surface of
:class:`subprocess.Popen` it uses (``pid``, ``poll``, ``wait``, ``kill``, ``send_signal``,
``returncode``) from those reports. Signals (SIGKILL, SIGUSR1 for stacks) go to the pid
directly. Linux only (fork after torch's import, ``PR_SET_PDEATHSIG``, file descriptors passed
over a Unix socket): :func:`available` says whether a pool may use one.
"""
from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ddp_conformance.errors import PoolError
from ddp_conformance.ranks.zygote_server import PACKET

#: The zygote's start: an interpreter, torch, its lazy imports and the candidates.
START_TIMEOUT_S = 300.0
#: How long a request (a fork, the orphans) may take to be answered.
REQUEST_TIMEOUT_S = 30.0
#: Set in the zygote only (numpy's OpenBLAS starts a thread pool at import otherwise; a CUDA
#: availability check asks NVML, not the CUDA runtime); each rank gets the pool's
#: environment back.
ZYGOTE_ENV = {"OPENBLAS_NUM_THREADS": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}


def available() -> bool:
    """Whether ranks can be forked from a zygote here (Linux: fork, prctl, fd passing)."""
    return sys.platform.startswith("linux") and hasattr(socket, "send_fds")


def zygote_or_why(env: dict[str, str], log: str, preload: Sequence[str],
                  meanwhile: Callable[[], object] = lambda: None) -> tuple[Zygote | None, str]:
    """A warm zygote (``meanwhile()`` runs while it warms up), or None and the note that
    says why the ranks are started as processes instead."""
    from ddp_conformance.ranks.coverage_hook import ENV as COVERAGE

    spawned = "rank processes are started, not forked from a zygote"
    if not available():
        return None, f"{spawned}: forking needs Linux"
    if env.get(COVERAGE):
        return None, (f"{spawned}, under --coverage: a forked rank would miss the "
                      "module-level lines of what the zygote imported")
    zygote = None
    try:
        zygote = Zygote(env, log, preload)
        meanwhile()
        zygote.await_warm()
    except (PoolError, OSError) as exc:
        if zygote is not None:
            zygote.close()
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:200]
        return None, f"{spawned}: the zygote failed ({first})"
    return zygote, ""


class Zygote:
    """One zygote process and the ranks it forked (their ends as it reported them)."""

    def __init__(self, env: dict[str, str], log: str, preload: Sequence[str] = ()) -> None:
        """Start the zygote with ``env`` (plus :data:`ZYGOTE_ENV`), its output to ``log``;
        it warms up on its own (:meth:`await_warm` waits for it)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        cmd = [sys.executable, "-m", "ddp_conformance.ranks.zygote_server",
               "--fd", str(theirs.fileno()), "--parent-pid", str(os.getpid()),
               *(["--preload", ",".join(preload)] if preload else [])]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                cmd, env={**env, **ZYGOTE_ENV}, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self.sock = ours
        self.log = log
        #: pid to returncode, for every rank that ended (None: still running).
        self.ended: dict[int, int | None] = {}
        self._replies: list[tuple[Any, ...]] = []
        #: The warmed zygote's resident memory: what a rank holds before its first job.
        self.rank_mib = 0.0

    def await_warm(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until the zygote is warm: :class:`PoolError` if it fails, takes longer than
        ``timeout_s``, or is unfit to fork from (a thread running in it); it is then ended."""
        _, _, self.rank_mib, threads, cuda = self._await_reply("hello", timeout_s)
        if threads != 1 or cuda:
            self.close()
            raise PoolError(f"the zygote runs {threads} threads" + (" and CUDA" if cuda else "")
                            + " after its imports: forking from it is not safe")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def fork(self, argv: list[str], env: dict[str, str], log: str, fd: int) -> ForkedProcess:
        """Fork ``python -m ddp_conformance.ranks.worker ARGV --fd N`` with ``env``, its
        output to ``log``, the rank end of its socket ``fd`` (passed to the zygote)."""
        request = {"argv": argv, "env": env, "log": log}
        try:
            if self.sock.fileno() < 0:
                raise PoolError(f"the zygote ended ({self._ending()}); {self._tail()}")
            socket.send_fds(self.sock, [pickle.dumps(("fork", request))], [fd])
        except OSError as exc:
            raise PoolError(f"the zygote is gone ({exc}; {self._ending()}); "
                            f"{self._tail()}") from None
        pid = self._await_reply("forked", REQUEST_TIMEOUT_S)[1]
        self.ended[pid] = None
        return ForkedProcess(self, pid, argv)

    def end_orphans(self) -> list[str]:
        """End what killed ranks started that reparented to the zygote; describe it."""
        try:
            self.sock.send(pickle.dumps(("orphans",)))
            return list(self._await_reply("orphans", REQUEST_TIMEOUT_S)[1])
        except (OSError, PoolError):
            return []

    def pump(self, timeout_s: float) -> bool:
        """Read what the zygote says within ``timeout_s`` (0: what is there now); False when
        it has gone (every rank it forked is then ended: they die with it)."""
        if self.sock.fileno() < 0:
            return False
        deadline = time.monotonic() + timeout_s
        while True:
            self.sock.settimeout(max(0.0, deadline - time.monotonic()))
            try:
                data = self.sock.recv(PACKET)
            except (BlockingIOError, TimeoutError):
                return True
            except OSError:
                data = b""
            if not data:
                self._gone()
                return False
            message = pickle.loads(data)
            if message[0] == "exit":
                self.ended[message[1]] = message[2]
            else:
                self._replies.append(message)
            deadline = time.monotonic()  # then only what is already there

    def _await_reply(self, kind: str, timeout_s: float) -> tuple[Any, ...]:
        deadline = time.monotonic() + timeout_s
        while True:
            for i, reply in enumerate(self._replies):
                if reply[0] == kind:
                    return self._replies.pop(i)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise PoolError(f"the zygote did not answer {kind!r} within {timeout_s:.0f}s")
            if not self.pump(min(remaining, 0.5)) and not self._replies:
                raise PoolError(f"the zygote ended: {self._tail()}")

    def _gone(self) -> None:
        """The zygote's socket closed: it ended, and every rank with it (PR_SET_PDEATHSIG)."""
        self.sock.close()
        for pid, code in self.ended.items():
            if code is None:
                self.ended[pid] = -9  # SIGKILL, from the kernel

    def _ending(self) -> str:
        """How the zygote process ended, as far as can be told now."""
        try:
            code = self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "its process still runs"
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:  # a signal Python has no name for (a real-time one)
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def _tail(self) -> str:
        try:
            with open(self.log, "rb") as f:
                return f.read()[-2000:].decode(errors="replace").strip() or "(no output)"
        except OSError:
            return "(no output)"

    def close(self) -> None:
        """End the zygote (its ranks die with it) and wait for it."""
        if self.sock.fileno() >= 0:
            self.sock.close()
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._gone()


class ForkedProcess:
    """A rank forked by a :class:`Zygote`, seen through the surface of
    :class:`subprocess.Popen` that the pool uses."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self.zygote = zygote
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.pump(0.0)
            self.returncode = self.zygote.ended.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, once the zygote reported it; :class:`subprocess.TimeoutExpired`
        after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            remaining = 1.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.zygote.pump(min(remaining, 0.05))
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

