"""Diagnosing a hang from the ranks' collective streams: a desync ends a case in seconds.

A collective completes only when every rank of its group issues a matching one (same kind,
dtype and element count at the same sequence number of the group: Gloo and NCCL pair
collectives by that order). So when every live rank of a job waits in collectives and
none of them can ever complete — a peer issued something else at that sequence number, a
peer finished the job, raised or died without issuing it, or a peer that has not issued
it yet is itself stuck — nothing will move again, and waiting out the deadline only costs
time. :func:`diagnose` decides that from the ranks' flight logs
(:mod:`ddp_conformance.ranks.flight`) and says it as a :class:`Desync`: one line naming
who waits in what and where the streams first differ, and the streams side by side.

It is conservative by construction: a rank with no collective pending (it computes, or
waits in something untraced), a pending collective every peer matched (it is only slow),
a point-to-point operation (paired by tag, not by order) or a group whose members are
unknown all mean "no diagnosis", and the case keeps its full deadline. The pool adds the
time condition (nothing moved for a grace period, see ``DESYNC_QUIET_S`` in
:mod:`ddp_conformance.ranks.watch`), except for a :attr:`Desync.final` one: every stuck
collective waits on a peer that is gone (it answered or died) and never issued it. A gone
rank's flight log is complete (each launch is written before the rank answers), and it
issues nothing more, so no later event can change that; the watch then only checks that
the waiting ranks are blocked in those collectives (their stacks) before it ends the job.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ddp_conformance.ranks.flight import POINT_TO_POINT, Launch, RankFlight

#: How many collectives before the first difference the side-by-side view shows.
CONTEXT_ROWS = 3
#: How many rows after it, at least where there are.
AFTER_ROWS = 6
#: How many rows after it, at most (to reach the first difference after it).
MAX_ROWS = 20


@dataclass(frozen=True)
class Desync:
    """Why a job can never finish: ``summary`` (one line) and ``detail`` (the streams).
    ``final``: every stuck collective waits on a gone peer that never issued it (see the
    module docstring): no time condition is needed to know it."""

    summary: str
    detail: str
    final: bool = False


@dataclass(frozen=True)
class _Stuck:
    rank: int
    launch: Launch
    why: str
    #: It waits on a gone peer that never issued it: nothing can change that.
    final: bool = False


def diagnose(flights: dict[int, RankFlight], live: Iterable[int], gone: dict[int, str],
             untraced: dict[int, str] | None = None) -> Desync | None:
    """A desync if every live rank waits in collectives none of which can complete.

    ``flights``: every rank's collectives in the job so far. ``live``: the ranks that have
    not answered. ``gone``: the ranks that have, with what they did ("finished the job",
    "raised", "died"): they will issue nothing more. ``untraced``: live ranks with nothing
    pending in the trace whose stack shows them waiting in a collective all the same (on a
    group created outside the tracing backend), with where: they wait, and issue nothing
    the others wait for. At least one traced collective must be stuck: the trace is the
    evidence.
    """
    live = sorted(live)
    untraced = untraced or {}
    if not live:
        return None
    stuck: list[_Stuck] = []
    for rank in live:
        pending = flights[rank].pending()
        if not pending:
            if rank in untraced:
                continue
            return None  # computing, or waiting in something the trace does not see
        for launch in pending:
            why = _why_stuck(rank, launch, flights, set(live), gone, untraced)
            if why is None:
                return None  # this one can complete: the rank may move on
            stuck.append(_Stuck(rank, launch, *why))
    if not stuck:
        return None
    found = _describe(stuck, flights, gone, {r: w for r, w in untraced.items() if r in live})
    final = not untraced and all(s.final for s in stuck)
    return Desync(found.summary, found.detail, final) if final else found


def creation_hang(live: Iterable[int], gone: dict[int, str],
                  creating: dict[int, str]) -> Desync | None:
    """A job that can never finish because every live rank waits to create a process group
    (``creating``: where, from its stack) while some rank of the job has answered (``gone``):
    that rank creates no group any more, and a group is created by all of its ranks
    together (torch: every rank of the group calls ``new_group``, in the same order). Called
    once nothing has moved for the quiet period; the trace has nothing pending to show."""
    live = sorted(live)
    if not gone or not live or any(r not in creating for r in live):
        return None
    said = [f"rank {r} waits in process-group creation at {creating[r]}" for r in live]
    said += [f"rank {r} {what}" for r, what in sorted(gone.items())]
    return Desync("desync: " + "; ".join(said) + " (a group created on some of its ranks "
                  "only: every rank of a group must create it)", "")


def _why_stuck(rank: int, launch: Launch, flights: dict[int, RankFlight], live: set[int],
               gone: dict[int, str], untraced: dict[int, str]) -> tuple[str, bool] | None:
    """Why ``launch`` (pending on ``rank``) can never complete, and whether that is final
    (a gone peer never issued it); None if it still may."""
    if launch.kind in POINT_TO_POINT:
        return None
    members = flights[rank].members.get(launch.group)
    if not members:
        return None
    waits_for = []
    for peer in members:
        if peer == rank:
            continue
        if peer not in flights:
            return None
        theirs = flights[peer].at(launch.group, launch.seq)
        if theirs is not None:
            if not theirs.matches(launch):
                return (f"rank {peer} issued {theirs.describe()} at #{launch.seq} "
                        f"({theirs.where()})"), False
            continue
        if peer in gone:
            return f"rank {peer} never issued #{launch.seq}: it {gone[peer]}", True
        if peer not in live:
            return None
        if peer in untraced:
            return (f"rank {peer} never issued #{launch.seq}: it waits in a collective the "
                    f"trace does not see, at {untraced[peer]}"), False
        waits_for.append(peer)
    if waits_for:
        who = ", ".join(map(str, waits_for))
        return f"rank {who} has not issued #{launch.seq} and waits in a collective itself", False
    return None


def _describe(stuck: list[_Stuck], flights: dict[int, RankFlight], gone: dict[int, str],
              untraced: dict[int, str]) -> Desync:
    first_per_rank: dict[int, _Stuck] = {}
    for s in stuck:
        first_per_rank.setdefault(s.rank, s)
    said = [f"rank {s.rank} waits in {s.launch.describe()} #{s.launch.seq} of group "
            f"{s.launch.group} ({s.launch.where()})" for s in first_per_rank.values()]
    said += [f"rank {r} waits in an untraced collective at {where}"
             for r, where in sorted(untraced.items())]
    # Who left is news; a peer's different collective is already in its own "waits in".
    said += list(dict.fromkeys(s.why for s in first_per_rank.values()
                               if "never issued" in s.why and "trace does not see" not in s.why))
    groups = list(dict.fromkeys(s.launch.group for s in first_per_rank.values()))
    differs = {g: first_difference(g, flights) for g in groups}
    apart = {g: first_out_of_step(g, flights) for g in groups}
    apart = {g: seq for g, seq in apart.items() if seq and (not differs[g] or seq < differs[g])}
    where = ", ".join(f"#{differs[g]} of group {g}" for g in groups if differs[g] and g not in apart)
    if where:
        said.append(f"the streams differ first at {where}")
    # Where the ranks went out of step explains the rest: it leads the line.
    summary = "desync: " + "; ".join([*(out_of_step_clause(g, apart[g], flights) for g in apart),
                                      *said])
    gone_note = [f"rank {r} {what}" for r, what in sorted(gone.items())]
    detail = "\n\n".join(
        streams(g, flights, apart.get(g) or differs[g]
                or min(s.launch.seq for s in stuck if s.launch.group == g),
                gone, through=differs[g]) for g in groups)
    if gone_note:
        detail += "\n\n" + "; ".join(gone_note) + " (issues nothing more)"
    return Desync(summary, detail)


def mismatch(flights: dict[int, RankFlight]) -> Desync | None:
    """Where two ranks issued different collectives at the same sequence number of a group
    (whatever else happened): the evidence behind a rank that died or raised inside Gloo
    (mismatched collectives on one Gloo group abort the process)."""
    for group in dict.fromkeys(g for f in flights.values() for g in f.groups):
        members = _members(group, flights)
        last = max((flights[m].last_seq(group) for m in members), default=0)
        for seq in range(1, last + 1):
            issued = [(m, c) for m in members if (c := flights[m].at(group, seq)) is not None]
            if not issued:
                continue
            (m0, c0), *others = issued
            differing = [(m, c) for m, c in others if not c.matches(c0)]
            if differing:
                m1, c1 = differing[0]
                summary = (f"the collective streams differ at #{seq} of group {group}: rank "
                           f"{m0} issued {c0.describe()} ({c0.where()}), rank {m1} issued "
                           f"{c1.describe()} ({c1.where()})")
                return Desync(summary, streams(group, flights, seq))
    return None


def first_difference(group: str, flights: dict[int, RankFlight]) -> int:
    """The first sequence number where the group's members issued different collectives
    (or some issued one and some not); 0 where their streams agree so far."""
    return _first_seq(group, flights, _mismatched)


def first_out_of_step(group: str, flights: dict[int, RankFlight]) -> int:
    """The first sequence number of ``group`` where its members issued collectives from
    different training steps (or microbatches), or different collectives, or not all issued
    one: where the ranks went out of step (0: nowhere yet). Matching collectives issued a
    step apart pair up in Gloo all the same, so this can come before
    :func:`first_difference`. What carries no step of the training loop is never "out of
    step": the constructor's collectives (no step), and Join's shadowing (a joined rank
    shadows the others' steps with counters of its own)."""
    return _first_seq(group, flights, lambda launches: _mismatched(launches) or _apart(launches))


def _first_seq(group: str, flights: dict[int, RankFlight],
               differ: Callable[[list[Launch]], bool]) -> int:
    """The first sequence number of ``group`` where some member has issued nothing, or
    where ``differ`` holds of the members' collectives; 0 for none."""
    members = _members(group, flights)
    last = max((flights[m].last_seq(group) for m in members), default=0)
    for seq in range(1, last + 1):
        launches = [flights[m].at(group, seq) for m in members]
        issued = [c for c in launches if c is not None]
        if len(issued) < len(launches) or differ(issued):
            return seq
    return 0


def _mismatched(launches: list[Launch]) -> bool:
    """Collectives that cannot pair up (:meth:`Launch.matches`)."""
    return not all(c.matches(launches[0]) for c in launches[1:])


def _apart(launches: list[Launch]) -> bool:
    """Collectives issued from different places of the training loop (:func:`_place`)."""
    places = {p for c in launches if (p := _place(c)) is not None}
    steps = {step for step, _ in places}
    return len(steps) > 1 or (len(places) > 1 and all(mb is not None for _, mb in places))


def _place(launch: Launch) -> tuple[int, int | None] | None:
    """Where in the training loop ``launch`` was issued: (step, microbatch or None); None
    for a collective outside it (the constructor's, Join's shadowing)."""
    if launch.step < 0 or launch.stage == "join":
        return None
    return launch.step, launch.microbatch if launch.microbatch >= 0 else None


def out_of_step_clause(group: str, seq: int, flights: dict[int, RankFlight]) -> str:
    """"the ranks went out of step at #8 of group 0 (rank 0 at step 0, microbatch 0,
    backward; rank 1 at step 1, microbatch 0, backward)": where each member issued ``seq``
    (ranks that issued it at the same place named together)."""
    at: dict[str, list[int]] = {}
    for m in _members(group, flights):
        c = flights[m].at(group, seq)
        at.setdefault("had not issued it" if c is None else f"at {c.where()}", []).append(m)
    places = "; ".join(f"rank{'s' if len(ms) > 1 else ''} {', '.join(map(str, ms))} {where}"
                       for where, ms in at.items())
    return f"the ranks went out of step at #{seq} of group {group} ({places})"


def streams(group: str, flights: dict[int, RankFlight], start: int,
            gone: dict[int, str] | None = None, through: int = 0) -> str:
    """The group's members' collective streams side by side, from a little before
    ``start``; ``>>`` marks ``start``, ``[waits]`` a collective still pending. The window
    reaches ``through`` as well (at most :data:`MAX_ROWS` rows past ``start``)."""
    members = _members(group, flights)
    gone = gone or {}
    last = max((flights[m].last_seq(group) for m in members), default=0)
    lo = max(1, start - CONTEXT_ROWS)
    hi = min(last, max(start + AFTER_ROWS, min(through, start + MAX_ROWS)))
    header = [f"rank {m}" + (f" ({gone[m]})" if m in gone else "") for m in members]
    table = [header]
    for seq in range(lo, hi + 1):
        cells = []
        for m in members:
            c = flights[m].at(group, seq)
            cells.append("(nothing)" if c is None else
                         f"{c.describe()} {c.where()}" + ("" if c.done else " [waits]"))
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(members))]
    lines = [f"group {group} (ranks {', '.join(map(str, members))}), "
             f"collectives #{lo}-#{hi} of {last}:"]
    for i, row in enumerate(table):
        mark = "      " if i == 0 else (">>" if lo + i - 1 == start else "  ") + f"{lo + i - 1:>4}"
        text = " | ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True))
        lines.append(f"{mark}  {text}".rstrip())
    return "\n".join(lines)


def _members(group: str, flights: dict[int, RankFlight]) -> list[int]:
    for flight in flights.values():
        if group in flight.members:
            return [m for m in flight.members[group] if m in flights]
    return sorted(r for r, f in flights.items() if group in f.groups)
