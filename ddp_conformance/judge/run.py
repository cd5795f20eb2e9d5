"""Running the checks of one case's DDP group: the one entry point of the judge."""
from __future__ import annotations

from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.checks import check_reference, check_run
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.oracle import OracleRecord
from ddp_conformance.judge.trace_checks import check_trace
from ddp_conformance.ranks.records import RankRecord


def judge_group(evidence: Evidence, scenario: Scenario, records: dict[int, RankRecord],
                oracle: OracleRecord, reference: dict[int, RankRecord] | None, *,
                strict: bool, trace: bool) -> None:
    """Run every check on the records of one DDP group, adding to ``evidence``.

    ``reference``: the reference DDP's records of the same group (None: not compared);
    ``strict``: hold the candidate to torch's bucket layout; ``trace``: the records carry
    a collective trace to check.
    """
    check_run(scenario, records, oracle, evidence)
    if reference is not None:
        check_reference(evidence, scenario, records, reference, oracle)
    if trace:
        check_trace(evidence, scenario, records, oracle, reference, strict)
