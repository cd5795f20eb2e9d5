"""The flight recorder: each rank's collectives as they are launched and completed, streamed
to the parent while the job runs (torch's NCCL flight recorder keeps the same ring of
collectives per rank, for the same purpose: to say who waits in what when a job hangs).

Rank side, :class:`FlightRecorder` appends one short line per event to a file of the
rank process's own (``O_APPEND``: one ``write`` per line, so lines from the rank's main
thread and from the poller's thread, where completions are stamped, never interleave)::

    G <group> <rank,rank,...>                                  a traced group exists
    L <id> <group> <seq> <kind> <dtype> <numel> <stage> <step> <microbatch>   launched
    D <id> <0|1>                                               completed (1: with an error)

``seq`` counts the collectives of one group on this rank from 1: the ranks of a group
must issue the same collective at the same ``seq`` (Gloo pairs them by that order too).

Parent side, :class:`FlightLog` reads what a rank appended since the job began into a
:class:`RankFlight`: per group, the collectives in ``seq`` order, and which are pending.
The diagnosis of a hang from them is :mod:`ddp_conformance.ranks.desync`.

Completion is observed without touching the work beyond the query the candidate could make
itself: :class:`CompletionPoller` asks ``work.is_completed()`` on a thread of its own, more
rarely the longer a work runs. The recorder never calls ``work.get_future()``: a backend
whose works have no future, or for which asking for one has side effects (torchft's
``ProcessGroupBabyGloo`` loses its worker process), behaves as it does untraced.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch.distributed import Work

#: Point-to-point operations pair by tag, not by a group's order: never judged by ``seq``.
POINT_TO_POINT = frozenset({"send", "recv"})
#: Collectives whose element count may differ across ranks (uneven splits).
UNEVEN = frozenset({"alltoall", "alltoall_base"})


@dataclass
class _Watched:
    work: Any
    on_done: Callable[[float, bool], None]
    started: float
    due: float
    floor_s: float
    cap_s: float


class CompletionPoller:
    """Says when works complete, by polling ``work.is_completed()`` on one daemon thread.

    A work running for ``age`` seconds is asked again after ``age / 4``, within
    ``[floor_s, cap_s]`` (the caller's): a collective that completes at once is seen within
    ``floor_s``, one that waits for a peer costs a query every ``cap_s`` at most. The
    completion time passed to ``on_done`` is when the poll saw it (``time.perf_counter()``,
    late by at most the interval). ``on_done(when, error)`` runs on the poller's thread (or
    on the caller's, when the work is already complete); ``error``: ``is_completed`` raised.
    """

    def __init__(self) -> None:
        self._watched: list[_Watched] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, work: Any, on_done: Callable[[float, bool], None], floor_s: float = 0.0005,
              cap_s: float = 0.02) -> bool:
        """Call ``on_done`` once ``work`` completes. False (and nothing watched) when the
        work cannot say (:func:`can_say`)."""
        if not can_say(work):
            return False
        done, error = _query(work)
        if done:
            on_done(time.perf_counter(), error)
            return True
        now = time.monotonic()
        with self._cond:
            self._watched.append(_Watched(work, on_done, now, now + floor_s, floor_s, cap_s))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ddp-completions",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()
        return True

    def watching(self) -> int:
        """How many works are still being polled."""
        with self._cond:
            return len(self._watched)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._watched:
                    self._cond.wait()
                now = time.monotonic()
                wait_s = min(w.due for w in self._watched) - now
                if wait_s > 0:
                    self._cond.wait(wait_s)
                    continue
            self._poll(now)  # its locals, the works among them, go when it returns

    def _poll(self, now: float) -> None:
        with self._cond:
            due = [w for w in self._watched if w.due <= now]
        finished = []
        for w in due:
            done, error = _query(w.work)
            if done:
                finished.append((w, error))
            else:
                w.due = now + min(max((now - w.started) / 4, w.floor_s), w.cap_s)
        if not finished:
            return
        with self._cond:
            gone = {id(w) for w, _ in finished}
            self._watched = [w for w in self._watched if id(w) not in gone]
        stamp = time.perf_counter()
        for w, error in finished:
            w.on_done(stamp, error)


def can_say(work: Any) -> bool:
    """Whether ``work.is_completed()`` can ever answer True: not for ``None`` or an object
    without it, nor for a Python subclass of c10d's ``Work`` that does not answer it itself
    (c10d's own answer for such a work, which only overrides ``wait``, is False forever)."""
    method = getattr(type(work), "is_completed", None)
    if not callable(method):
        return False
    return not (isinstance(work, Work) and type(work) is not Work and method is Work.is_completed)


def _query(work: Any) -> tuple[bool, bool]:
    """(completed, with an error): ``is_completed()``; a raise counts as both."""
    try:
        return bool(work.is_completed()), False
    except Exception:  # noqa: BLE001 - the work failed: completed with an error
        return True, True


#: The process's poller (the flight recorder's and the tracer's completion times).
POLLER = CompletionPoller()


class FlightRecorder:
    """Rank side: appends the events of this rank's traced collectives to ``path``."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._next_id = 0
        self._pending: set[int] = set()
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)

    def _write(self, line: str) -> None:
        try:
            os.write(self._fd, line.encode())
        except OSError:
            pass  # the parent's directory is gone: the run is ending anyway

    def group(self, key: str, ranks: tuple[int, ...]) -> None:
        self._write(f"G {key} {','.join(map(str, ranks))}\n")

    def launched(self, group: str, seq: int, kind: str, dtype: str, numel: int, stage: str,
                 step: int, microbatch: int, work: Any) -> None:
        """Log a collective just launched, and its completion once :data:`POLLER` sees
        ``work.is_completed()`` (an error: ``is_completed`` raised).

        A work that cannot say (``None``, no ``is_completed``) is logged as completed at
        once: the recorder never claims a rank waits where it cannot see the end of the wait.
        """
        with self._lock:
            ident = self._next_id
            self._next_id += 1
            self._pending.add(ident)
        self._write(f"L {ident} {group} {seq} {kind} {dtype} {numel} {stage} {step} "
                    f"{microbatch}\n")
        if not POLLER.watch(work, lambda _when, error: self._completed(ident, error)):
            self._completed(ident, False)

    def _completed(self, ident: int, error: bool) -> None:
        # The line first: once settle() returns, every completion is in the file.
        self._write(f"D {ident} {int(error)}\n")
        with self._lock:
            self._pending.discard(ident)
            if not self._pending:
                self._settled.notify_all()

    def pending(self) -> int:
        """How many collectives this rank launched that have not completed."""
        with self._lock:
            return len(self._pending)

    def settle(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for every launched collective to complete: whether they
        did. (A rank that raised between launching a bucket's allreduce and waiting for it
        usually has a peer that launched the same one: it completes within milliseconds.)"""
        with self._settled:
            return self._settled.wait_for(lambda: not self._pending, timeout=timeout_s)


@dataclass
class Launch:
    """One collective a rank launched, as the parent read it."""

    ident: int
    group: str
    seq: int
    kind: str
    dtype: str
    numel: int
    stage: str
    step: int
    microbatch: int
    done: bool = False
    error: bool = False

    def matches(self, other: Launch) -> bool:
        """Whether two ranks' collectives at the same ``seq`` of a group can pair up."""
        if (self.kind, self.dtype) != (other.kind, other.dtype):
            return False
        return self.kind in UNEVEN or self.numel == other.numel

    def describe(self) -> str:
        """``allreduce(310 x float32)``."""
        return f"{self.kind}({self.numel} x {self.dtype})"

    def where(self) -> str:
        """Where the rank was: ``step 1, microbatch 0, backward``; ``wrap``."""
        if self.step < 0:
            return self.stage
        mb = f", microbatch {self.microbatch}" if self.microbatch >= 0 else ""
        return f"step {self.step}{mb}, {self.stage}"


@dataclass
class RankFlight:
    """One rank's collectives in the current job, per group in ``seq`` order."""

    launches: dict[int, Launch] = field(default_factory=dict)
    #: group id -> seq -> the collective this rank issued there.
    groups: dict[str, dict[int, Launch]] = field(default_factory=dict)
    #: group id -> the group's global ranks.
    members: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def feed(self, line: str) -> None:
        parts = line.split()
        if not parts:
            return
        if parts[0] == "G" and len(parts) == 3:
            self.members[parts[1]] = tuple(int(r) for r in parts[2].split(",") if r)
        elif parts[0] == "L" and len(parts) == 10:
            launch = Launch(int(parts[1]), parts[2], int(parts[3]), parts[4], parts[5],
                            int(parts[6]), parts[7], int(parts[8]), int(parts[9]))
            self.launches[launch.ident] = launch
            self.groups.setdefault(launch.group, {})[launch.seq] = launch
        elif parts[0] == "D" and len(parts) == 3:
            launch_done = self.launches.get(int(parts[1]))
            if launch_done is not None:  # else: a late completion of the previous job
                launch_done.done, launch_done.error = True, parts[2] == "1"

    def pending(self) -> list[Launch]:
        """The collectives launched and not completed, in launch order."""
        return [c for c in self.launches.values() if not c.done]

    def at(self, group: str, seq: int) -> Launch | None:
        """The collective this rank issued at ``seq`` of ``group`` (None: not yet)."""
        return self.groups.get(group, {}).get(seq)

    def last_seq(self, group: str) -> int:
        return max(self.groups.get(group, {}), default=0)


class FlightLog:
    """Parent side: what one rank process appended to its flight file since :meth:`begin`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.flight = RankFlight()

    def begin(self) -> None:
        """A job starts now: forget the previous one's collectives."""
        self._offset = _size(self.path)
        self._partial = b""
        self.flight = RankFlight()

    def read(self) -> bool:
        """Take in every complete line appended since the last read; True if any."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return False
        if not data:
            return False
        self._offset += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            self.flight.feed(line.decode(errors="replace"))
        return bool(lines)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
