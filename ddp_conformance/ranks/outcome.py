"""How one job ended on the ranks, as the transport saw it (before any verdict).

:class:`Outcome` is filled by a transport (the rank pool, or torchrun's store) and turned
into a verdict by the judge (:mod:`ddp_conformance.judge.failures`): ``done`` (every rank
answered), ``raised`` (some rank raised), ``timeout`` (the deadline passed), ``crash`` (a
rank process died).
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from ddp_conformance.ranks.communicator import CommState
from ddp_conformance.ranks.desync import Desync
from ddp_conformance.ranks.leaks import Hygiene
from ddp_conformance.ranks.messages import Answer, Done


@dataclass
class Outcome:
    """How one job ended on the pool (see the module docstring)."""

    status: str  # done | raised | timeout | crash
    results: dict[int, Any] = field(default_factory=dict)
    tracebacks: dict[int, str] = field(default_factory=dict)
    released: set[int] = field(default_factory=set)
    stacks: dict[int, str] = field(default_factory=dict)
    exit_codes: dict[int, int] = field(default_factory=dict)
    logs: dict[int, str] = field(default_factory=dict)
    elapsed_s: float = 0.0
    #: Seconds spent before the job reached the ranks: starting the pool, or replacing
    #: ranks that left after the previous job (a hand-over from the spare, or a start).
    handover_s: float = 0.0
    #: What the ranks' collective streams say: on ``timeout``, why they could never
    #: match again (who waits in what); on ``crash``/``raised``, where they differed.
    desync: Desync | None = None
    #: Each rank's default group after the job, where it reported one (Done answers of a
    #: job that named a communicator).
    communicators: dict[int, CommState] = field(default_factory=dict)
    #: What the job left in each rank that found anything (ranks/hygiene.py).
    hygiene: dict[int, Hygiene] = field(default_factory=dict)
    #: Why the job was not run at all ('' : it ran): the fail-fast rule
    #: (:mod:`ddp_conformance.ranks.endings`) gave it its candidate's repeated ending.
    not_run: str = ""

    def record(self, answer: Answer) -> bool:
        """Keep one rank's answer; True when the rank itself failed (a traceback that is
        not only the echo of a peer's failure)."""
        if answer.hygiene:
            self.hygiene[answer.rank] = answer.hygiene
        if isinstance(answer, Done):
            self.results[answer.rank] = answer.result
            if answer.communicator is not None:
                self.communicators[answer.rank] = answer.communicator
            return False
        self.tracebacks[answer.rank] = answer.traceback
        if answer.released:
            self.released.add(answer.rank)
            return False
        return True


def describe_exit(code: int) -> str:
    """Say how a process ended: 'exit code 3' or 'signal SIGSEGV (11)'."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "signal"
        return f"signal {name} ({-code})"
    return f"exit code {code}"


def describe_outcome(out: Outcome) -> str:
    """A readable account of a job that did not end with every rank done."""
    lines = [f"job ended: {out.status}"]
    for rank, code in sorted(out.exit_codes.items()):
        lines.append(f"rank {rank} died with {describe_exit(code)}\n{out.logs.get(rank, '')}")
    for rank, tb in sorted(out.tracebacks.items()):
        lines.append(f"rank {rank} raised:\n{tb}")
    for rank, stack in sorted(out.stacks.items()):
        lines.append(f"rank {rank} stack:\n{stack}")
    return "\n".join(lines)
