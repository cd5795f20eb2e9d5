"""A failing case's error-per-step plot as inline SVG: max abs error per step, per
parameter, against the oracle (solid) and the reference DDP (dashed), log scale, one
panel per quantity (grad, param, buffer) that has a failing figure.

Drawn by hand, not by matplotlib: a matplotlib figure takes 0.3 s to several seconds
(text layout, on a loaded machine), so a run that fails in 100 cases spent most of a
minute on its plots and outlasted the 30 s an interrupted run has to write its reports.
This costs milliseconds a case, so every failing case gets its plot. Plain SVG elements
only (no script, no external reference): the report stays self-contained.

Drawn small, since a run can fail in a hundred cases: whole-pixel coordinates, shared
attributes on groups, the grid as one path, no marker per point, the worst
:data:`MAX_LINES` parameters, and no ``param`` panel beside a failing ``grad`` one (a
parameter is the optimizer applied to its gradient: its error is the gradient's effect).
Every text is at least 10 px. Errors a log scale cannot draw (inf, NaN) are said in the
panel, never left as a blank axis.
"""
from __future__ import annotations

import html
import math

from ddp_conformance.judge.verdict import Result

FLOOR = 1e-12  # zero error drawn here on the log scale
#: Parameters drawn per panel: the worst ones (by peak error over oracle and reference).
MAX_LINES = 6
QUANTITIES = ("grad", "param", "buffer")
AGAINST = (("oracle", ""), ("reference", "4 3"))  # (who, stroke-dasharray)
#: matplotlib's tab10, the colours of the report's other plots.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
# Panel geometry, in px: plot area, margins (left for the tick labels), legend rows.
WIDTH, HEIGHT = 300, 150
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 24, 34
#: The smallest text (ticks, legend), and a legend row's height.
FONT_PX = 10
LEGEND_ROW = 14
LABEL_CHARS = 22  # a legend label's characters in half a panel's width at 10 px

Series = dict[tuple[str, str], dict[int, float]]


def error_series(result: Result, quantity: str) -> Series:
    """``{(against, parameter): {step: max abs error over ranks}}`` for oracle/reference."""
    series: Series = {}
    for g in result.figures:
        who, _, what = g.check.partition(".")
        if what != quantity or who not in ("oracle", "reference") or g.step < 0:
            continue
        s = series.setdefault((who, g.name), {})
        value = g.max_abs
        # NaN never wins a max(): a NaN on one rank must stay visible as non-finite.
        s[g.step] = value if value != value else max(s.get(g.step, 0.0), value)
    return series


def failing_quantities(result: Result) -> list[str]:
    """The quantities with a failing figure against the oracle or the reference, less
    ``param`` where ``grad`` fails too: the panels of :func:`error_per_step` (none: no
    plot)."""
    failing = {g.check.partition(".")[2] for g in result.figures
               if not g.passed and g.check.partition(".")[0] in ("oracle", "reference")}
    if "grad" in failing:
        failing.discard("param")
    return [q for q in QUANTITIES if q in failing]


def worst_names(series: Series) -> list[str]:
    """The parameters of ``series``, worst peak error first (a non-finite one worst), at
    most :data:`MAX_LINES`."""
    peak: dict[str, float] = {}
    for (_, name), steps in series.items():
        values = [math.inf if not math.isfinite(v) else v for v in steps.values()]
        peak[name] = max([peak.get(name, 0.0), *values])
    return sorted(peak, key=lambda n: (-peak[n], n))[:MAX_LINES]


def _log(x: float) -> float:
    return math.log10(max(x, FLOOR))


def finite(points: dict[int, float]) -> dict[int, float]:
    """The points a log scale can draw (as matplotlib, inf and NaN are left out)."""
    return {s: v for s, v in points.items() if math.isfinite(v)}


def non_finite_note(series: Series, names: list[str], drawn: bool) -> str:
    """What the panel cannot draw: '' when every point is finite."""
    values = [v for (_, n), pts in series.items() if n in names for v in pts.values()]
    bad = [v for v in values if not math.isfinite(v)]
    if not bad:
        return ""
    kinds = " or ".join(k for k, hit in (("inf", any(v == v for v in bad)),
                                         ("NaN", any(v != v for v in bad))) if hit)
    if not drawn:
        return f"every error is {kinds}: nothing to draw on a log scale"
    return f"{len(bad)} error(s) {kinds}, not drawn"


class _Axes:
    """The panel's scales: step to x, error to y (log), whole pixels."""

    def __init__(self, drawn: dict[tuple[str, str], dict[int, float]], x0: int) -> None:
        self.steps = sorted({s for pts in drawn.values() for s in pts}) or [0]
        logs = [_log(v) for pts in drawn.values() for v in pts.values()] or [0.0]
        self.lo, hi = math.floor(min(logs)), math.ceil(max(logs))
        self.hi = hi if hi > self.lo else self.lo + 1
        self.s_lo = self.steps[0]
        self.s_hi = self.steps[-1] if self.steps[-1] > self.steps[0] else self.steps[0] + 1
        self.left, self.top = x0 + LEFT, TOP

    def x(self, step: float) -> int:
        return round(self.left + (step - self.s_lo) / (self.s_hi - self.s_lo) * WIDTH)

    def y(self, value: float) -> int:
        return round(self.top + (self.hi - _log(value)) / (self.hi - self.lo) * HEIGHT)


def _frame(quantity: str, ax: _Axes, x0: int, note: str) -> list[str]:
    """Title, box, decade grid and labels, step labels, axis titles, the non-finite note."""
    left, top = ax.left, ax.top
    out = [f'<text x="{left + WIDTH // 2}" y="{top - 8}" text-anchor="middle" '
           f'font-size="12">{quantity}: error per step</text>',
           f'<rect x="{left}" y="{top}" width="{WIDTH}" height="{HEIGHT}" fill="none" '
           'stroke="#999"/>']
    every = max(1, math.ceil((ax.hi - ax.lo) / 6))  # at most about 6 decade labels
    decades = range(ax.lo, ax.hi + 1, every)
    ys = [round(top + (ax.hi - d) / (ax.hi - ax.lo) * HEIGHT) for d in decades]
    out.append('<path stroke="#e5e5e5" d="' + "".join(f"M{left} {y}h{WIDTH}" for y in ys) + '"/>')
    out.append('<g text-anchor="end">' + "".join(
        f'<text x="{left - 4}" y="{y + 3}">1e{d}</text>' for d, y in zip(decades, ys, strict=True))
        + "</g>")
    stride = max(1, math.ceil(len(ax.steps) / 10))  # at most about 10 step labels
    out.append('<g text-anchor="middle">' + "".join(
        f'<text x="{ax.x(s)}" y="{top + HEIGHT + 13}">{s}</text>' for s in ax.steps[::stride])
        + f'<text x="{left + WIDTH // 2}" y="{top + HEIGHT + 27}">step</text>'
        f'<text x="{x0 + 11}" y="{top + HEIGHT // 2}" transform="rotate(-90 {x0 + 11} '
        f'{top + HEIGHT // 2})">max abs error</text></g>')
    if note:
        out.append(f'<text x="{left + WIDTH // 2}" y="{top + (HEIGHT // 2 if "every" in note else 14)}"'
                   f' text-anchor="middle" fill="#c62828">{html.escape(note)}</text>')
    return out


def panel(quantity: str, series: Series, x0: int) -> tuple[list[str], int]:
    """The SVG elements of one panel whose left edge is at ``x0``; and its height."""
    names = worst_names(series)
    drawn = {(who, n): finite(series[(who, n)]) for n in names for who, _ in AGAINST
             if finite(series.get((who, n), {}))}
    ax = _Axes(drawn, x0)
    out = _frame(quantity, ax, x0, non_finite_note(series, names, bool(drawn)))
    legend_y = ax.top + HEIGHT + BOTTOM + 6
    legend = [_swatch(lx, legend_y, "#444", dash, f"vs {who}")
              for (who, dash), lx in zip(AGAINST, (ax.left, ax.left + WIDTH // 2), strict=True)]
    lines = []
    for i, name in enumerate(names):
        colour = COLOURS[i % len(COLOURS)]
        for who, dash in AGAINST:
            pts = sorted(drawn.get((who, name), {}).items())
            if not pts:
                continue
            dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
            tip = f"<title>{html.escape(name)} vs {who}</title>"
            if len(pts) == 1:  # one point is no line: a dot
                lines.append(f'<circle cx="{ax.x(pts[0][0])}" cy="{ax.y(pts[0][1])}" r="2.5" '
                             f'fill="{colour}">{tip}</circle>')
                continue
            coords = " ".join(f"{ax.x(s)},{ax.y(v)}" for s, v in pts)
            lines.append(f'<polyline points="{coords}" stroke="{colour}"{dash_attr}>{tip}'
                         "</polyline>")
        legend.append(_swatch(ax.left + (i % 2) * (WIDTH // 2),
                              legend_y + (1 + i // 2) * LEGEND_ROW, colour, "", name))
    out.append('<g fill="none" stroke-width="1.5">' + "".join(lines) + "</g>")
    out += legend
    return out, legend_y + (1 + math.ceil(len(names) / 2)) * LEGEND_ROW


def _swatch(lx: int, ly: int, colour: str, dash: str, label: str) -> str:
    """A legend entry: a short line and its label (cut to fit half a panel; the whole
    label is its tooltip)."""
    dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
    shown = label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "\u2026"
    tip = f"<title>{html.escape(label)}</title>" if shown != label else ""
    return (f'<path d="M{lx} {ly - 4}h18" stroke="{colour}" stroke-width="1.5"{dash_attr}/>'
            f'<text x="{lx + 22}" y="{ly}">{html.escape(shown)}{tip}</text>')


def error_per_step(result: Result) -> str | None:
    """The plot as one ``<svg>`` element, or None when no figure against the oracle or
    the reference failed."""
    quantities = failing_quantities(result)
    if not quantities:
        return None
    elements: list[str] = []
    height = 0
    pitch = LEFT + WIDTH + RIGHT
    for i, quantity in enumerate(quantities):
        drawn, bottom = panel(quantity, error_series(result, quantity), i * pitch)
        elements += drawn
        height = max(height, bottom)
    width = pitch * len(quantities)
    title = html.escape(f"error per step of {result.case_id}")
    return (f'<svg role="img" width="{width}" height="{height + 4}" '
            f'viewBox="0 0 {width} {height + 4}" font-family="sans-serif" '
            f'font-size="{FONT_PX}"><title>{title}</title>' + "".join(elements) + "</svg>")
