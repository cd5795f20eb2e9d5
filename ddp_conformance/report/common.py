"""Tables and figures shared by every renderer (Markdown, HTML, JUnit, compare)."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ddp_conformance.config import RunConfig
from ddp_conformance.judge.costs import COLUMNS
from ddp_conformance.judge.verdict import Figure, Result, Verdict

#: Verdict order in tables and counts, best first.
VERDICT_ORDER = [v.value for v in (Verdict.PASS, Verdict.XFAIL, Verdict.XPASS, Verdict.NA,
                                   Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT, Verdict.CRASH)]


def count_verdicts(results: Iterable[Result]) -> Counter[str]:
    return Counter(r.verdict.value for r in results)


def counts_line(counts: Counter[str] | dict[str, int]) -> str:
    order = {v: i for i, v in enumerate(VERDICT_ORDER)}
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: order.get(kv[0], 99)))


def verdict_matrix(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """Scenario x candidate table of verdicts."""
    candidates = list(dict.fromkeys(r.candidate for r in results))
    scenarios = list(dict.fromkeys(r.scenario for r in results))
    cell = {(r.scenario, r.candidate): r.verdict.value for r in results}
    rows = [[s, *(cell.get((s, c), "") for c in candidates)] for s in scenarios]
    return ["scenario", *candidates], rows


def fmt(x: float | None, digits: int = 3) -> str:
    """A float for a table: '0', '1.23e-05', 'nan', '-'."""
    if x is None:
        return "-"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.{digits}g}"
    return f"{x:.{max(1, digits - 1)}e}"


def against(check: str) -> str:
    """Whom a check compares with: 'oracle', 'reference', 'replica', 'init', 'trace'."""
    return check.split(".", 1)[0]


@dataclass
class Divergence:
    """Where one check of one case first failed, and by how much (worst over all steps)."""

    check: str
    first_step: int | None
    ranks: list[int]
    names: list[str]
    message: str
    max_abs: float | None = None
    max_rel: float | None = None
    max_ulp: float | None = None
    tolerance: float | None = None
    failing_figures: int = 0
    details: list[str] = field(default_factory=list)


def divergences(result: Result) -> list[Divergence]:
    """Per failed check: first step, ranks and parameters at that step, worst figures.

    Figures give the numbers; failures without figures (``*.grad_none``, ``trace.*``,
    shape or name mismatches) give the step, rank and name they carry.
    """
    out: list[Divergence] = []
    checks = list(dict.fromkeys(f.check for f in result.failures))
    for check in checks:
        fails = [f for f in result.failures if f.check == check]
        bad = [g for g in result.figures if g.check == check and not g.passed]
        steps = [g.step for g in bad] + [f.step for f in fails if f.step is not None]
        first = min(steps) if steps else None
        at_first_fig = [g for g in bad if g.step == first]
        at_first_fail = [f for f in fails if f.step == first]
        ranks = sorted({g.rank for g in at_first_fig} | {f.rank for f in at_first_fail if f.rank is not None})
        names = list(dict.fromkeys([g.name for g in at_first_fig]
                                   + [f.name for f in at_first_fail if f.name]))
        first_fail = at_first_fail[0] if at_first_fail else fails[0]
        d = Divergence(check, first, ranks, names, first_fail.message, failing_figures=len(bad))
        if bad:
            d.max_abs = max(g.max_abs for g in bad)
            d.max_rel = max(g.max_rel for g in bad)
            d.max_ulp = max(g.max_ulp for g in bad)
            d.tolerance = bad[0].tolerance
        d.details = list(dict.fromkeys(g.detail for g in bad if g.detail))
        d.details += [text for f in fails
                      for text in (getattr(f, "detail", ""), f.message if "\n" in f.message else "") if text]
        d.details = list(dict.fromkeys(d.details))
        out.append(d)
    return out


def per_parameter(figures: list[Figure]) -> list[list[str]]:
    """Per check and parameter, worst over steps and ranks: abs, rel, ULP, tolerance, status.

    One pass over the figures (a failing run has tens of thousands); "worst" is Python's
    ``max`` in figure order (a later value replaces the held one only when greater)."""
    worst: dict[tuple[str, str], list[float]] = {}
    for g in figures:
        w = worst.get((g.check, g.name))
        if w is None:
            worst[(g.check, g.name)] = [g.max_abs, g.max_rel, g.max_ulp, g.tolerance,
                                        float(not g.passed), 1.0]
            continue
        if g.max_abs > w[0]:
            w[0] = g.max_abs
        if g.max_rel > w[1]:
            w[1] = g.max_rel
        if g.max_ulp > w[2]:
            w[2] = g.max_ulp
        w[4] += not g.passed
        w[5] += 1
    rows = []
    for (check, name), w in sorted(worst.items(), key=lambda kv: (against(kv[0][0]), kv[0])):
        failed, total = int(w[4]), int(w[5])
        rows.append([check, name, fmt(w[0]), fmt(w[1]), fmt(w[2], 4), fmt(w[3]),
                     "ok" if not failed else f"{failed}/{total} failed"])
    return rows


PER_PARAMETER_HEADER = ["check", "parameter", "max abs", "max rel", "max ULP", "tolerance (rtol)",
                        "status"]
DIVERGENCE_HEADER = ["check", "first step", "rank(s)", "parameter(s)", "max abs", "max rel",
                     "max ULP", "tolerance (rtol)"]


def divergence_row(d: Divergence, max_names: int = 4) -> list[str]:
    names = ", ".join(d.names[:max_names]) + (f" (+{len(d.names) - max_names})"
                                              if len(d.names) > max_names else "")
    return [d.check, "init" if d.first_step == -1 else ("-" if d.first_step is None else str(d.first_step)),
            ", ".join(map(str, d.ranks)) or "-", names or "-", fmt(d.max_abs), fmt(d.max_rel),
            fmt(d.max_ulp, 4), "bitwise" if d.tolerance == 0 else fmt(d.tolerance)]


#: How many slowest cases the summaries list when the run info does not say (results
#: written before ``--durations`` existed).
DEFAULT_SLOWEST = RunConfig.durations


def slowest_count(info: dict[str, Any] | None) -> int:
    """How many slowest cases to list: the run's ``--durations`` (0: every case)."""
    value = (info or {}).get("durations", DEFAULT_SLOWEST)
    return value if isinstance(value, int) and value >= 0 else DEFAULT_SLOWEST


def slowest_cases(results: list[Result], n: int) -> tuple[list[str], list[list[str]]]:
    """The ``n`` slowest cases (0: all), slowest first: case, verdict, seconds, then the
    seconds of every cost column (:data:`~ddp_conformance.judge.costs.COLUMNS`) when a
    listed case has costs ('-' for one without: a result written before costs existed);
    ``comparison`` only in a run that compared backends."""
    ranked = sorted(results, key=lambda r: r.duration_s, reverse=True)
    listed = ranked[:n] if n else ranked
    compared = any(r.comparison is not None for r in results)
    columns = tuple(c for c in COLUMNS if c != "comparison" or compared) \
        if any(r.costs for r in listed) else ()
    header = ["case", "verdict", "seconds", *columns]
    rows = [[_case_label(r), r.verdict.value, f"{r.duration_s:.3f}",
             *(f"{r.costs[c]:.3f}" if c in r.costs else "-" for c in columns)] for r in listed]
    return header, rows


def _case_label(r: Result) -> str:
    return r.case_id + (f" (repeat {r.repeat + 1})" if r.repeat else "")


def time_shares(results: list[Result]) -> list[tuple[str, float, float]]:
    """Where the run's time went, over every case with costs: (column, seconds, share of
    all their costs), largest first; columns no case spent time in are left out."""
    totals = {c: sum(r.costs.get(c, 0.0) for r in results) for c in COLUMNS}
    whole = sum(totals.values())
    if whole <= 0:
        return []
    shares = [(c, s, s / whole) for c, s in totals.items() if s > 0]
    return sorted(shares, key=lambda t: t[1], reverse=True)


def time_shares_line(results: list[Result]) -> str:
    """``steps 41% · reference 22% · ...`` ('' when no case has costs)."""
    return " · ".join(f"{c} {_percent(share)}" for c, _, share in time_shares(results))


def _percent(share: float) -> str:
    return "<1%" if share < 0.005 else f"{share:.0%}"


def slowest_intro(results: list[Result], n: int) -> str:
    """The sentence above the slowest cases' table."""
    total = len(results)
    listed = min(n, total) if n else total
    what = (f"The {listed} slowest of {total} cases" if listed < total
            else "The one case" if total == 1 else f"All {total} cases, slowest first")
    seconds = sum(r.duration_s for r in results)
    return (f"{what} ({seconds:.1f} s in all), seconds per phase. The reference DDP's run and "
            "the oracle are cached per scenario: each is charged to the case that ran it.")


COMPARISON_HEADER_TAIL = ["bitwise", "max abs difference", "first difference"]


def backend_comparison(results: list[Result]) -> tuple[str, list[str], list[list[str]]] | None:
    """The backend comparison (``--compare-backend``): an intro line, a header and one row
    per compared case (scenario, candidate, both verdicts, whether every gradient,
    parameter and buffer was bitwise identical, the largest difference, where they first
    differ); None when the run compared nothing."""
    compared = [r for r in results if r.comparison is not None]
    if not compared:
        return None
    ours, theirs = compared[0].backend, compared[0].comparison.backend  # type: ignore[union-attr]
    rows, same, verdicts_differ = [], 0, 0
    for r in compared:
        c = r.comparison
        assert c is not None
        same += bool(c.bitwise)
        verdicts_differ += _plain(r.verdict.value) != _plain(c.verdict)
        bitwise = "-" if c.bitwise is None else "yes" if c.bitwise else "no"
        rows.append([r.scenario, r.candidate, r.verdict.value, c.verdict, bitwise,
                     fmt(c.max_abs), c.first_difference])
    intro = (f"Every scenario also ran on {theirs}, same candidate, same data: {same} of "
             f"{len(compared)} gave bitwise identical gradients, parameters and buffers on "
             f"every rank and step; the verdicts differ in {verdicts_differ}.")
    return intro, ["scenario", "candidate", ours, theirs, *COMPARISON_HEADER_TAIL], rows


def _plain(verdict: str) -> str:
    """A verdict without the expectations file's say (XFAIL is a FAIL, XPASS a PASS)."""
    return {"XFAIL": "FAIL", "XPASS": "PASS"}.get(verdict, verdict)
