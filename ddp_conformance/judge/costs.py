"""Where one case's time went: seconds per phase, measured on the parent and on the ranks.

A case's cost is split into :data:`PHASES`, in the order they happen:

- ``handover``: before the job reached the ranks (starting the pool, or replacing ranks
  that left after the previous job), as the transport reports it;
- ``wrap``, ``steps``, ``record``: on the ranks (:mod:`ddp_conformance.ranks.engine`),
  the slowest rank's seconds per phase: the candidate's wrap, optimizer setup and comm
  hook registration; the training loop with Join's exit; snapshotting parameters and
  gradients for the parent;
- ``transfer``: the job's wall time on the parent less the handover and the slowest
  rank's time in the scenario: process group creation, pickling, messages;
- ``reference``: the reference DDP's job for this scenario, charged to the case that ran
  it (it is cached per scenario);
- ``oracle``: the oracle, charged to the case that computed it (cached per scenario and
  group);
- ``checks``: judging the records;
- ``comparison``: the same case on the comparison backend (``--compare-backend``), its
  own reference and oracle included.

:data:`OTHER` is what no phase explains (the case's duration less the phases' sum, when
positive), so that the costs add up to the case's duration.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

#: The measured phases of one case, in the order they happen.
PHASES: tuple[str, ...] = ("handover", "wrap", "steps", "record", "transfer", "reference",
                           "oracle", "checks", "comparison")
#: The phases a rank measures itself (``RankRecord.times``).
RANK_PHASES: tuple[str, ...] = ("wrap", "steps", "record")
#: The case's duration that no phase explains.
OTHER = "other"
#: Every key of a case's costs, in table order.
COLUMNS: tuple[str, ...] = (*PHASES, OTHER)


class CostMeter:
    """Accumulates one case's seconds per phase; :meth:`finish` closes the account."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        """Charge ``seconds`` (negative counts as 0) to ``phase``."""
        self.seconds[phase] = self.seconds.get(phase, 0.0) + max(0.0, seconds)

    @contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Charge the wall time of the ``with`` block to ``phase``."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - started)

    def add_job(self, wall_s: float, handover_s: float,
                rank_times: Iterable[Mapping[str, float]]) -> None:
        """Charge one job of the candidate that took ``wall_s`` on the parent.

        ``rank_times``: each rank's seconds per phase (empty when no rank answered with
        a record: then only the handover is known, the rest stays unexplained).
        """
        ranks = [dict(t) for t in rank_times]
        self.add("handover", handover_s)
        if not ranks:
            return
        for phase in RANK_PHASES:
            self.add(phase, max(t.get(phase, 0.0) for t in ranks))
        slowest = max(sum(t.values()) for t in ranks)
        self.add("transfer", wall_s - handover_s - slowest)

    def finish(self, duration_s: float) -> dict[str, float]:
        """Every key of :data:`COLUMNS` (0 for phases that did not happen), rounded to the
        microsecond; ``other`` is ``duration_s`` less the phases' sum, when positive."""
        costs = {phase: self.seconds.get(phase, 0.0) for phase in PHASES}
        costs[OTHER] = max(0.0, duration_s - sum(costs.values()))
        return {phase: round(seconds, 6) for phase, seconds in costs.items()}
