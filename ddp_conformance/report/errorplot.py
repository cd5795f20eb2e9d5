"""A failing case's error-per-step plot as inline SVG: max abs error per step, per
parameter, against the oracle (solid) and the reference DDP (dashed), log scale, one
panel per quantity (grad, param, buffer) that has a failing figure.

Drawn by hand, not by matplotlib: a matplotlib figure takes 0.3 s to several seconds
(text layout, on a loaded machine), so a run that fails in 100 cases spent most of a
minute on its plots and outlasted the 30 s an interrupted run has to write its reports.
This costs milliseconds a case, so every failing case gets its plot. Plain SVG elements
only (no script, no external reference): the report stays self-contained.
"""
from __future__ import annotations

import html
import math

from ddp_conformance.judge.verdict import Result

FLOOR = 1e-12  # zero error drawn here on the log scale
#: Parameters drawn per panel: the worst ones (by peak error over oracle and reference).
MAX_LINES = 8
QUANTITIES = ("grad", "param", "buffer")
AGAINST = (("oracle", ""), ("reference", "4 3"))  # (who, stroke-dasharray)
#: matplotlib's tab10, the colours of the report's other plots.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
# Panel geometry, in px: plot area, margins (left for the tick labels), legend rows.
WIDTH, HEIGHT = 300, 170
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 24, 34
LEGEND_ROW = 13
LABEL_CHARS = 26  # a legend label's characters in half a panel's width at 8 px

Series = dict[tuple[str, str], dict[int, float]]


def error_series(result: Result, quantity: str) -> Series:
    """``{(against, parameter): {step: max abs error over ranks}}`` for oracle/reference."""
    series: Series = {}
    for g in result.figures:
        who, _, what = g.check.partition(".")
        if what != quantity or who not in ("oracle", "reference") or g.step < 0:
            continue
        s = series.setdefault((who, g.name), {})
        s[g.step] = max(s.get(g.step, 0.0), g.max_abs)
    return series


def failing_quantities(result: Result) -> list[str]:
    """The quantities with a failing figure against the oracle or the reference: the
    panels of :func:`error_per_step` (none: no plot)."""
    failing = {g.check.partition(".")[2] for g in result.figures
               if not g.passed and g.check.partition(".")[0] in ("oracle", "reference")}
    return [q for q in QUANTITIES if q in failing]


def worst_names(series: Series) -> list[str]:
    """The parameters of ``series``, worst peak error first, at most :data:`MAX_LINES`."""
    peak: dict[str, float] = {}
    for (_, name), steps in series.items():
        peak[name] = max([peak.get(name, 0.0), *(v for v in steps.values() if v == v)])
    return sorted(peak, key=lambda n: (-peak[n], n))[:MAX_LINES]


def _log(x: float) -> float:
    return math.log10(max(x, FLOOR))


def finite(points: dict[int, float]) -> dict[int, float]:
    """The points a log scale can draw (as matplotlib, inf and NaN are left out)."""
    return {s: v for s, v in points.items() if math.isfinite(v)}


def panel(quantity: str, series: Series, x0: float) -> tuple[list[str], float]:
    """The SVG elements of one panel whose left edge is at ``x0``; and its height."""
    names = worst_names(series)
    drawn = {(who, n): finite(series[(who, n)]) for n in names for who, _ in AGAINST
             if finite(series.get((who, n), {}))}
    steps = sorted({s for pts in drawn.values() for s in pts}) or [0]
    logs = [_log(v) for pts in drawn.values() for v in pts.values()] or [0.0]
    lo, hi = math.floor(min(logs)), math.ceil(max(logs))
    hi = hi if hi > lo else lo + 1
    s_lo, s_hi = steps[0], steps[-1] if steps[-1] > steps[0] else steps[0] + 1
    left, top = x0 + LEFT, TOP

    def x(step: float) -> float:
        return left + (step - s_lo) / (s_hi - s_lo) * WIDTH

    def y(value: float) -> float:
        return top + (hi - _log(value)) / (hi - lo) * HEIGHT

    out = [f'<text x="{left + WIDTH / 2:.1f}" y="{top - 8}" text-anchor="middle" '
           f'font-size="12">{quantity}: error per step</text>',
           f'<rect x="{left}" y="{top}" width="{WIDTH}" height="{HEIGHT}" fill="none" '
           'stroke="#999"/>']
    every = max(1, math.ceil((hi - lo) / 8))  # at most about 8 decade labels
    for decade in range(lo, hi + 1, every):
        ty = top + (hi - decade) / (hi - lo) * HEIGHT
        out.append(f'<line x1="{left}" x2="{left + WIDTH}" y1="{ty:.1f}" y2="{ty:.1f}" '
                   'stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 4}" y="{ty + 3:.1f}" text-anchor="end" '
                   f'font-size="9">1e{decade}</text>')
    stride = max(1, math.ceil(len(steps) / 10))  # at most about 10 step labels
    for step in steps[::stride]:
        out.append(f'<text x="{x(step):.1f}" y="{top + HEIGHT + 12}" text-anchor="middle" '
                   f'font-size="9">{step}</text>')
    out.append(f'<text x="{left + WIDTH / 2:.1f}" y="{top + HEIGHT + 25}" text-anchor="middle" '
               'font-size="10">step</text>')
    out.append(f'<text x="{x0 + 11}" y="{top + HEIGHT / 2:.1f}" font-size="10" '
               f'text-anchor="middle" transform="rotate(-90 {x0 + 11} {top + HEIGHT / 2:.1f})">'
               'max abs error (over ranks)</text>')
    legend_y = top + HEIGHT + BOTTOM + 4
    for (who, dash), lx in zip(AGAINST, (left, left + WIDTH / 2), strict=True):
        out.append(_swatch(lx, legend_y, "#444", dash, f"vs {who}"))
    for i, name in enumerate(names):
        colour = COLOURS[i % len(COLOURS)]
        for who, dash in AGAINST:
            pts = drawn.get((who, name))
            if not pts:
                continue
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            coords = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in sorted(pts.items()))
            out.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" '
                       f'stroke-width="1.5"{dash_attr}><title>{html.escape(name)} vs {who}'
                       "</title></polyline>")
            out += [f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="2" fill="{colour}"/>'
                    for s, v in sorted(pts.items())]
        ly = legend_y + (1 + i // 2) * LEGEND_ROW
        out.append(_swatch(left + (i % 2) * (WIDTH / 2), ly, colour, "", name))
    return out, legend_y + (1 + math.ceil(len(names) / 2)) * LEGEND_ROW


def _swatch(lx: float, ly: float, colour: str, dash: str, label: str) -> str:
    """A legend entry: a short line and its label (cut to fit half a panel; the whole
    label is its tooltip)."""
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    shown = label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "\u2026"
    return (f'<line x1="{lx:.1f}" x2="{lx + 18:.1f}" y1="{ly - 3}" y2="{ly - 3}" '
            f'stroke="{colour}" stroke-width="1.5"{dash_attr}/>'
            f'<text x="{lx + 22:.1f}" y="{ly}" font-size="8">{html.escape(shown)}'
            f"<title>{html.escape(label)}</title></text>")


def error_per_step(result: Result) -> str | None:
    """The plot as one ``<svg>`` element, or None when no figure against the oracle or
    the reference failed."""
    quantities = failing_quantities(result)
    if not quantities:
        return None
    elements: list[str] = []
    height = 0.0
    pitch = LEFT + WIDTH + RIGHT
    for i, quantity in enumerate(quantities):
        drawn, bottom = panel(quantity, error_series(result, quantity), i * pitch)
        elements += drawn
        height = max(height, bottom)
    width = pitch * len(quantities)
    title = html.escape(f"error per step of {result.case_id}")
    return (f'<svg role="img" width="{width}" '
            f'height="{height + 4:.0f}" viewBox="0 0 {width} {height + 4:.0f}" '
            f'font-family="sans-serif"><title>{title}</title>'
            + "".join(elements) + "</svg>")
