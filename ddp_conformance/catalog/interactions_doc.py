"""``docs/interactions.md``, written from the data: the dimensions and their values, the
exclusions with their reasons, the pairs not generated, and the catalog's coverage.

``python -m ddp_conformance.catalog.interactions_doc > docs/interactions.md`` rewrites it;
``tests/test_interactions.py`` holds the file to what this module renders.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from ddp_conformance.catalog.exclusions import EXCLUSIONS, GAPS, Exclusion
from ddp_conformance.catalog.interactions import DIMENSIONS
from ddp_conformance.catalog.pairs import Coverage, coverage, excluded_pairs, pair_text
from ddp_conformance.catalog.scenario import Scenario

_INTRO = """\
# Pairwise feature interactions

DDP's defects hide where two features meet: a comm hook under Join, `no_sync` under
`static_graph`, buffers replaced rather than updated in place under an eval forward. The
catalog is therefore measured by the **pairs** of feature values its scenarios exercise
together, not only by the features one at a time.

A *dimension* is one choice every scenario makes (a constructor option, a procedure, a comm
hook, what the model holds); a *pair* is two values of two dimensions; a pair is *valid*
unless torch 2.13 cannot run it on Gloo/CPU, refuses it by design, or gives it a meaning no
oracle can judge (the exclusions below, each with its reason). A scenario covers every pair
of the values it takes, read from its fields (`ddp_conformance/catalog/interactions.py`),
so every scenario of the catalog counts, whoever wrote it. Scenarios that check a refusal
(`expect_error`, a torch limit) train through nothing and cover nothing.

The scenarios of `suites/test_interactions.py` cover the valid pairs the rest of the catalog
leaves uncovered: a covering array over all the dimensions (covertable, with the exclusions
as constraints and the catalog's own rows as presets), keeping each row that covers a pair
nothing before it did. The rows come in the generator's order, which covers the most new
pairs first; the first ones run by default and the rest only with `--slow` (both figures
below). Each is named after the first such pair
(`interactions/tiny-cap+no-broadcast`) and its rule joins the two values' phrases. The
suite is regenerated (covertable comes with the `dev` extra) with
`python -m ddp_conformance.catalog.interaction_rows > suites/test_interactions.py`, and
this page with `python -m ddp_conformance.catalog.interactions_doc > docs/interactions.md`.
"""


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in rows]
    return lines


def _when(x: Exclusion) -> str:
    return " and ".join(f"{d} = {' or '.join(sorted(v))}" for d, v in x.when.items())


def _figures(every: Coverage, default_run: Coverage, excluded: int) -> list[str]:
    return [
        "## Coverage", "",
        "```", "ddp-conformance list --pairs            # the whole catalog",
        "ddp-conformance list --pairs -k EXPR    # the scenarios whose id matches", "```", "",
        f"- valid pairs covered: **{len(every.covered)} of {len(every.valid)} "
        f"({every.percent:.1f}%)**, counting every scenario;",
        f"- in a default run (without the `--slow` scenarios): {len(default_run.covered)} "
        f"({default_run.percent:.1f}%);",
        f"- {len(DIMENSIONS)} dimensions, {sum(len(d.values) for d in DIMENSIONS)} values, "
        f"{len(every.valid) + excluded} pairs, of which {excluded} are excluded.", ""]


def render(scenarios: list[Scenario]) -> str:
    """The page for the catalog ``scenarios``."""
    every, default_run = coverage(scenarios), coverage(scenarios, slow=False)
    lines = [_INTRO, *_figures(every, default_run, len(excluded_pairs())), "## Dimensions", ""]
    for d in DIMENSIONS:
        lines += [f"**{d.name}**: {d.about}.", ""]
        lines += _table(("value", "what it stands for"),
                        [(f"`{v}`", phrase) for v, phrase in d.values.items()]) + [""]
    lines += ["## Exclusions", "",
              "A combination is excluded where every named dimension takes one of the named "
              "values. One over two dimensions or fewer removes pairs from the valid ones; "
              "one over three only keeps generated rows away from the combination.", ""]
    lines += _table(("combination", "why"), [(_when(x), x.reason) for x in EXCLUSIONS]) + [""]
    lines += ["## Valid pairs left uncovered", "",
              "The generator draws no row holding these: the pair is valid, counted, and "
              "uncovered until the reason is gone.", ""]
    lines += _table(("combination", "why"), [(_when(x), x.reason) for x in GAPS]) + [""]
    lines += [f"Uncovered now ({len(every.uncovered)}):", ""]
    lines += [f"- {pair_text(p)}" for p in every.uncovered] or ["- none"]
    return "\n".join(lines) + "\n"


def main() -> None:
    from ddp_conformance.catalog.loader import load_catalog

    sys.stdout.write(render(load_catalog()))


if __name__ == "__main__":
    main()
