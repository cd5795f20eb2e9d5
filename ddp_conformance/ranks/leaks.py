"""What a job left behind in a rank, as the rank reports it, and the run's account of it.

After every job a rank of the pool compares its process state with the state it had before
its first job (:mod:`ddp_conformance.ranks.hygiene`) and ends every process the job started
(:mod:`ddp_conformance.ranks.orphans`). It answers with a :class:`Hygiene`: what it put
back, what it could not (the rank then leaves the pool, and the next case runs on a fresh
rank), and which processes it ended. The parent's :class:`LeakLedger` turns those into
notes: one per candidate and kind of change, and a count of ended processes per candidate.
Nothing here imports torch: the messages carry a :class:`Hygiene`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Hygiene:
    """One rank's findings after one job; empty when the job left nothing."""

    #: Changes put back (the rank stays as it was before its first job).
    restored: tuple[str, ...] = ()
    #: Changes that cannot be put back: the rank leaves the pool after answering.
    retired: tuple[str, ...] = ()
    #: Processes the job started and left running, ended by the rank (``"pid 12 (sleep 300)"``).
    ended: tuple[str, ...] = ()

    @property
    def retire(self) -> bool:
        return bool(self.retired)

    def __bool__(self) -> bool:
        return bool(self.restored or self.retired or self.ended)


class LeakLedger:
    """The run's account of what candidates left in the ranks (parent side).

    :meth:`record` is called with every job's per-rank :class:`Hygiene`; it returns the
    note for that case: the changes not yet reported for that candidate (so each candidate
    and change is named once in the run, on the first case that showed it). :meth:`notes`
    are the run-level lines: every candidate that changed anything, with what, and how many
    processes of its were ended.
    """

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, str]] = {}
        self._ended: Counter[str] = Counter()

    def record(self, candidate: str, findings: dict[int, Hygiene]) -> str:
        """Account for one job of ``candidate``; the case's note ('' when nothing new)."""
        seen = self._seen.setdefault(candidate, {})
        new: list[str] = []
        for h in findings.values():
            self._ended[candidate] += len(h.ended)
            for change, action in [*((c, "put back") for c in h.restored),
                                   *((c, "the rank was retired") for c in h.retired)]:
                if change not in seen:
                    seen[change] = action
                    new.append(f"{change} ({action})")
        ended = sum(len(h.ended) for h in findings.values())
        parts = []
        if new:
            parts.append("left in the ranks: " + "; ".join(new))
        if ended:
            examples = sorted({e for h in findings.values() for e in h.ended})[:3]
            parts.append(f"{ended} process(es) it started outlived the job and were ended: "
                         + ", ".join(examples))
        if not seen:
            del self._seen[candidate]
        return f"candidate {candidate} " + "; ".join(parts) if parts else ""

    def notes(self) -> list[str]:
        """One line per candidate that left anything, for the run's notes."""
        lines = []
        for candidate in sorted(set(self._seen) | set(self._ended)):
            changes = self._seen.get(candidate, {})
            parts = [f"{c} ({a})" for c, a in changes.items()]
            if self._ended[candidate]:
                parts.append(f"{self._ended[candidate]} process(es) it started ended after "
                             f"their job")
            if parts:
                lines.append(f"state left by candidate {candidate} (later cases ran as on "
                             f"fresh ranks): " + "; ".join(parts))
        return lines
