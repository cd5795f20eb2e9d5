"""Fail fast on a candidate that ends every case the same way before any collective.

A DDP whose constructor hangs outside any collective, or raises the same error there,
fails every case of the catalog identically: waiting out the deadline on each (a hang) or
starting each only to see the same traceback tells nothing new. The rule, per candidate
(the pool keeps it: it sees every job's collectives and stacks):

- A job's *ending* is kept when it did not end done, the trace was on, and **no rank
  launched any collective** in it: its status (timeout, raised, crash) and, per rank, where
  it ended: the main thread's frames (file, line, function) of a stuck rank, the traceback
  of a rank that raised (not of a peer only released by it), the exit code and the stack
  at the fatal signal of a rank that died.
- A candidate's *streak* is its scenario jobs from its **first** one on, as long as every
  one ended with the same ending. A job that ends any other way (done, a collective
  issued, another stack, the trace off) ends the streak for the rest of the run: a
  candidate that passes or fails only some cases is never cut short.
- Once a streak holds :data:`THRESHOLD` (3) jobs, every later job of that candidate is
  **not run**: it ends at once with the streak's status and evidence and says so ("not
  run: ..."), so its case gets the same verdict kind (TIMEOUT, ERROR or CRASH: never PASS;
  an expectations-file entry still makes it XFAIL), is written to every report, and the run
  notes count the cases not run (:meth:`Endings.notes`).
- While a streak of one hang stands, the next job of that candidate is ended early when
  every rank sits, with no collective launched, at the same frames as the first hang, in
  two looks :data:`LOOK_S` apart (:class:`HangMatcher`): the second hang costs seconds,
  not the deadline, so a hanging constructor's whole catalog takes one deadline and a few
  seconds.

torchrun's pool has no per-rank flight logs in the parent: the rule does not apply there.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ddp_conformance.ranks.desync import Desync
from ddp_conformance.ranks.flight import RankFlight
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.outcome import Outcome
from ddp_conformance.ranks.stacks import innermost_frame, main_frames

#: Identical endings before the rest of the candidate's cases are not run.
THRESHOLD = 3
#: How far apart the two looks at a hang like the first are.
LOOK_S = 1.0

Where = tuple[tuple[int, str], ...]


def _frames(stack: str) -> str:
    """A stack as its main thread's frames, without thread ids or addresses."""
    return "\n".join(f"{f['path']}:{f['line']} {f['func']}" for f in main_frames(stack))


def ending_of(out: Outcome, collectives: int | None) -> tuple[str, Where] | None:
    """The ending of a job (status, and where each rank ended) if it counts for the rule:
    not done, traced (``collectives`` known) and no collective launched; else None."""
    if collectives != 0 or out.status not in ("timeout", "raised", "crash"):
        return None
    if out.status == "raised":
        primary = {r: tb for r, tb in out.tracebacks.items() if r not in out.released}
        where = {r: tb.strip() for r, tb in (primary or out.tracebacks).items()}
    elif out.status == "crash":
        where = {r: f"exit {code}\n{_frames(out.stacks.get(r, ''))}"
                 for r, code in out.exit_codes.items()}
    else:
        where = {r: _frames(s) for r, s in out.stacks.items()}
    return out.status, tuple(sorted(where.items()))


@dataclass
class Streak:
    """A candidate's identical endings so far: the first job's outcome and scenario."""

    status: str
    where: Where
    first: Outcome
    scenario: str
    count: int = 1
    #: Jobs not run because of it.
    skipped: int = 0

    def says(self) -> str:
        """Where the candidate's jobs ended, in a few words."""
        if self.status == "raised":
            rank, tb = self.where[0]
            return f"ERROR: rank {rank} raised {tb.splitlines()[-1] if tb else '?'}"
        if self.status == "crash":
            return "CRASH: " + ", ".join(f"rank {r} {w.splitlines()[0]}" for r, w in self.where)
        rank, stack = min(self.first.stacks.items())
        return f"TIMEOUT: rank {rank} at {innermost_frame(stack)}"


class Endings:
    """The pool's account of each candidate's streak (see the module docstring)."""

    def __init__(self) -> None:
        self._streaks: dict[str, Streak] = {}
        self._ended: set[str] = set()

    def record(self, job: Job, out: Outcome, collectives: int | None) -> None:
        """After a job the pool ran: extend or end its candidate's streak."""
        if job.kind != "scenario" or not job.candidate or job.candidate in self._ended:
            return
        found = ending_of(out, collectives)
        streak = self._streaks.get(job.candidate)
        if found is None or (streak is not None and (streak.status, streak.where) != found):
            self._ended.add(job.candidate)
            self._streaks.pop(job.candidate, None)
        elif streak is None:
            scenario = job.scenario.id if job.scenario is not None else "?"
            self._streaks[job.candidate] = Streak(*found, first=out, scenario=scenario)
        else:
            streak.count += 1

    def cut(self, job: Job) -> Outcome | None:
        """For a job of a candidate whose streak reached :data:`THRESHOLD`: its outcome
        without running it (the streak's status and evidence, marked not run)."""
        streak = self._streaks.get(job.candidate) if job.kind == "scenario" else None
        if streak is None or streak.count < THRESHOLD:
            return None
        streak.skipped += 1
        first = streak.first
        return replace(Outcome(streak.status), tracebacks=dict(first.tracebacks),
                       released=set(first.released), stacks=dict(first.stacks),
                       exit_codes=dict(first.exit_codes), logs=dict(first.logs),
                       not_run=f"the first {streak.count} cases of this candidate "
                               f"(from {streak.scenario}) ended the same way before any "
                               f"collective ({streak.says()}); the rest are not run "
                               "(fail-fast rule)")

    def hang(self, job: Job) -> Streak | None:
        """The streak of hangs a job of this candidate may be matched against, if any."""
        streak = self._streaks.get(job.candidate) if job.kind == "scenario" else None
        return streak if streak is not None and streak.status == "timeout" else None

    def notes(self) -> list[str]:
        """One line per candidate cut short: how many cases were not run, and why."""
        return [f"{candidate}: {s.skipped} case{'' if s.skipped == 1 else 's'} not run: its "
                f"first {s.count} cases ended the same way before any collective "
                f"({s.says()}; first {s.scenario})"
                for candidate, s in self._streaks.items() if s.skipped]


class HangMatcher:
    """Ends a job early when its ranks hang exactly where a streak's first hang did."""

    def __init__(self, streak: Streak, stacks: Callable[[list[int]], dict[int, str]]) -> None:
        self.streak = streak
        self.stacks = stacks
        self.expected = dict(streak.where)
        self._next_look = time.monotonic() + LOOK_S
        self._matches = 0
        self._spoiled = False

    def poll(self, flights: dict[int, RankFlight], live: set[int], now: float) -> Desync | None:
        """A diagnosis once every rank that hung the first time is still running, none
        launched a collective, and two looks found each at the first hang's frames."""
        if any(f.launches for f in flights.values()):
            self._spoiled = True  # a collective: never the same ending
        if self._spoiled or now < self._next_look or set(self.expected) != live:
            return None
        self._next_look = now + LOOK_S
        seen = {r: _frames(s) for r, s in self.stacks(sorted(live)).items()}
        self._matches = self._matches + 1 if seen == self.expected else 0
        if self._matches < 2:
            return None
        return Desync(f"every rank hangs where this candidate's first case "
                      f"({self.streak.scenario}) hung, before any collective "
                      f"({self.streak.says()}); not waited on again", "")
