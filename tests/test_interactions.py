"""Pair coverage of the catalog (docs/interactions.md): the figure holds, the command prints
it, the page is fresh, and the generated scenarios are what their rows say. No ranks: the
scenarios themselves run with the catalog (suites/test_interactions.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddp_conformance.catalog import interaction_rows, interactions_doc, pairs
from ddp_conformance.catalog.exclusions import EXCLUSIONS, GAPS, excluded, pair_exclusion
from ddp_conformance.catalog.interactions import BY_NAME, read
from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.scenario import JoinSpec, Scenario
from ddp_conformance.cli import main

ROOT = Path(__file__).resolve().parent.parent
#: The acceptance figure: the share of valid pairs the catalog covers.
LEAST_PERCENT = 95.0
CATALOG = load_catalog()


def test_the_catalog_covers_at_least_95_percent_of_the_valid_pairs() -> None:
    every = pairs.coverage(CATALOG)
    assert every.percent >= LEAST_PERCENT, [pairs.pair_text(p) for p in every.uncovered]
    # A default run (no --slow) too: the rows it holds come first in the generator's order.
    assert pairs.coverage(CATALOG, slow=False).percent >= LEAST_PERCENT
    # Without the generated suite the figure is far lower: the measure can fail.
    rest = pairs.coverage([s for s in CATALOG if not s.id.startswith("interactions/")])
    assert rest.percent < LEAST_PERCENT


def test_list_pairs_prints_the_figure_and_the_uncovered_pairs(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--pairs"]) == 0
    out = capsys.readouterr().out
    every = pairs.coverage(CATALOG)
    assert (f"pair coverage: {len(every.covered)} of {len(every.valid)} valid pairs covered "
            f"({every.percent:.1f}%)") in out
    assert f"uncovered: {len(every.uncovered)}" in out
    for pair in every.uncovered:
        assert pairs.pair_text(pair) in out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert main(["list", "--pairs", "-k", "not interactions"]) == 0
    assert f"({every.percent:.1f}%)" not in capsys.readouterr().out


def test_the_page_is_what_the_data_renders() -> None:
    page = (ROOT / "docs" / "interactions.md").read_text()
    assert page == interactions_doc.render(CATALOG), (
        "docs/interactions.md is stale: python -m ddp_conformance.catalog.interactions_doc "
        "> docs/interactions.md")


def test_every_generated_scenario_reads_back_as_its_row() -> None:
    from suites.test_interactions import ROWS

    by_id = {s.id: s for s in CATALOG}
    for values, pair in ROWS:
        row = interaction_rows.full_row(values)
        scenario = by_id[interaction_rows.scenario_id(pair)]
        assert {d: {v} for d, v in row.items()} == read(scenario), scenario.id
        assert excluded(row) is None, scenario.id
        assert pair_exclusion(*pair) is None and pairs.counts(scenario), scenario.id


def test_exclusions_name_real_values_and_give_a_reason() -> None:
    for x in EXCLUSIONS + GAPS:
        assert x.reason.strip() and 1 <= len(x.when) <= 3, x
        for dim, values in x.when.items():
            assert values <= set(BY_NAME[dim].values), (dim, values)


def test_a_pair_is_read_from_the_fields_and_a_refusal_covers_nothing() -> None:
    s = Scenario("x/y", "conv_bn", microbatches=3, accumulate="no_sync", join=JoinSpec(),
                 comm_hook="fp16_compress", ddp_options={"bucket_cap_mb": 0.0001})
    covered = pairs.covered_by(s)
    assert (("accumulation", "no_sync"), ("join", "uneven")) in covered
    assert (("comm_hook", "fp16_compress"), ("model", "buffers_in_place")) in covered
    assert (("bucket_cap", "tiny"), ("model", "buffers_in_place")) in covered
    assert (("bucket_cap", "default"), ("model", "buffers_in_place")) not in covered
    refused = Scenario("x/z", "mlp", torch_limit="anything")
    assert not pairs.coverage([refused]).covered


def test_the_generated_rows_cover_every_valid_pair_but_the_gaps() -> None:
    """One generation (covertable orders pairs by a fixed hash, so it is deterministic):
    with the rest of the catalog its rows leave only the pairs GAPS keeps it off."""
    pytest.importorskip("covertable")
    rest = [s for s in CATALOG if not s.id.startswith("interactions/")]
    kept = interaction_rows.generate(CATALOG)
    generated = [interaction_rows.scenario_for(row, pair) for row, pair in kept]
    assert all(re.fullmatch(r"interactions/[a-z0-9-]+\+[a-z0-9-]+", s.id) for s in generated)
    left = pairs.coverage(rest + generated).uncovered
    assert left and all(pairs.gap_of(p) is not None for p in left), left
