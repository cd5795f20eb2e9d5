"""A candidate's diagnosis: the few causes that explain most of its unexpected verdicts.

Only unexpected verdicts count (FAIL, ERROR, TIMEOUT, CRASH: an XFAIL the expectations file
lists is accepted, a PASS or N/A fails nothing); a candidate with none has no finding. Each
case's cause (``Result.cause``, from :mod:`.case` or :mod:`.endings`) is counted under its
code; findings are ordered by the cases they explain, most first; among equals a
cause read from values or traces before one read from how the case ended (an ERROR, CRASH
or TIMEOUT often follows from a feature the candidate lacks), ``unexplained`` last. A finding
says where it shows (scenario families) and where it does not (families whose cases ran
and showed another cause or none), the smallest case to look at first (the quickest to
run, then the shortest id) and the command that writes its reproducer.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from ddp_conformance.judge.diagnose.causes import ENDINGS, CaseCause, Cause
from ddp_conformance.judge.verdict import Result, Verdict

#: The words the ``**kwargs`` note of a case carries (``contract.ddp_like.THROUGH_KWARGS``).
KWARGS_MARK = "**kwargs"


@dataclass
class Finding:
    """One cause of a candidate's unexpected verdicts."""

    code: str
    summary: str
    cases: int
    first_case: str
    repro: str
    case_ids: list[str] = field(default_factory=list)
    families: list[str] = field(default_factory=list)
    not_in: list[str] = field(default_factory=list)
    #: Cases per first failing check (or verdict, for an ERROR, CRASH, TIMEOUT).
    checks: dict[str, int] = field(default_factory=dict)
    #: Said where every case of the finding set an option taken only through ``**kwargs``.
    note: str = ""


@dataclass
class Diagnosis:
    """The findings of one candidate, most explanatory first."""

    candidate: str
    unexpected: int
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"type": "diagnosis", "candidate": self.candidate, "unexpected": self.unexpected,
                "findings": [asdict(f) for f in self.findings]}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Diagnosis:
        known = set(Finding.__dataclass_fields__)
        return Diagnosis(str(data.get("candidate", "")), int(data.get("unexpected", 0)),
                         [Finding(**{k: v for k, v in f.items() if k in known})
                          for f in data.get("findings", [])])


def case_cause(result: Result) -> CaseCause:
    """The cause a result carries; an unexpected one without any is ``unexplained``, with
    its line as the evidence."""
    found = CaseCause.from_json(result.cause)
    return found if found is not None else CaseCause(Cause.UNEXPLAINED, result.summary_line())


def family(scenario: str) -> str:
    return scenario.split("/", 1)[0]


def first_check(result: Result) -> str:
    """What a case failed first: its first failure's check, or its verdict."""
    return result.failures[0].check if result.failures else result.verdict.value


def diagnose(results: list[Result]) -> list[Diagnosis]:
    """One diagnosis per candidate, in the order candidates first appear."""
    by_candidate: dict[str, list[Result]] = {}
    for r in results:
        by_candidate.setdefault(r.candidate, []).append(r)
    return [_diagnose_one(name, rs) for name, rs in by_candidate.items()]


def _diagnose_one(candidate: str, results: list[Result]) -> Diagnosis:
    unexpected = [r for r in results if r.verdict.unexpected]
    groups: dict[str, list[tuple[Result, CaseCause]]] = {}
    for r in unexpected:
        cause = case_cause(r)
        groups.setdefault(str(cause.code), []).append((r, cause))
    ran = {family(r.scenario) for r in results if r.verdict is not Verdict.NA}
    findings = [_finding(code, members, ran) for code, members in groups.items()]
    findings.sort(key=lambda f: (-f.cases, f.code == str(Cause.UNEXPLAINED),
                                 f.code in ENDINGS, f.code))
    return Diagnosis(candidate, len(unexpected), findings)


def _finding(code: str, members: list[tuple[Result, CaseCause]], ran: set[str]) -> Finding:
    members.sort(key=lambda m: (m[0].duration_s, len(m[0].scenario), m[0].scenario))
    first, cause = members[0]
    families = sorted({family(r.scenario) for r, _ in members})
    checks = Counter(first_check(r) for r, _ in members)
    notes = [next((n for n in r.notes if KWARGS_MARK in n), "") for r, _ in members]
    return Finding(
        code=code, summary=cause.relation, cases=len(members), first_case=first.case_id,
        repro=repro_command(first), case_ids=[r.case_id for r, _ in members],
        families=families, not_in=sorted(ran - set(families)), checks=dict(checks.most_common()),
        note=notes[0] if all(notes) else "")


def repro_command(result: Result) -> str:
    """The command that writes the standalone reproducer of ``result``."""
    return (f"ddp-conformance repro {result.scenario} --candidate {result.candidate} "
            f"--world-size {result.world_size}")


def not_applicable_groups(results: list[Result]) -> list[tuple[str, str, int, str]]:
    """N/A cases grouped by what they lack: (candidate, reason, count, code: the cause
    code, ``unsupported-feature`` for a capability the candidate lacks, else ''), most
    first."""
    counts = Counter((r.candidate, r.reason, r.cause.get("code", ""))
                     for r in results if r.verdict is Verdict.NA)
    return [(c, reason, n, code) for (c, reason, code), n in
            sorted(counts.items(), key=lambda kv: (kv[0][0], -kv[1], kv[0][1]))]
