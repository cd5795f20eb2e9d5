"""The timing plots as base64 PNG (matplotlib's Agg backend: no display, no network);
a failing case's error-per-step plot is :mod:`.errorplot`'s inline SVG.

matplotlib is optional (the ``plots`` extra): without it every plot here is None, which the
HTML report leaves out, keeping the timing tables."""
from __future__ import annotations

import base64
import functools
import io
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ddp_conformance.bench.stats import quartiles

from .timing import BASELINE, all_rows, breakdown, keyed, model_rows

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:  # the `plots` extra is not installed
    plt = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from matplotlib.figure import Figure as MplFigure

F = TypeVar("F", bound=Callable[..., "str | None"])


def drawn(plot: F) -> F:
    """``plot``, or None when matplotlib is not installed."""
    @functools.wraps(plot)
    def draw(*args: Any, **kwargs: Any) -> str | None:
        return plot(*args, **kwargs) if plt is not None else None

    return draw  # type: ignore[return-value]


def to_png(fig: MplFigure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _ms(x: float) -> float:
    return x * 1e3


@drawn
def step_times(bench: dict[str, Any]) -> str | None:
    """Per model: each candidate's median step time with its IQR as error bars."""
    timing = bench.get("timing") or {}
    models = list(timing.get("models", {}).values())
    if not models:
        return None
    ws = timing.get("info", {}).get("world_size", 2)
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.2), squeeze=False)
    for ax, m in zip(axes[0], models, strict=True):
        rows = model_rows(m, ws)
        names = [r["candidate"] for r in rows]
        meds = [_ms(r["step"][0]) for r in rows]
        err = [[_ms(r["step"][0] - r["step"][1]) for r in rows],
               [_ms(r["step"][2] - r["step"][0]) for r in rows]]
        ax.bar(names, meds, yerr=err, capsize=4,
               color=["#4c72b0" if n == BASELINE else "#dd8452" for n in names])
        for i, r in enumerate(rows):
            if r["ratio"][0] == r["ratio"][0]:
                ax.annotate(f"x{r['ratio'][0]:.2f}", (i, meds[i]), ha="center", va="bottom", fontsize=8,
                            xytext=(0, 8), textcoords="offset points")
        ax.set_title(f"{m['model']} ({m['tensors']} tensors)", fontsize=10)
        ax.set_ylabel("step time, ms (median, IQR)")
    return to_png(fig)


@drawn
def bandwidth(bench: dict[str, Any]) -> str | None:
    """Gradient communication busbw per candidate next to the raw allreduce's."""
    labels, grad, raw = [], [], []
    for r in all_rows(bench):
        if "grad_busbw" in r:
            labels.append(f"{r['model']}\n{r['candidate']}")
            grad.append(r["grad_busbw"] / 1e9)
            raw.append(r["raw_busbw"] / 1e9)
    if not labels:
        return None
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(labels)), 3.2))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], grad, 0.4, label="DDP gradient communication")
    ax.bar([x + 0.2 for x in xs], raw, 0.4, label="raw all_reduce, same bytes")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("busbw, GB/s")
    ax.legend(fontsize=7)
    return to_png(fig)


@drawn
def breakdown_plot(models: list[dict[str, Any]]) -> str | None:
    if not models:
        return None
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models), 3.4), squeeze=False)
    parts = [("forward", "#4c72b0"), ("backward", "#55a868"), ("communication", "#c44e52"),
             ("optimizer", "#8172b3")]
    for ax, m in zip(axes[0], models, strict=True):
        b = breakdown(m)
        names = list(b)
        bottom = [0.0] * len(names)
        for part, colour in parts:
            vals = [_ms(b[n][part]) for n in names]
            ax.bar(names, vals, bottom=bottom, color=colour,
                   label="exposed communication" if part == "communication" else part)
            bottom = [x + y for x, y in zip(bottom, vals, strict=True)]
        raw = quartiles(m.get("raw_allreduce_s", []))[0]
        ax.axhline(_ms(raw), color="k", ls=":", lw=1, label="raw allreduce of the gradients")
        ax.set_title(m["model"], fontsize=10)
        ax.set_ylabel("ms (medians)")
    axes[0][0].legend(fontsize=7)
    return to_png(fig)


@drawn
def experiment_plot(key: str, exp: dict[str, Any]) -> str | None:
    name = key.split(":")[0]
    if name == "breakdown":
        return breakdown_plot(list(exp["data"]["models"].values()))
    data = keyed(exp["data"]["times"])
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    if name in ("bucket-sweep", "no-sync"):
        for cand, pts in data.items():
            xs = sorted(pts, key=float)
            med = [_ms(pts[x][0]) for x in xs]
            lo = [_ms(pts[x][0] - pts[x][1]) for x in xs]
            hi = [_ms(pts[x][2] - pts[x][0]) for x in xs]
            ax.errorbar([float(x) for x in xs], med, yerr=[lo, hi], marker="o", capsize=3, label=cand)
        ax.set_xscale("log", base=2 if name == "no-sync" else 10)
        if name == "no-sync":
            ax.set_xticks([float(x) for x in sorted(next(iter(data.values())), key=float)],
                          [str(x) for x in sorted(next(iter(data.values())), key=float)])
        ax.set_xlabel("bucket_cap_mb" if name == "bucket-sweep" else "synchronise every n iterations")
        ax.set_ylabel("ms per iteration (median, IQR)")
        if name == "bucket-sweep" and "grad_mb" in exp["config"]:
            ax.axvline(exp["config"]["grad_mb"], color="grey", ls=":", lw=1, label="model gradient size")
    else:
        cands = list(data)
        modes = list(dict.fromkeys(x for d in data.values() for x in d))
        width = 0.8 / max(1, len(modes))
        for i, mode in enumerate(modes):
            pos = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(cands))]
            med = [_ms(data[c][mode][0]) for c in cands]
            err = [[_ms(data[c][mode][0] - data[c][mode][1]) for c in cands],
                   [_ms(data[c][mode][2] - data[c][mode][0]) for c in cands]]
            ax.bar(pos, med, width, yerr=err, capsize=3, label=mode)
        ax.set_xticks(list(range(len(cands))), cands)
        ax.set_ylabel("step ms (median, IQR)")
    ax.set_title(f"{name}: model {exp['config'].get('model', '')}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return to_png(fig)


__all__ = ["step_times", "bandwidth", "experiment_plot"]
