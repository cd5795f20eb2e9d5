"""The reference DDP's runs of one run: each scenario run once with the reference, its
records shared by every candidate compared with it, its failures said loudly.

With ``compare_with_reference`` a candidate's records are judged against the reference
DDP's on the same scenario (``reference/``). The reference does not depend on the
candidate, so :class:`ReferenceCache` runs it once per scenario, on the run's pool, when
the first case of that scenario needs it, and charges the job to that case's
``reference`` cost. A run of the reference made for that comparison is also the reference
candidate's own case, if the run has one (:meth:`ReferenceCache.claim`), once.

When the reference cannot run a scenario, the cases that needed it say so: a note
(:attr:`ReferenceCache.notes`), and, for a failed run (ERROR, TIMEOUT, CRASH), its result
with its tracebacks and stacks (:attr:`ReferenceCache.failures`), which
:meth:`ReferenceCache.explain` attaches to the case.
"""
from __future__ import annotations

from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.costs import CostMeter
from ddp_conformance.judge.failures import failed_run
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.ranks.leaks import LeakLedger
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.pool import Pool
from ddp_conformance.ranks.records import RankRecord

#: The reference DDP's candidate spec.
REFERENCE = "reference"

Records = dict[int, RankRecord]


class ReferenceCache:
    """The reference's records per scenario id, run on ``pool`` for ``world_size`` ranks of
    ``backend`` on ``device_kind``; what they left in the ranks goes to ``leaks``."""

    def __init__(self, pool: Pool, world_size: int, backend: str, device_kind: str,
                 leaks: LeakLedger) -> None:
        self._pool = pool
        self._world_size, self._backend, self._device_kind = world_size, backend, device_kind
        self._leaks = leaks
        self._records: dict[str, Records | None] = {}
        #: Reference runs made for comparison and not yet used as the reference candidate's
        #: own case: taken once (a later ``--repeat`` runs the reference candidate afresh).
        self._unclaimed: dict[str, Records] = {}
        #: Why the reference gave no records for a scenario, by scenario id.
        self.notes: dict[str, str] = {}
        #: The reference DDP's own failed runs (ERROR, TIMEOUT or CRASH, with tracebacks or
        #: stacks), by scenario id: each makes the cases that needed it say so loudly.
        self.failures: dict[str, Result] = {}

    def claim(self, scenario_id: str) -> Records | None:
        """The records of a reference run made for comparison, for the reference
        candidate's own case of the same scenario (the very same job); None when there is
        none, or when it was claimed already."""
        return self._unclaimed.pop(scenario_id, None)

    def keep(self, scenario_id: str, records: Records) -> None:
        """Keep the reference candidate's own records of a scenario for the cases compared
        with it later in the run."""
        self._records[scenario_id] = records

    def records(self, scenario: Scenario, timeout_s: float, job: Job,
                costs: CostMeter) -> Records | None:
        """The reference's records for ``scenario``, ``job`` run once per run (its time
        charged to ``costs``' reference), or None where it could not run the scenario or
        does not apply (the reason then in :attr:`notes`, a failed run in
        :attr:`failures`)."""
        if scenario.id not in self._records:
            with costs.timing("reference"):  # charged to the case that runs it
                out = self._pool.run(job, timeout_s)
                self._leaks.record(REFERENCE, out.hygiene)
            records: Records | None = out.results if out.status == "done" else None
            na = sorted({r.not_applicable for r in (records or {}).values() if r.not_applicable})
            if records is None:
                failed = failed_run(Result(scenario.id, REFERENCE, Verdict.ERROR,
                                           self._world_size, self._backend,
                                           self._device_kind), out, timeout_s)
                self.failures[scenario.id] = failed
                self.notes[scenario.id] = (
                    f"the reference DDP could not run it: {failed.verdict.value}: "
                    f"{failed.reason}")
            elif na:
                records = None
                self.notes[scenario.id] = (
                    f"the reference DDP does not apply here: {'; '.join(na)}")
            else:
                self._unclaimed[scenario.id] = records
            self._records[scenario.id] = records
        return self._records[scenario.id]

    def explain(self, result: Result, scenario_id: str, compared: bool) -> None:
        """Add to a case's ``result`` what the reference's run of its scenario said: the
        failed run, loudly, when the case was not ``compared`` with it; else its note."""
        if scenario_id in self.failures and not compared:
            without_reference(result, self.failures[scenario_id])
        elif scenario_id in self.notes:
            result.notes.append(self.notes[scenario_id])

    def summary(self) -> list[str]:
        """The run-level word on the reference DDP: said when it was needed and ran
        nothing."""
        asked = len(self._records)
        ran = sum(records is not None for records in self._records.values())
        if asked and not ran:
            return [f"the reference DDP ran none of the {asked} scenario"
                    f"{'' if asked == 1 else 's'} it was needed for: no case was compared "
                    f"with it"]
        return []


def without_reference(result: Result, failed: Result) -> None:
    """Make ``result`` say, loudly, that the reference DDP could not run its scenario.

    The checks against the reference were not applied, so a case that otherwise
    passed is an ERROR (the harness's, not the candidate's: the reason says whose);
    a FAIL stays a FAIL. Either way the reference's own evidence (its tracebacks,
    stacks, exit codes) comes with it, each marked as the reference's.
    """
    why = (f"the reference DDP could not run this scenario, so the candidate was not "
           f"compared with it: reference {failed.verdict.value}: {failed.reason}")
    if result.verdict is Verdict.PASS:
        result.verdict, result.reason = Verdict.ERROR, why
    else:
        result.notes.append(why)
    mark = "(the reference DDP's, not the candidate's)\n"
    for rank, text in failed.tracebacks.items():
        result.tracebacks.setdefault(rank, mark + text)
    for rank, text in failed.stacks.items():
        result.stacks.setdefault(rank, mark + text)
    result.desync = result.desync or failed.desync
