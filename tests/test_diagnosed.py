"""Each defective DDP of tests/diagnosed.py is diagnosed as its planted defect, first.

For every DDP the few scenarios of :data:`tests.diagnosed.PLANTED` run on one shared runner
(two ranks; four for the process-group one), and the first finding of its diagnosis must
carry the planted code; the correct DDPs get no finding. The whole catalog per DDP is
``benchmarks/diagnosis_table.py`` (the table of docs/diagnosis.md).
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.diagnose.findings import diagnose
from ddp_conformance.judge.verdict import Result
from ddp_conformance.runner import Runner

from .diagnosed import CORRECT, PLANTED, Planted

CATALOG = {s.id: s for s in load_catalog()}
#: The deadline of one case: the hanging DDP's case waits it out once.
TIMEOUT_S = 6.0


@pytest.fixture(scope="module")
def diagnosed_runner() -> Iterator[Runner]:
    specs = [p.spec for p in PLANTED if p.world_size == 2] + [spec for spec, _ in CORRECT]
    with Runner(RunConfig(candidates=list(dict.fromkeys(specs)), timeout_s=TIMEOUT_S)) as r:
        yield r


def run(runner: Runner, spec: str, scenarios: tuple[str, ...]) -> list[Result]:
    return [runner.run_case(CATALOG[sid], spec) for sid in scenarios]


@pytest.mark.parametrize("planted", [p for p in PLANTED if p.world_size == 2],
                         ids=lambda p: p.spec.rpartition(":")[2])
def test_first_finding_is_the_planted_defect(diagnosed_runner: Runner, planted: Planted) -> None:
    results = run(diagnosed_runner, planted.spec, planted.scenarios)
    (diagnosis,) = diagnose(results)
    assert diagnosis.findings, [r.explanation_lines() for r in results]
    first = diagnosis.findings[0]
    assert first.code == planted.code, (first, [r.explanation_lines() for r in results])
    assert first.cases >= 1 and first.first_case in {r.case_id for r in results}
    assert first.repro.startswith("ddp-conformance repro ")
    # The case's own first line states the cause.
    case = next(r for r in results if r.case_id == first.first_case)
    assert case.explanation_lines()[0].startswith(f"[{planted.code}] ")


def test_wrong_group_at_four_ranks(runner4: Runner) -> None:
    (planted,) = [p for p in PLANTED if p.world_size == 4]
    results = run(runner4, planted.spec, planted.scenarios)
    (diagnosis,) = diagnose(results)
    assert diagnosis.findings and diagnosis.findings[0].code == planted.code, diagnosis


@pytest.mark.parametrize(("spec", "scenarios"), CORRECT, ids=[s for s, _ in CORRECT])
def test_correct_ddps_get_no_finding(diagnosed_runner: Runner, spec: str,
                                     scenarios: tuple[str, ...]) -> None:
    results = run(diagnosed_runner, spec, scenarios)
    (diagnosis,) = diagnose(results)
    assert diagnosis.findings == [] and diagnosis.unexpected == 0, \
        [r.explanation_lines() for r in results]


def test_at_least_fifteen_planted_defects_spanning_the_codes() -> None:
    assert len(PLANTED) >= 15
    assert len({p.code for p in PLANTED}) >= 15
    assert any(":Scratch" in p.spec for p in PLANTED)  # written from scratch, too
