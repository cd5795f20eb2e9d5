"""The parent's watch over a running job: is it hung for good? (a flight recorder's reader)

While a job runs, the pool polls a :class:`JobWatch` every :data:`POLL_S`. The watch
reads what each rank's flight recorder appended (:mod:`ddp_conformance.ranks.flight`) and
how much CPU each rank process used, and reports a desync
(:func:`~ddp_conformance.ranks.desync.diagnose`) only when, in addition to the structural
condition, nothing has moved for :data:`DESYNC_QUIET_S`: no rank launched or completed a
collective, none answered, and none used more than :data:`IDLE_CPU_S` of CPU.

Why the time condition, and why these figures. The structural condition alone is final
when a peer issued a different collective at the same sequence number, or left the job:
no later event can change that. It is not final when it rests on a peer that has not
issued the collective yet and has an unmatched asynchronous collective of its own pending:
that peer may still be computing towards the one the others wait for (two groups used in
different orders, say). Such a peer burns CPU or launches collectives; a rank blocked in a
collective does neither (Gloo's and NCCL's waits sleep in the kernel: a blocked rank was
measured here at 0-10 ms of CPU per second, where a computing one uses 1 s per second per
thread). One second of quiet is over ten scheduler time slices, so a rank that is runnable
but starved by a loaded machine still shows CPU time within it; and the whole diagnosis
then costs about one second, where the deadline it replaces is 60 s by default. Without
``/proc`` (not Linux) the CPU condition is unknown and the quiet period is tripled.

One desync needs no time condition: a :attr:`~ddp_conformance.ranks.desync.Desync.final`
one, where every stuck collective waits on a peer that is gone (it answered or died) and
never issued it. Whether the waiting ranks still compute is then the only question (a rank
that launched an asynchronous collective may yet raise, or finish, on its own), and their
stacks answer it at once: a rank whose main thread is inside one of torch.distributed's
collectives (:func:`~ddp_conformance.ranks.stacks.in_collective`) waits in one of those
stuck collectives for good, provided no collective was launched or completed while the
stacks were taken (then the next poll looks again). The stacks are asked at most
:data:`FINAL_LOOKS` times per quiet period (a look can catch a rank between its launch and
its wait), and kept (:attr:`JobWatch.taken`) as the job's evidence: a peer that finished or
raised costs the waiting ranks a poll and a stack dump (~0.2 s), not the quiet period. A
rank blocked below Python (torch's C++ reducer) is not recognised by its stack, and keeps
the quiet period.

A rank outside the trace may also wait to create a process group (its stack says so:
:func:`~ddp_conformance.ranks.stacks.in_group_creation`): when every live rank does, quiet
for the period, and some rank of the job has answered, the group needs a rank that will
create nothing more (:func:`~ddp_conformance.ranks.desync.creation_hang`), a hang the trace
cannot show.

The watch also ends a job whose ranks hang exactly where its candidate's first case hung,
before any collective (:class:`~ddp_conformance.ranks.endings.HangMatcher`, the fail-fast
rule of :mod:`ddp_conformance.ranks.endings`).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from ddp_conformance.ranks.desync import Desync, creation_hang, diagnose
from ddp_conformance.ranks.endings import HangMatcher, Streak
from ddp_conformance.ranks.flight import FlightLog, RankFlight
from ddp_conformance.ranks.stacks import in_collective, in_group_creation

#: How often the pool looks at a running job that has not answered.
POLL_S = 0.1
#: How long nothing may move before a structurally hung job is declared desynced.
DESYNC_QUIET_S = 1.0
#: CPU a rank may use during the quiet period and still count as waiting (10 ms ticks).
IDLE_CPU_S = 0.05
#: How many times per quiet period the stacks are asked to confirm a final desync.
FINAL_LOOKS = 3

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of process ``pid`` (all its threads); None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime


class JobWatch:
    """Watches one job on the ranks; :meth:`poll` says when it can never finish.

    ``stacks(ranks)``: the Python stacks of live ranks, asked for only once a quiet period
    has passed with some rank waiting outside the trace: whether that rank waits in an
    untraced collective (a group created with an explicit backend name) is read from its
    stack (:func:`~ddp_conformance.ranks.stacks.in_collective`).
    """

    def __init__(self, logs: dict[int, FlightLog], pids: dict[int, int],
                 stacks: Callable[[list[int]], dict[int, str]] | None = None,
                 hang: Streak | None = None) -> None:
        self.logs = logs
        self.pids = pids
        self.stacks = stacks
        #: A hang this job may repeat (the fail-fast rule, :mod:`.endings`): matched early.
        self.matcher = HangMatcher(hang, stacks) if hang is not None and stacks else None
        self._untraced: dict[int, str] | None = None
        #: Live ranks outside the trace that are creating a process group, with where.
        self._creating: dict[int, str] = {}
        #: How many times this quiet period's stacks were asked for a final desync.
        self._final_looks = 0
        #: The stacks that confirmed a final desync (the job's evidence: not taken again).
        self.taken: dict[int, str] = {}
        for log in logs.values():
            log.begin()
        self._live: set[int] | None = None
        self._quiet_since = time.monotonic()
        self._cpu_mark: dict[int, float | None] = {}

    def flights(self) -> dict[int, RankFlight]:
        return {rank: log.flight for rank, log in self.logs.items()}

    def read(self) -> bool:
        """Take in what every rank appended; True if anything moved."""
        return any([log.read() for log in self.logs.values()])

    def structural(self, live: set[int], gone: dict[int, str]) -> Desync | None:
        """The structural diagnosis now, with no time condition: for peers of a rank that
        raised, which will issue nothing more, a wait on it is final at once."""
        self.read()
        return diagnose(self.flights(), live, gone)

    def launched(self) -> int:
        """How many collectives the ranks launched in the job so far."""
        self.read()
        return sum(len(flight.launches) for flight in self.flights().values())

    def poll(self, live: set[int], gone: dict[int, str], now: float) -> Desync | None:
        """A desync once ``live`` ranks are structurally hung and quiet for the grace (or
        hang where the candidate's first case hung, before any collective)."""
        moved = self.read()
        if self.matcher is not None:
            same = self.matcher.poll(self.flights(), live, now)
            if same is not None:
                return same
        restarted = moved or live != self._live
        if restarted:
            self._restart_quiet(live, now)
        final = self._final(live, gone, now)
        if final is not None or restarted:
            return final
        if now - self._quiet_since < DESYNC_QUIET_S:
            return None  # (checked first: the CPU figures are read only once it may end)
        cpu = {r: cpu_seconds(self.pids[r]) for r in live}
        if any(v is None for v in cpu.values()) and \
                now - self._quiet_since < 3 * DESYNC_QUIET_S:
            return None
        if any(v is not None and (mark := self._cpu_mark.get(r)) is not None
               and v - mark > IDLE_CPU_S for r, v in cpu.items()):
            self._restart_quiet(live, now)  # a rank computes: it may still get there
            return None
        flights = self.flights()
        found = diagnose(flights, live, gone)
        if found is not None or self.stacks is None:
            return found
        if self._untraced is None:  # once per quiet period: a dump is not free
            outside = [r for r in sorted(live) if not flights[r].pending()]
            stacks = self.stacks(outside) if outside else {}
            where = {r: in_collective(stack) for r, stack in stacks.items()}
            self._untraced = {r: w for r, w in where.items() if w is not None}
            creating = {r: in_group_creation(stack) for r, stack in stacks.items()}
            self._creating = {r: w for r, w in creating.items() if w is not None}
        if self._untraced:
            return diagnose(flights, live, gone, self._untraced)
        return creation_hang(live, gone, self._creating)

    def _final(self, live: set[int], gone: dict[int, str], now: float) -> Desync | None:
        """A final desync whose live ranks all sit in torch.distributed collectives, by
        their stacks (asked :data:`FINAL_LOOKS` times per quiet period at most; see the module
        docstring); else None."""
        if self.stacks is None or self._final_looks >= FINAL_LOOKS or not gone:
            return None
        found = diagnose(self.flights(), live, gone)
        if found is None or not found.final:
            return None
        self._final_looks += 1
        stacks = self.stacks(sorted(live))
        if self.read():  # something moved while the stacks were taken: look again
            self._restart_quiet(live, now)
            return None
        if any(in_collective(stack) is None for stack in stacks.values()):
            return None  # some rank still computes (or waits below Python): the quiet period
        self.taken = stacks
        return found

    def _restart_quiet(self, live: set[int], now: float) -> None:
        self._untraced = None
        self._creating = {}
        self._final_looks = 0
        self._live = set(live)
        self._quiet_since = now
        self._cpu_mark = {r: cpu_seconds(self.pids[r]) for r in live}
