"""Verdicts and the records a run produces for each (scenario, candidate).

docs/CONTRACT.md, "Verdicts and exit codes": PASS, FAIL (a check failed: which check, rank,
parameter, by how much), ERROR (the candidate raised: each rank's traceback), TIMEOUT (no
progress within the deadline: every rank's stack), CRASH (a rank died: its exit code or
signal), N/A (a capability is missing), XFAIL / XPASS (the owner's expectations file).
"""
from __future__ import annotations

import enum
import re
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

#: Columns of a wrapped rule (terminal and summary.md); continuation lines are indented
#: under the rule's first word.
RULE_WIDTH = 96
RULE_LABEL = "rule: "


class Verdict(str, enum.Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    CRASH = "CRASH"
    NA = "N/A"
    XFAIL = "XFAIL"
    XPASS = "XPASS"

    @property
    def unexpected(self) -> bool:
        """True for the verdicts that make ``ddp-conformance run`` exit 1.

        XPASS is reported (the expectations file is stale) but fails nothing, as a
        non-strict xfail in pytest.
        """
        return self in (Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT, Verdict.CRASH)


@dataclass
class Figure:
    """One comparison of one tensor: a check, at one step on one rank, for one parameter.

    ``max_abs``/``max_rel``/``max_ulp`` describe the candidate's distance from the expected
    tensor; ``tolerance`` is the bound the check applied (0 for a bitwise check).
    """

    check: str
    step: int
    rank: int
    name: str
    passed: bool
    max_abs: float
    max_rel: float
    max_ulp: float
    tolerance: float
    detail: str = ""


@dataclass
class CheckFailure:
    """The first evidence a check found: what a person needs to locate the defect."""

    check: str
    message: str
    step: int | None = None
    rank: int | None = None
    name: str | None = None
    #: Longer evidence shown verbatim (e.g. two collective sequences side by side).
    detail: str = ""


@dataclass
class BackendComparison:
    """The same case run on a second backend in the same run (``--compare-backend``).

    ``verdict``: the case's verdict there; ``max_abs``: the largest difference between
    the two runs' gradients, parameters and buffers (every step, every rank; None when
    either run produced no records); ``bitwise``: every compared tensor identical;
    ``first_difference``: where they first differ.
    """

    backend: str
    verdict: str
    max_abs: float | None = None
    bitwise: bool | None = None
    compared: int = 0
    first_difference: str = ""


@dataclass
class Result:
    """Everything known about one (scenario, candidate) run."""

    scenario: str
    candidate: str
    verdict: Verdict
    world_size: int
    backend: str
    device: str
    duration_s: float = 0.0
    reason: str = ""
    failures: list[CheckFailure] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    tracebacks: dict[int, str] = field(default_factory=dict)
    stacks: dict[int, str] = field(default_factory=dict)
    exit_codes: dict[int, int] = field(default_factory=dict)
    expectation: str | None = None
    checks_run: list[str] = field(default_factory=list)
    #: Findings that fail nothing (checks outside the candidate's profile, skipped comparisons).
    notes: list[str] = field(default_factory=list)
    #: Which repeat of ``--repeat N`` produced it (0-based).
    repeat: int = 0
    #: Seconds per phase of the case (:data:`ddp_conformance.judge.costs.COLUMNS`: handover,
    #: wrap, steps, record, transfer, reference, oracle, checks, other); they add up to
    #: ``duration_s``. Empty in results written before costs were measured.
    costs: dict[str, float] = field(default_factory=dict)
    #: For a TIMEOUT diagnosed as a desync: the ranks' collective streams side by side.
    desync: str = ""
    #: The same case on the comparison backend (None: not compared).
    comparison: BackendComparison | None = None
    #: The DDP rule the scenario checks (``Scenario.rule``; '' for collective cases and
    #: results written before rules existed).
    rule: str = ""
    #: The upstream bugs the scenario guards (``Scenario.guards``: ``owner/repo#N``).
    guards: list[str] = field(default_factory=list)
    #: The cause of an unexpected verdict (``code``, ``relation``, ``check``:
    #: :class:`ddp_conformance.judge.diagnose.case.CaseCause`); empty: none diagnosed.
    cause: dict[str, str] = field(default_factory=dict)

    @property
    def case_id(self) -> str:
        return f"{self.scenario}[{self.candidate}]"

    def summary_line(self) -> str:
        """One line saying why: the reason, or the first failure's message followed by the
        first message of every other rank whose failure of that check differs (more than
        in its numbers: the same failure with other figures is not repeated)."""
        if not self.failures:
            return self.reason
        first = self.failures[0]
        messages, seen = [first.message], {first.rank, None}
        shapes = {_shape(first.message)}
        for failure in self.failures[1:]:
            if failure.check != first.check or failure.rank in seen:
                continue
            seen.add(failure.rank)
            if _shape(failure.message) not in shapes:
                shapes.add(_shape(failure.message))
                messages.append(failure.message)
        return "; ".join(messages)

    def explanation_lines(self, width: int = RULE_WIDTH) -> list[str]:
        """The lines printed under a case's verdict line: its cause (``[code] relation``,
        :mod:`ddp_conformance.judge.diagnose`) when diagnosed, then why
        (:meth:`summary_line`), or for an XPASS the expectation that no longer holds,
        then for a failure of the scenario (FAIL, ERROR, TIMEOUT, CRASH, XFAIL) the DDP
        rule: the failing check's when the scenario's rule is about something else
        (:func:`~ddp_conformance.judge.check_rules.shown_rule`), wrapped to ``width``
        columns. Never an empty line."""
        why = self.summary_line()
        if self.verdict is Verdict.XPASS:
            why = f"passed, though expected to fail ({self.expectation}): the expectation is stale"
        lines = [why] if why else []
        if self.cause and self.verdict is not Verdict.XPASS:
            relation = self.cause.get("relation", "")
            head = f"[{self.cause.get('code', '')}] {relation or why}"
            lines = [head] + [line for line in lines if line not in relation]
        if self.rule and (self.verdict.unexpected or self.verdict is Verdict.XFAIL):
            from ddp_conformance.judge.check_rules import shown_rule

            check = self.failures[0].check if self.failures else ""
            lines += rule_lines(shown_rule(self.rule, check), width)
        return lines

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["verdict"] = self.verdict.value
        return data




def rule_lines(rule: str, width: int = RULE_WIDTH) -> list[str]:
    """``rule: <the rule>`` wrapped to ``width`` columns, continuation lines aligned."""
    return textwrap.wrap(RULE_LABEL + rule, width, subsequent_indent=" " * len(RULE_LABEL),
                         break_long_words=False, break_on_hyphens=False)


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _shape(message: str) -> str:
    """A failure message with its numbers (ranks, steps, figures) left out."""
    return _NUMBER.sub("#", message)
