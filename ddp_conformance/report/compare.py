"""``ddp-conformance report --compare OLD NEW``: what changed between two runs, for CI.

Verdicts: a case *regressed* when its new verdict is unexpected (FAIL, ERROR, TIMEOUT,
CRASH) and its old one was not, or when it is new and fails. Timings (``bench.json``):
a (model, candidate) step time moved *significantly* when the difference of the medians
exceeds the sum of the two interquartile ranges (each run's own measured noise). The
exit status is 1 when a verdict regressed or a timing got significantly slower.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tabulate import tabulate

from ddp_conformance.bench.stats import flat, quartiles
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.verdict import Verdict

from .load import BENCH_FILE, RESULTS_FILE, load_bench, load_results

UNEXPECTED = {v.value for v in Verdict if v.unexpected}


@dataclass
class VerdictChange:
    case: str
    old: str | None
    new: str | None
    kind: str  # regressed | improved | changed | new | gone


@dataclass
class TimingChange:
    model: str
    candidate: str
    old: tuple[float, float, float]
    new: tuple[float, float, float]
    kind: str  # slower | faster | within noise

    @property
    def change(self) -> float:
        return self.new[0] / self.old[0] - 1.0

    @property
    def noise(self) -> float:
        return (self.old[2] - self.old[1]) + (self.new[2] - self.new[1])


@dataclass
class Comparison:
    verdicts: list[VerdictChange] = field(default_factory=list)
    timings: list[TimingChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> list[VerdictChange]:
        return [c for c in self.verdicts if c.kind == "regressed"]

    @property
    def slower(self) -> list[TimingChange]:
        return [t for t in self.timings if t.kind == "slower"]

    @property
    def failed(self) -> bool:
        return bool(self.regressed or self.slower)


def classify_verdict(old: str | None, new: str | None) -> str | None:
    """How a case's verdict moved; None when it did not."""
    if old == new:
        return None
    if new is None:
        return "gone"
    if old is None:
        return "regressed" if new in UNEXPECTED else "new"
    if new in UNEXPECTED and old not in UNEXPECTED:
        return "regressed"
    if old in UNEXPECTED and new not in UNEXPECTED:
        return "improved"
    return "changed"


def classify_timing(old: tuple[float, float, float], new: tuple[float, float, float]) -> str:
    """'slower'/'faster' when the medians differ by more than the two IQRs together."""
    noise = (old[2] - old[1]) + (new[2] - new[1])
    diff = new[0] - old[0]
    if diff > noise:
        return "slower"
    if -diff > noise:
        return "faster"
    return "within noise"


def compare_verdicts(old: dict[str, str], new: dict[str, str]) -> list[VerdictChange]:
    out = []
    for case in list(dict.fromkeys([*old, *new])):
        kind = classify_verdict(old.get(case), new.get(case))
        if kind:
            out.append(VerdictChange(case, old.get(case), new.get(case), kind))
    order = ["regressed", "improved", "changed", "new", "gone"]
    return sorted(out, key=lambda c: order.index(c.kind))


def step_stats(bench: dict[str, Any]) -> dict[tuple[str, str], tuple[float, float, float]]:
    out = {}
    for model in (bench.get("timing") or {}).get("models", {}).values():
        for cand, c in model["candidates"].items():
            out[(model["model"], cand)] = quartiles(flat(c["rounds"]))
    return out


def compare_timings(old: dict[str, Any], new: dict[str, Any]) -> list[TimingChange]:
    a, b = step_stats(old), step_stats(new)
    return [TimingChange(m, c, a[(m, c)], b[(m, c)], classify_timing(a[(m, c)], b[(m, c)]))
            for (m, c) in a if (m, c) in b]


def _verdicts(path: str) -> dict[str, str] | None:
    file = os.path.join(path, RESULTS_FILE) if os.path.isdir(path) else path
    if os.path.isdir(path) and not os.path.exists(file):
        return None
    if not os.path.isdir(path) and not path.endswith(".jsonl"):
        return None
    return {r.case_id: r.verdict.value for r in load_results(path).results}


def compare_dirs(old: str, new: str) -> Comparison:
    for path in (old, new):
        if not os.path.exists(path):
            raise UsageError(f"cannot compare: {path!r} does not exist")
    comp = Comparison()
    va, vb = _verdicts(old), _verdicts(new)
    if va is not None and vb is not None:
        comp.verdicts = compare_verdicts(va, vb)
    else:
        comp.notes.append(f"verdicts not compared: {RESULTS_FILE} missing in "
                          f"{old if va is None else new}")
    ba, bb = load_bench(old), load_bench(new)
    if ba and bb:
        comp.timings = compare_timings(ba, bb)
        if not comp.timings:
            comp.notes.append("timings not compared: no (model, candidate) timed in both")
    else:
        comp.notes.append(f"timings not compared: {BENCH_FILE} missing in {old if not ba else new}")
    if va is None and vb is None and not (ba and bb):
        raise UsageError(f"nothing to compare in {old!r} and {new!r}: neither has both "
                         f"{RESULTS_FILE} or {BENCH_FILE}")
    return comp


def format_comparison(comp: Comparison) -> str:
    lines = []
    if comp.verdicts:
        lines += ["Verdict changes:", tabulate([[c.kind, c.case, c.old or "-", c.new or "-"]
                                                for c in comp.verdicts],
                                               ["change", "case", "old", "new"], tablefmt="simple"), ""]
    else:
        lines += ["Verdicts: no change", ""]
    if comp.timings:
        lines += ["Step times (median [IQR] ms; significant when |change| > sum of IQRs):",
                  tabulate([[t.model, t.candidate, _ms(t.old), _ms(t.new), f"{t.change:+.1%}",
                             f"{t.noise * 1e3:.2f}", t.kind] for t in comp.timings],
                           ["model", "candidate", "old", "new", "change", "noise ms", "verdict"],
                           tablefmt="simple"), ""]
    lines += [f"note: {n}" for n in comp.notes]
    regressed, slower = len(comp.regressed), len(comp.slower)
    lines.append(f"{regressed} verdict(s) regressed, {slower} timing(s) significantly slower: "
                 + ("FAIL" if comp.failed else "OK"))
    return "\n".join(lines)


def _ms(s: tuple[float, float, float]) -> str:
    return f"{s[0] * 1e3:.2f} [{s[1] * 1e3:.2f}-{s[2] * 1e3:.2f}]"
