"""A reference DDP that cannot run a scenario is said loudly, with its evidence.

The candidate (torch's DDP) runs for real on a real rank pool; only the reference DDP's
jobs end as a failed run would (``raised``, with every rank's traceback), which is what a
reference defect on some backend looks like to the runner (issue 28: the reference once
raised on every Python backend, and the cases stayed PASS with a bare "raised" warning).
"""
from __future__ import annotations

from pathlib import Path

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.outcome import Outcome
from ddp_conformance.ranks.pool import RankPool
from ddp_conformance.report import render
from ddp_conformance.runner import REFERENCE, Runner

TRACEBACK = ('Traceback (most recent call last):\n  File "reference/collectives.py", line 1, '
             'in allgather\nTypeError: allgather() missing 1 required positional argument: '
             "'opts'\n")


class ReferenceRaises(RankPool):
    """A real rank pool on which every job of the reference DDP ends ``raised``."""

    def run(self, job: Job, timeout_s: float) -> Outcome:
        if job.candidate == REFERENCE:
            return Outcome("raised", tracebacks={r: TRACEBACK for r in range(self.world_size)})
        return super().run(job, timeout_s)


def test_a_reference_that_raises_is_an_explained_error_with_its_traceback(tmp_path: Path) -> None:
    scenario = next(s for s in load_catalog() if s.id == "gradients/mlp-sgd")
    config = RunConfig(candidates=["torch"])
    with ReferenceRaises(2) as pool, Runner(config, pool=pool) as runner:
        result = runner.run_case(scenario, "torch")
        summary = runner.reference_summary()
    assert result.verdict is Verdict.ERROR, result
    assert result.reason.startswith("the reference DDP could not run this scenario, so the "
                                    "candidate was not compared with it: reference ERROR: "
                                    "rank 0 raised TypeError: allgather() missing 1 required")
    assert set(result.tracebacks) == {0, 1}
    assert all(tb.startswith("(the reference DDP's, not the candidate's)\nTraceback")
               for tb in result.tracebacks.values())
    assert "TypeError: allgather() missing" in runner.reference_notes[scenario.id]
    assert summary == ["the reference DDP ran none of the 1 scenario it was needed for: no "
                       "case was compared with it"]
    render(str(tmp_path), {}, [result], summary)
    report = (tmp_path / "summary.md").read_text()
    assert "reference DDP could not run this scenario" in report
    assert "(the reference DDP's, not the candidate's)" in report and "'opts'" in report


def test_a_reference_that_runs_says_nothing() -> None:
    scenario = next(s for s in load_catalog() if s.id == "gradients/mlp-sgd")
    with Runner(RunConfig(candidates=["torch"])) as runner:
        result = runner.run_case(scenario, "torch")
        assert result.verdict is Verdict.PASS, result
        assert runner.reference_summary() == [] and not runner.reference_notes
        assert not any("reference" in note for note in result.notes)
