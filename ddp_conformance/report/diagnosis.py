"""The diagnosis in words: what every report opens on, in the same order everywhere.

The reading order of every report (terminal, ``summary.md``, ``report.html``, pytest's
terminal summary): the diagnosis per candidate, then the unexpected verdicts grouped by
cause and counted by check, then N/A grouped by what is missing, then the matrix; the
closing line counts verdicts in :data:`CLOSING_ORDER`.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ddp_conformance.judge.diagnose.findings import (
    Diagnosis,
    case_cause,
    first_check,
    not_applicable_groups,
)
from ddp_conformance.judge.verdict import Result, Verdict

#: The closing line's order: what needs work first.
CLOSING_ORDER = [v.value for v in (Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT, Verdict.CRASH,
                                   Verdict.NA, Verdict.XFAIL, Verdict.XPASS, Verdict.PASS)]
#: Case ids listed per cause before "... and N more".
MAX_IDS = 6
BY_CHECK_HEADER = ["check (first failed)", "cases", "causes"]


def closing_counts(counts: Counter[str] | dict[str, int]) -> str:
    """``FAIL 122, ERROR 15, N/A 10, PASS 188``: counts in :data:`CLOSING_ORDER`."""
    order = {v: i for i, v in enumerate(CLOSING_ORDER)}
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(),
                                                   key=lambda kv: order.get(kv[0], 99)))


def diagnosis_lines(diagnoses: Iterable[Diagnosis], markdown: bool = False) -> list[str]:
    """Per candidate with unexpected verdicts, its findings, most explanatory first."""
    code = (lambda s: f"`{s}`") if markdown else (lambda s: s)
    lines: list[str] = []
    for d in diagnoses:
        if not d.findings:
            continue
        lines.append(f"diagnosis of {code(d.candidate)}: {len(d.findings)} cause"
                     f"{'' if len(d.findings) == 1 else 's'} for {d.unexpected} unexpected "
                     f"verdict{'' if d.unexpected == 1 else 's'}")
        for i, f in enumerate(d.findings, 1):
            lines.append(f"  {i}. {code(f.code)} ({f.cases} case{'' if f.cases == 1 else 's'}): "
                         f"{f.summary}")
            where = f"shows in {', '.join(f.families)}"
            if f.not_in:
                where += f"; not in {', '.join(f.not_in[:8])}" + (" ..." if len(f.not_in) > 8
                                                                 else "")
            lines.append(f"     {where}")
            lines.append(f"     look first at {code(f.first_case)}: {code(f.repro)}")
            if f.note:
                lines.append(f"     note: {f.note}")
    return lines


def by_cause_lines(results: list[Result], markdown: bool = False) -> list[str]:
    """The unexpected verdicts grouped by candidate and cause, their case ids."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if r.verdict.unexpected:
            groups.setdefault((r.candidate, str(case_cause(r).code)), []).append(r.case_id)
    lines = []
    for (_, code), ids in groups.items():
        shown = ", ".join(f"`{i}`" if markdown else i for i in ids[:MAX_IDS])
        more = f" ... and {len(ids) - MAX_IDS} more" if len(ids) > MAX_IDS else ""
        lines.append(f"{code} ({len(ids)}): {shown}{more}")
    return lines


def by_check_rows(results: list[Result]) -> list[list[str]]:
    """One row per first failing check (or verdict): how many unexpected cases, by cause."""
    counts: Counter[str] = Counter()
    causes: dict[str, Counter[str]] = {}
    for r in results:
        if r.verdict.unexpected:
            check = first_check(r)
            counts[check] += 1
            causes.setdefault(check, Counter())[str(case_cause(r).code)] += 1
    return [[check, str(n), ", ".join(f"{c} {k}" for c, k in causes[check].most_common())]
            for check, n in counts.most_common()]


def not_applicable_lines(results: list[Result], markdown: bool = False) -> list[str]:
    """N/A cases grouped by what they lack (capability, world size, backend)."""
    return [f"{f'`{c}`' if markdown else c}: {n} N/A{f' ({code})' if code else ''}: {reason}"
            for c, reason, n, code in not_applicable_groups(results)]


def opening_lines(results: list[Result], diagnoses: list[Diagnosis] | None = None) -> list[str]:
    """What a closing block shows before the matrix (plain text): the diagnosis, the
    unexpected verdicts by cause, the by-check table, N/A grouped. Empty sections are left
    out; a run with no unexpected verdict and no N/A has none."""
    from tabulate import tabulate

    from ddp_conformance.judge.diagnose.findings import diagnose

    lines = diagnosis_lines(diagnoses if diagnoses is not None else diagnose(results))
    causes = by_cause_lines(results)
    if causes:
        lines += ["", "unexpected verdicts by cause:"] + [f"  {line}" for line in causes]
        lines += ["", tabulate(by_check_rows(results), BY_CHECK_HEADER, tablefmt="simple",
                               disable_numparse=True)]
    na = not_applicable_lines(results)
    if na:
        lines += ["", "not applicable, by what is missing:"] + [f"  {line}" for line in na]
    return lines + ([""] if lines else [])


def closing_line(results: list[Result], diagnoses: list[Diagnosis] | None = None,
                 after_counts: str = "") -> str:
    """The verdict counts in :data:`CLOSING_ORDER`, ``after_counts`` (the run's time...),
    and each candidate's first cause when there is one."""
    from ddp_conformance.judge.diagnose.findings import diagnose

    line = closing_counts(Counter(r.verdict.value for r in results)) + after_counts
    top = [(d.candidate, d.findings[0]) for d in (diagnoses if diagnoses is not None
                                                   else diagnose(results)) if d.findings]
    if top:
        line += "; first cause: " + "; ".join(f"{f.code} ({f.cases} of {c}'s cases)"
                                              for c, f in top)
    return line
