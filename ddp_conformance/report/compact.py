"""A passing case's record in ``results.jsonl``: its figures as the worst per check and tensor.

A failing case keeps its full evidence (every figure: per step, rank and tensor), for the
report, the diagnosis and a bug report. A case that passed needs less: what the report
shows of it, the worst figure of each check and tensor over steps and ranks
(:func:`~ddp_conformance.report.common.per_parameter`). Its record holds those rows under
:data:`WORST_KEY`, each ``[check, tensor, max abs, max rel, max ULP, tolerance]`` with
:data:`DIGITS` significant digits (the report prints fewer), in place of ``figures``; the
loader turns them back into figures of step and rank -1. An all-PASS catalog run so
writes about a tenth of a megabyte per hundred cases, not megabytes.
"""
from __future__ import annotations

from typing import Any

from ddp_conformance.judge.verdict import Figure, Result, Verdict

#: The key of a passing record's worst figures.
WORST_KEY = "figures_worst"
#: Significant digits kept of a passing case's figures.
DIGITS = 4


def record(result: Result) -> dict[str, Any]:
    """``result`` as a ``results.jsonl`` record: whole, or compact where it passed."""
    data = result.to_json()
    if result.verdict is Verdict.PASS and result.figures:
        del data["figures"]
        data[WORST_KEY] = worst(result.figures)
    return data


def worst(figures: list[Figure]) -> dict[str, Any]:
    """The worst figures per check and tensor (the layout: the module docstring).

    Over steps and ranks, the largest abs, rel and ULP error (a NaN kept: it never loses
    a comparison here, as in the report) and the first tolerance."""
    tensors: dict[str, int] = {}
    checks: dict[str, list[Any]] = {}
    rows: dict[tuple[str, str], list[float]] = {}
    for g in figures:
        row = rows.get((g.check, g.name))
        if row is None:
            tensors.setdefault(g.name, len(tensors))
            checks.setdefault(g.check, [_short(g.tolerance), []])
            rows[(g.check, g.name)] = [g.max_abs, g.max_rel, g.max_ulp, g.tolerance]
            continue
        for i, value in enumerate((g.max_abs, g.max_rel, g.max_ulp)):
            if value != value or value > row[i]:
                row[i] = value
    for (check, name), values in rows.items():
        short = [_short(v) for v in values]
        index, default = tensors[name], checks[check][0]
        if short[3] != default:
            checks[check][1].append([index, *short])
        else:
            checks[check][1].append(index if short[:3] == [0, 0, 0] else [index, *short[:3]])
    return {"tensors": list(tensors), "checks": checks}


def figures_from(data: dict[str, Any]) -> list[Figure]:
    """The figures of a compact record (step and rank -1: the worst over all of them)."""
    names = data["tensors"]
    out = []
    for check, (tolerance, rows) in data["checks"].items():
        for row in rows:
            index, abs_, rel, ulp, tol = [*row, tolerance][:5] if isinstance(row, list) \
                else [row, 0, 0, 0, tolerance]
            out.append(Figure(check, -1, -1, names[index], True, float(abs_), float(rel),
                              float(ulp), float(tol)))
    return out


def _short(value: float) -> float | int:
    """``value`` to :data:`DIGITS` significant digits; an integral one as an int."""
    short = float(f"{value:.{DIGITS}g}")
    return int(short) if short.is_integer() else short
