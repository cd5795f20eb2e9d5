"""Where a case's time went: the cost account of a case, the summary's slowest cases, and a
real run whose costs add up to each case's duration."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_conformance.judge.costs import COLUMNS, OTHER, PHASES, CostMeter
from ddp_conformance.judge.verdict import Result, Verdict
from ddp_conformance.report import load_results
from ddp_conformance.report.load import result_from_json
from ddp_conformance.report.markdown import markdown_summary
from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parent.parent
DEFECTIVE = "tests.defective:SumsWithoutDividing"


def timed(scenario: str, seconds: float, **costs: float) -> Result:
    return Result(scenario, "torch", Verdict.PASS, 2, "gloo", "cpu", seconds, costs=costs)


# -- the account of one case ---------------------------------------------------------------


def test_a_job_charges_the_slowest_rank_per_phase_and_the_rest_to_transfer() -> None:
    meter = CostMeter()
    meter.add_job(1.0, 0.25, [{"wrap": 0.2, "steps": 0.3, "record": 0.05},
                              {"wrap": 0.1, "steps": 0.4, "record": 0.01}])
    costs = meter.finish(1.2)
    assert list(costs) == list(COLUMNS)
    assert costs["handover"] == 0.25 and costs["wrap"] == 0.2 and costs["steps"] == 0.4
    assert costs["record"] == 0.05
    assert costs["transfer"] == pytest.approx(1.0 - 0.25 - 0.55)  # rank 0: 0.55 s in the job
    assert costs[OTHER] == pytest.approx(1.2 - sum(costs[p] for p in PHASES))


def test_a_job_without_records_leaves_its_time_unexplained() -> None:
    meter = CostMeter()
    meter.add_job(3.0, 0.5, [])
    costs = meter.finish(3.1)
    assert costs["handover"] == 0.5 and costs["transfer"] == 0 and costs["steps"] == 0
    assert costs[OTHER] == pytest.approx(2.6)


def test_timed_blocks_add_up_and_other_is_never_negative() -> None:
    meter = CostMeter()
    with meter.timing("oracle"):
        pass
    meter.add("checks", 0.5)
    meter.add("checks", -1.0)  # a clock that went backwards counts as nothing
    costs = meter.finish(0.1)  # phases measured a little more than the duration
    assert costs["checks"] == 0.5 and 0 <= costs["oracle"] < 0.1 and costs[OTHER] == 0


# -- the summary ---------------------------------------------------------------------------


def slowest_section(text: str) -> list[str]:
    start = text.index("## Slowest cases")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None].splitlines()


def table_rows(section: list[str]) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section
            if line.startswith("|") and not line.startswith("|--")]
    return rows


def test_summary_lists_the_slowest_first_with_their_phases_and_the_run_shares() -> None:
    results = [timed("a/fast", 0.5, steps=0.4, other=0.1),
               timed("a/slow", 4.0, wrap=1.0, steps=1.0, reference=2.0),
               timed("a/middle", 1.5, oracle=1.0, checks=0.5),
               Result("a/na", "torch", Verdict.NA, 2, "gloo", "cpu", 0.0, reason="needs join")]
    text = markdown_summary({"durations": 2}, results, [])
    # The reading order: what did not pass (N/A grouped) before the matrix and the timing.
    assert text.index("## Not applicable") < text.index("## Slowest cases")
    section = slowest_section(text)
    rows = table_rows(section)
    # "comparison" only in a run that compared two backends (--compare-backend).
    assert rows[0] == ["case", "verdict", "seconds", *(c for c in COLUMNS if c != "comparison")]
    assert [r[0] for r in rows[1:]] == ["a/slow[torch]", "a/middle[torch]"]  # 2 of 4, slowest first
    slow = dict(zip(rows[0], rows[1], strict=True))
    assert (slow["seconds"], slow["wrap"], slow["reference"]) == ("4.000", "1.000", "2.000")
    assert slow["handover"] == "-"  # a phase this result does not have
    assert "The 2 slowest of 4 cases (6.0 s in all)" in text
    # Shares over every case, largest first (ties in phase order): reference 2 of 6 s, ...
    assert "Where the run's time went: reference 33% · steps 23% · wrap 17% · oracle 17% · " \
           "checks 8% · other 2%" in text


def test_durations_0_lists_every_case_and_the_default_is_10() -> None:
    results = [timed(f"s/{i:02d}", float(i), steps=float(i)) for i in range(12)]
    every = table_rows(slowest_section(markdown_summary({"durations": 0}, results, [])))
    assert [r[0] for r in every[1:]] == [f"s/{i:02d}[torch]" for i in reversed(range(12))]
    default = table_rows(slowest_section(markdown_summary({}, results, [])))
    assert len(default) == 1 + 10


def test_results_without_costs_render_their_durations_only() -> None:
    old = result_from_json({"type": "result", "scenario": "a/b", "candidate": "torch",
                            "verdict": "PASS", "duration_s": 1.25})
    assert old.costs == {}
    section = slowest_section(markdown_summary({}, [old], []))
    assert table_rows(section) == [["case", "verdict", "seconds"], ["a/b[torch]", "PASS", "1.250"]]
    assert not any("time went" in line for line in section)


def test_costs_round_trip_through_results_jsonl(tmp_path: Path) -> None:
    from ddp_conformance.report.stream import ResultsWriter

    result = timed("a/b", 1.0, steps=0.75, other=0.25)
    writer = ResultsWriter(str(tmp_path), {"type": "run", "durations": 3})
    writer.add(result)
    writer.close()
    run = load_results(str(tmp_path))
    assert run.results[0].costs == {"steps": 0.75, "other": 0.25}
    assert run.info["durations"] == 3
    assert "## Slowest cases" in (tmp_path / "summary.md").read_text()
    assert "Slowest cases" in (tmp_path / "report.html").read_text()


# -- a real run ----------------------------------------------------------------------------


def test_a_real_run_accounts_for_each_case_duration(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddp_conformance", "run", "-k", "gradients/mlp-sgd and not momentum",
         "--candidate", "torch", "--candidate", DEFECTIVE, "--durations", "1",
         "--report-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=deadline(300))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the defective candidate fails
    lines = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines[0]["durations"] == 1
    results = [line for line in lines if line["type"] == "result"]
    assert [r["verdict"] for r in results] == ["PASS", "FAIL"]
    for r in results:
        costs = r["costs"]
        assert list(costs) == list(COLUMNS), costs
        assert all(v >= 0 for v in costs.values()), costs
        assert costs["wrap"] > 0 and costs["steps"] > 0 and costs["checks"] > 0, costs
        assert abs(sum(costs.values()) - r["duration_s"]) <= 0.1 * r["duration_s"] + 0.05, r
    first, second = (r["costs"] for r in results)
    # The reference run and the oracle are cached per scenario: charged to the first case.
    assert first["reference"] > 0 and first["oracle"] > 0
    assert second["reference"] == 0 and second["oracle"] == 0
    rows = table_rows(slowest_section((tmp_path / "summary.md").read_text()))
    assert len(rows) == 1 + 1 and rows[0][:3] == ["case", "verdict", "seconds"]
