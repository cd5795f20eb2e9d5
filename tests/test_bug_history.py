"""torch's DDP bug history (``ddp_conformance/catalog/history.py``): the data holds together,
``docs/bug-history.md`` is what ``list --history --markdown`` writes, and each bug turned
into scenarios is caught: its mutant (``tests/mutants/history.py``, torch's or the
reference DDP with the one historical defect put back) fails a scenario that guards it,
while torch's DDP and the reference pass every guarding scenario.

The mutant runs take one runner per world size (2, and 3 for the subgroup scenario) and
only each mutant's own scenarios. The full matrix (every guarding scenario on torch and
the reference at world sizes 1-4, every mutant at 2-4) is ``benchmarks/bug_history.py``.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddp_conformance.catalog.history import HISTORY, Why
from ddp_conformance.catalog.history_text import history_markdown
from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.cli import main
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.runner import Runner
from tests.mutants import _collect

ROOT = Path(__file__).resolve().parent.parent
CAUGHT = frozenset({Verdict.FAIL, Verdict.ERROR, Verdict.TIMEOUT, Verdict.CRASH})
#: The mutants of ``tests/mutants/history.py``: spec -> the bug its docstring cites first.
MUTANTS = {spec: re.match(r"(\S+/\S+#\d+)", doc).group(1)  # type: ignore[union-attr]
           for spec, doc in _collect(("history",)).items()}
GUARDED = {bug.ref: bug for bug in HISTORY if bug.scenarios}


def test_enough_fixed_bugs_are_examined_each_with_scenarios_or_a_reason() -> None:
    assert sum(bug.fixed for bug in HISTORY) >= 40
    refs = [bug.ref for bug in HISTORY]
    assert len(refs) == len(set(refs)), "a bug listed twice"
    for bug in HISTORY:
        assert bug.title and bug.what and bug.features and bug.fixed_in, bug.ref
        assert bool(bug.scenarios) != (bug.why is not None), bug.ref
    # torch 2.13's own defects are shown by a torch-only script the reason names.
    for bug in HISTORY:
        if bug.why is Why.OPEN:
            script = re.search(r"tests/standalone/\S+\.py", bug.reason)
            assert script and (ROOT / script.group(0)).is_file(), bug.ref


def test_every_guarding_scenario_exists_and_carries_the_bug() -> None:
    catalog = {s.id: s for s in load_catalog()}
    for bug in GUARDED.values():
        for scenario_id in bug.scenarios:
            assert scenario_id in catalog, (bug.ref, scenario_id)
            assert bug.ref in catalog[scenario_id].guards, (bug.ref, scenario_id)
    carried = {ref for s in catalog.values() for ref in s.guards}
    assert carried == set(GUARDED), "a scenario guards a bug the history does not list"


def test_each_guarded_bug_has_one_mutant_and_each_mutant_one_guarded_bug() -> None:
    assert sorted(MUTANTS.values()) == sorted(GUARDED), MUTANTS


def test_the_page_is_what_the_command_writes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--history", "--markdown"]) == 0
    written = capsys.readouterr().out
    assert written == history_markdown(HISTORY)
    page = (ROOT / "docs" / "bug-history.md").read_text()
    assert page == written, ("docs/bug-history.md is stale: run "
                                    "ddp-conformance list --history --markdown > "
                                    "docs/bug-history.md")


def _world_size(scenario_ids: tuple[str, ...]) -> int:
    catalog = {s.id: s for s in load_catalog()}
    sizes = [catalog[s].world_sizes[0] for s in scenario_ids if catalog[s].world_sizes]
    return sizes[0] if sizes else 2


@pytest.mark.parametrize("world_size", [2, 3])
def test_each_mutant_fails_its_scenarios_and_torch_and_the_reference_pass(
        world_size: int) -> None:
    """At ``world_size``, the mutants whose scenarios are defined there: a mutant is caught
    by one of its bug's scenarios; torch and the reference pass all of them."""
    mutants = {spec: GUARDED[ref] for spec, ref in MUTANTS.items()
               if _world_size(GUARDED[ref].scenarios) == world_size}
    assert mutants
    catalog = {s.id: s for s in load_catalog()}
    config = RunConfig(candidates=["torch", "reference", *mutants], world_size=world_size,
                       timeout_s=20.0)
    missed, failed = [], {}
    with Runner(config) as runner:
        for spec, bug in mutants.items():
            scenarios = [catalog[s] for s in bug.scenarios]
            if not any(runner.run_case(s, spec).verdict in CAUGHT for s in scenarios):
                missed.append((spec, bug.ref))
            for scenario in scenarios:
                for candidate in ("torch", "reference"):
                    result = runner.run_case(scenario, candidate)
                    if result.verdict is not Verdict.PASS:
                        failed[(scenario.id, candidate)] = (result.verdict, result.summary_line())
    assert missed == [], f"mutants their scenarios do not catch: {missed}"
    assert failed == {}, failed
