"""results.jsonl: full evidence for a failing case, a compact record for a passing one."""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from ddp_conformance.judge.verdict import CheckFailure, Figure, Result, Verdict
from ddp_conformance.report import write_report_set
from ddp_conformance.report.common import per_parameter
from ddp_conformance.report.compact import WORST_KEY, record
from ddp_conformance.report.load import load_results, result_from_json
from ddp_conformance.report.stream import ResultsWriter

CHECKS = ("oracle.grad", "reference.grad", "oracle.param", "reference.param", "replica.param",
          "oracle.init")


def _case(verdict: Verdict, steps: int = 4, ranks: int = 2, tensors: int = 24) -> Result:
    """A case as the catalog's larger ones record it: every check, step, rank and tensor."""
    figures = [Figure(check, step, rank, f"layer{t}.weight", verdict is Verdict.PASS,
                      max_abs=1e-7 * (1 + step + t) / (1 + rank), max_rel=3e-7 * (t + 1),
                      max_ulp=float(step + t), tolerance=1.3e-6)
               for check in CHECKS for step in range(steps) for rank in range(ranks)
               for t in range(tensors)]
    failures = [] if verdict is Verdict.PASS else [CheckFailure("oracle.grad", "off", 0, 0)]
    return Result("models/large", "torch", verdict, ranks, "gloo", "cpu", figures=figures,
                  failures=failures, checks_run=list(CHECKS))


def test_a_passing_record_keeps_what_the_report_shows_of_it() -> None:
    case = _case(Verdict.PASS)
    case.figures[5].max_abs = math.nan  # a NaN stays visible as the worst
    for g in case.figures:  # a check over two dtypes: each tensor at its own tolerance
        g.tolerance = 1e-12 if g.name.startswith("layer1") else g.tolerance
        g.max_abs, g.max_rel, g.max_ulp = (0.0, 0.0, 0.0) if g.check == "oracle.init" else \
            (g.max_abs, g.max_rel, g.max_ulp)
    data = json.loads(json.dumps({"type": "result", **record(case)}))
    assert "figures" not in data and len(data[WORST_KEY]["tensors"]) == 24
    back = result_from_json(data)
    full, compact = per_parameter(case.figures), per_parameter(back.figures)
    # The same rows but the "ok" count; the values printed with fewer digits than kept.
    assert [r[:6] for r in compact] == [r[:6] for r in full]
    assert all(r[6] == "ok" for r in compact)


def test_a_failing_record_keeps_every_figure() -> None:
    case = _case(Verdict.FAIL)
    data = record(case)
    assert WORST_KEY not in data and len(data["figures"]) == len(case.figures)
    assert result_from_json({"type": "result", **data}).figures == case.figures


def test_an_all_pass_catalog_run_stays_under_a_megabyte_and_renders(tmp_path: Path) -> None:
    """170 passing cases as large as the catalog's larger ones (4 steps, 2 ranks, 24
    tensors, six checks: 1,152 figures, about 190 KB each in full) stay under 1 MB; the
    report command renders a set from compact records."""
    case = _case(Verdict.PASS)
    line = json.dumps({"type": "result", **record(case)}) + "\n"
    assert 170 * len(line) < 1_000_000, len(line)
    writer = ResultsWriter(str(tmp_path), {"type": "run", "world_size": 2, "backend": "gloo",
                                           "candidates": [{"name": "torch"}]})
    for i in range(3):
        writer.add(dataclasses.replace(case, scenario=f"models/large-{i}"))
    writer.close()
    assert len(load_results(str(tmp_path)).results) == 3
    assert {Path(p).name for p in write_report_set(str(tmp_path))} >= {"summary.md",
                                                                       "report.html"}
    assert "layer23.weight" in (tmp_path / "report.html").read_text()
