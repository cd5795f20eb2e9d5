"""Proof of power: every defective DDP of the mutant zoo is caught by the catalog.

Each mutant (``tests/mutants``) is a correct DDP with one defect. Per mutant the catalog
runs in a fixed order, cheap and broad scenarios first, and stops at the first scenario
whose verdict is FAIL, ERROR, TIMEOUT or CRASH; every mutant must be caught, and the
reference DDP must pass every scenario that caught one (so the catch is the defect's, not
the scenario's). World size 2 first; scenarios that need more ranks (process subgroups)
then run at 3 and 4 ranks for the mutants still uncaught. One runner per world size for
the whole module. ``tests/mutants/gaps.py`` holds realistic defects no scenario can catch
with today's checks; they must stay uncaught until the check named there exists.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from ddp_conformance.verdict import Verdict
from tests.mutants import gap_mutants, zoo
from tests.mutants.hunt import ZooRun, hunt, table


@pytest.fixture(scope="module")
def zoo_run() -> Iterator[ZooRun]:
    """The zoo and the known gaps hunted together (one runner per world size)."""
    run = hunt([*zoo(), *gap_mutants()])
    print("\n" + table(run) + f"\n\n{len(run.catches)} mutants hunted in {run.seconds:.0f}s")
    yield run


def test_the_zoo_is_big_and_every_mutant_names_its_defect() -> None:
    mutants = zoo()
    assert len(mutants) >= 25
    assert all(doc for doc in mutants.values()), [m for m, d in mutants.items() if not d]


def test_every_mutant_is_caught_by_some_scenario(zoo_run: ZooRun) -> None:
    missed = [m for m in zoo() if zoo_run.catches[m].result is None]
    assert missed == [], f"mutants no scenario catches: {missed}"


def test_the_reference_passes_every_scenario_that_caught_a_mutant(zoo_run: ZooRun) -> None:
    bad = {k: (r.verdict, r.reason, [f.message for f in r.failures[:1]])
           for k, r in zoo_run.reference.items() if r.verdict is not Verdict.PASS}
    assert bad == {}


def test_known_gaps_stay_uncaught_until_their_check_exists(zoo_run: ZooRun) -> None:
    """Each defect in ``tests/mutants/gaps.py`` slips through every scenario today; when one
    is caught, the check or scenario its docstring names exists: move it into the zoo."""
    caught = {m: (c.result.scenario, c.check) for m in gap_mutants()
              if (c := zoo_run.catches[m]).result is not None}
    assert caught == {}, f"now caught (move them into the zoo): {caught}"
