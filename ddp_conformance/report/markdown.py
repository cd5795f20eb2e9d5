"""``summary.md``: run info, verdict matrix, and per failure what a person needs to fix it."""
from __future__ import annotations

from typing import Any

from tabulate import tabulate

from ddp_conformance.judge.check_rules import shown_rule
from ddp_conformance.judge.diagnose.findings import case_cause, diagnose
from ddp_conformance.judge.verdict import RULE_LABEL, Result, Verdict

from .common import (
    DIVERGENCE_HEADER,
    backend_comparison,
    count_verdicts,
    divergence_row,
    divergences,
    slowest_cases,
    slowest_count,
    slowest_intro,
    time_shares_line,
    verdict_matrix,
)
from .coverage import HEADER as COVERAGE_HEADER
from .coverage import intro as coverage_intro
from .coverage import rows as coverage_rows
from .diagnosis import (
    BY_CHECK_HEADER,
    by_check_rows,
    closing_counts,
    diagnosis_lines,
    not_applicable_lines,
)
from .timing import timing_markdown

MAX_TRACE_LINES = 40


def git_line(state: dict[str, Any] | None) -> str:
    if not state:
        return "not in a git checkout"
    return f"{state['commit'][:12]}{' (dirty)' if state.get('dirty') else ''}"


def run_header(info: dict[str, Any]) -> list[str]:
    lines = [f"torch {info.get('torch')}, backend {info.get('backend')}, device "
             f"{info.get('device')}, world size {info.get('world_size')}, {info.get('cpu_count')} "
             f"CPUs, started {info.get('started')}"]
    if "project_git" in info:
        lines.append(f"ddp-conformance at {git_line(info['project_git'])}")
    if info.get("backend_spec"):
        lines.append(f"backend `{info['backend']}` registered by `{info['backend_spec']}`")
    if info.get("compare_backend"):
        lines.append(f"every scenario compared with backend {info['compare_backend']}")
    for c in info.get("candidates", []):
        extra = f", git {git_line(c['git'])}" if "git" in c else ""
        version = f" {c['version']}" if c.get("version") else ""
        lines.append(f"candidate `{c['name']}`{version}{extra}")
    return lines


def _tail(text: str, limit: int = MAX_TRACE_LINES) -> str:
    lines = text.rstrip().splitlines()
    return "\n".join((["..."] if len(lines) > limit else []) + lines[-limit:])


def case_markdown(r: Result) -> list[str]:
    said = r.explanation_lines()
    rule_at = next((i for i, line in enumerate(said) if line.startswith(RULE_LABEL)), len(said))
    why = said[:rule_at] or [""]
    # A Markdown line break (two spaces) between the lines, none after the last.
    lines = [f"#### {r.verdict.value} `{r.case_id}`", "", *(f"{line}  " for line in why[:-1]),
             why[-1], ""]
    if r.rule:
        rule = shown_rule(r.rule, r.failures[0].check if r.failures else "")
        lines += [f"**Rule:** {rule}", ""]
    if r.guards:
        lines += [f"**Guards:** {', '.join(r.guards)}", ""]
    lines += [f"Note: {note}" for note in r.notes] + ([""] if r.notes else [])
    if r.expectation:
        lines += [f"Expected to fail: {r.expectation}", ""]
    divs = divergences(r)
    if divs:
        lines += [tabulate([divergence_row(d) for d in divs], DIVERGENCE_HEADER, tablefmt="github"), ""]
        for d in divs:
            for detail in d.details[:2]:
                lines += [f"`{d.check}`:", "", "```", detail.rstrip(), "```", ""]
    if r.desync:
        lines += ["The ranks' collective streams:", "", "```", r.desync.rstrip(), "```", ""]
    for kind, texts in (("traceback", r.tracebacks), ("stack", r.stacks)):
        for rank, text in sorted(texts.items()):
            lines += [f"rank {rank} {kind}:", "", "```", _tail(text), "```", ""]
    for rank, code in sorted(r.exit_codes.items()):
        from ddp_conformance.ranks.outcome import describe_exit

        lines += [f"rank {rank} ended with {describe_exit(code)}", ""]
    return lines


def slowest_markdown(results: list[Result], n: int) -> list[str]:
    """'## Slowest cases': the ``n`` slowest (0: all) with their costs per phase, and the
    run's shares per phase (none for results written before costs were measured)."""
    header, rows = slowest_cases(results, n)
    lines = ["## Slowest cases", "", slowest_intro(results, n), ""]
    shares = time_shares_line(results)
    if shares:
        lines += [f"Where the run's time went: {shares}", ""]
    align = ("left", "left", *("right",) * (len(header) - 2))
    return lines + [tabulate(rows, header, tablefmt="github", disable_numparse=True,
                             colalign=align), ""]


def diagnosis_markdown(results: list[Result]) -> list[str]:
    """'## Diagnosis': per candidate the causes of its unexpected verdicts (none: a line
    saying so), then the by-check table."""
    lines = diagnosis_lines(diagnose(results), markdown=True)
    if not lines:
        return ["## Diagnosis", "", "No unexpected verdict: nothing to diagnose.", ""]
    rows = by_check_rows(results)
    return ["## Diagnosis", "", "```", *lines, "```", "",
            "Unexpected verdicts by the check that failed first:", "",
            tabulate(rows, BY_CHECK_HEADER, tablefmt="github", disable_numparse=True), ""]


def failures_markdown(results: list[Result]) -> list[str]:
    """The cases that did not pass: unexpected ones grouped by cause, then the expected
    failures and stale expectations, then N/A grouped by what is missing."""
    lines: list[str] = []
    groups: dict[str, list[Result]] = {}
    for r in results:
        if r.verdict.unexpected:
            groups.setdefault(str(case_cause(r).code), []).append(r)
    if groups:
        lines += ["## Failures by cause", ""]
        for code, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            lines += [f"### `{code}`: {len(members)} case{'' if len(members) == 1 else 's'}", ""]
            for r in members:
                lines += case_markdown(r)
    other = [r for r in results if r.verdict in (Verdict.XFAIL, Verdict.XPASS)]
    if other:
        lines += ["## Expected failures and stale expectations", ""]
        for r in other:
            lines += case_markdown(r)
    na = [r for r in results if r.verdict is Verdict.NA]
    if na:
        lines += ["## Not applicable", ""]
        lines += [f"- {line}" for line in not_applicable_lines(results, markdown=True)] + [""]
    return lines


def incomplete_line(incomplete: str) -> str:
    """The line an interrupted run's summary starts with."""
    return (f"**Incomplete run**: {incomplete}; the verdicts below are the finished cases "
            "only.")


def markdown_summary(info: dict[str, Any], results: list[Result], notes: list[str],
                     bench: dict[str, Any] | None = None, incomplete: str | None = None,
                     coverage: dict[str, Any] | None = None) -> str:
    """The summary; ``incomplete`` (why only the finished cases are there) is said first;
    ``coverage``: the ``--coverage`` section."""
    lines = ["# ddp-conformance summary", ""]
    if incomplete is not None:
        lines += [incomplete_line(incomplete), ""]
    lines += [line + "  " for line in run_header(info)] + [""]
    if results:
        lines += ["Verdicts: " + closing_counts(count_verdicts(results)), ""]
        lines += diagnosis_markdown(results)
    lines += failures_markdown(results)
    if results:
        header, rows = verdict_matrix(results)
        lines += ["## Verdict matrix", "", tabulate(rows, header, tablefmt="github"), ""]
        lines += slowest_markdown(results, slowest_count(info))
        comparison = backend_comparison(results)
        if comparison is not None:
            intro, header, rows = comparison
            lines += [f"## Backend comparison: {header[2]} and {header[3]}", "", intro, "",
                      tabulate(rows, header, tablefmt="github", disable_numparse=True), ""]
    if bench:
        lines += timing_markdown(bench)
    if coverage:
        lines += ["## Coverage", "", coverage_intro(coverage), "",
                  tabulate(coverage_rows(coverage), COVERAGE_HEADER, tablefmt="github",
                           disable_numparse=True), ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)
