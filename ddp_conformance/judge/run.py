"""Running the checks of one case's DDP group: the one entry point of the judge."""
from __future__ import annotations

from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.checks import run_checks
from ddp_conformance.judge.diagnose.case import CaseCause, diagnose_group
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.oracle import OracleRecord
from ddp_conformance.judge.registry import Context
from ddp_conformance.ranks.records import RankRecord


def judge_group(evidence: Evidence, scenario: Scenario, records: dict[int, RankRecord],
                oracle: OracleRecord, reference: dict[int, RankRecord] | None, *,
                strict: bool, trace: bool, strict_messages: bool = False) -> CaseCause | None:
    """Run every registered check (:mod:`ddp_conformance.judge.checks`) on the records of
    one DDP group, adding to ``evidence``.

    ``reference``: the reference DDP's records of the same group (None: not compared);
    ``strict``: hold the candidate to torch's bucket layout and wire dtypes; ``trace``: the
    records carry a collective trace to check; ``strict_messages``: a refusal must carry
    torch's message (``--strict-messages``).

    Returns the cause of what this group failed (:mod:`ddp_conformance.judge.diagnose`),
    None when it failed nothing.
    """
    ctx = Context(scenario, records, oracle, reference, strict, trace, evidence, strict_messages)
    before = len(evidence.failures)
    run_checks(ctx)
    return diagnose_group(ctx) if len(evidence.failures) > before else None
