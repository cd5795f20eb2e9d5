"""The mutation-score benchmark's pieces that need no rank (``benchmarks/mutation``).

The measurement itself (mutants against the catalog) is a benchmark, not a test:
``python benchmarks/mutation_score.py --run``. Here: the generated page is fresh, the
classification is well-formed and names only measured survivors, and a mutant's comm hook
reaches the mutated module.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.mutation import install, page, verdicts  # noqa: E402
from benchmarks.mutation.measure import read_outcomes  # noqa: E402
from benchmarks.mutation.population import TARGETS, load  # noqa: E402

HOOKS = TARGETS["default_hooks"]


def test_docs_page_is_fresh() -> None:
    assert page.DOC.read_text() == page.render(), \
        "docs/mutation.md is stale: python benchmarks/mutation_score.py --docs"


def test_every_verdict_names_a_measured_survivor() -> None:
    sample = {m.id for m in load(page.HERE / "sample.jsonl")}
    outcomes = read_outcomes(page.HERE / "results" / "baseline.jsonl")
    for mutant_id, verdict in verdicts.read().items():
        assert mutant_id in sample, mutant_id
        assert outcomes[mutant_id].status in ("survived", "not reached"), mutant_id
        assert verdict.reason, mutant_id


def test_verdicts_refuse_an_unknown_class(tmp_path: Path) -> None:
    bad = tmp_path / "v.toml"
    bad.write_text('["distributed/AddNot/1"]\nclass = "harmless"\nreason = "x"\n')
    try:
        verdicts.read(bad)
    except ValueError as exc:
        assert "needs class" in str(exc)
    else:
        raise AssertionError("an unknown class was accepted")


def test_a_hook_closure_is_rebuilt_from_the_mutated_module() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    source = HOOKS.file.read_text()
    mutated = install._execute("test", "default_hooks", source, {})
    modules = {HOOKS.module: mutated}
    plain = install.translate(default_hooks.allreduce_hook, modules)
    assert plain is mutated.allreduce_hook
    wrapped = install.translate(default_hooks.fp16_compress_wrapper(default_hooks.allreduce_hook),
                                modules)
    assert wrapped.__globals__ is mutated.__dict__
    cells = dict(zip(wrapped.__code__.co_freevars,
                     (c.cell_contents for c in wrapped.__closure__), strict=True))
    assert cells["hook"] is mutated.allreduce_hook
    other = functools.partial(print)
    assert install.translate(other, modules) is other  # not a hook of the mutated module


def test_a_mutant_spec_resolves_without_building_the_mutant() -> None:
    from ddp_conformance.contract.registry import resolve_candidate
    from ddp_conformance.errors import UsageError

    install._BUILT.clear()
    torch_ddp = resolve_candidate("torch")
    mutant = resolve_candidate("benchmarks.mutation.live:distributed/AddNot/105")
    assert mutant.capabilities == torch_ddp.capabilities
    assert not install._BUILT  # built at the first wrap, in a rank
    try:
        resolve_candidate("benchmarks.mutation.live:nowhere/AddNot/1")
    except UsageError as exc:
        assert "nowhere" in str(exc)
    else:
        raise AssertionError("a mutant of an unknown file resolved")


def test_a_rank_labels_what_it_covers_with_its_case() -> None:
    """The per-case coverage contexts the selection reads (``--coverage`` in the ranks)."""
    import coverage

    from ddp_conformance.catalog.loader import load_catalog
    from ddp_conformance.ranks import coverage_hook, worker
    from ddp_conformance.ranks.messages import Job

    scenario = load_catalog()[0]
    job = Job(kind="scenario", store_prefix="p", collective_timeout_s=1.0, scenario=scenario,
              candidate="torch")
    assert worker._context(job) == f"{scenario.id}[torch]"
    call = Job(kind="call", store_prefix="p", collective_timeout_s=1.0, function="m:f")
    assert worker._context(call) == "m:f"
    coverage_hook.switch_context("nothing measured")  # no coverage: a no-op
    cov = coverage.Coverage(data_file=None, config_file=False)
    coverage_hook._ACTIVE = cov
    try:
        cov.start()
        coverage_hook.switch_context("case-a[torch]")
        _covered_line()
        cov.stop()
        data = cov.get_data()
        lines = data.contexts_by_lineno(__file__)
    finally:
        coverage_hook._ACTIVE = None
    assert any("case-a[torch]" in cs for cs in lines.values())


def _covered_line() -> int:
    return 1


def test_a_python_reducer_spec_takes_the_python_reducer_candidates_capabilities() -> None:
    from ddp_conformance.contract.registry import resolve_candidate

    install._BUILT.clear()
    python_reducer = resolve_candidate("torch-python-reducer")
    mutant = resolve_candidate(
        "benchmarks.mutation.live:distributed/ReplaceBinaryOperator_Div_Mul/0@python-reducer")
    assert mutant.capabilities == python_reducer.capabilities
    assert mutant.capabilities != resolve_candidate("torch").capabilities
    assert mutant.name.endswith("@python-reducer")
    assert not install._BUILT


def test_python_reducer_cases_reach_a_mutant_in_that_mode() -> None:
    """A line only a ``[torch-python-reducer]`` case ran is reached in python-reducer mode
    only; a line run at import, by the C++-reducer runs only."""
    from benchmarks.mutation.population import Mutant
    from benchmarks.mutation.select import Reach, _scenario

    assert _scenario("a/b[torch-python-reducer]") == "a/b@python-reducer"
    assert _scenario("a/b[torch]") == "a/b"
    reach = Reach(2, {"distributed": {10: {"a/b@python-reducer"}, 20: {""}}},
                  {"a/b": 1.0, "a/b@python-reducer": 2.0, "c/d": 0.5})
    at = functools.partial(Mutant, "m", "distributed", "AddNot", 0)
    assert reach.scenarios(at(10, 10, 10)) == ["a/b@python-reducer"]
    assert reach.scenarios(at(20, 20, 20)) == ["c/d", "a/b"]
