"""``ddp-conformance list``: the catalog as text of at most :data:`WIDTH` characters a line.

One entry per scenario: its id, the world sizes it is defined for and what it needs of a
candidate on the first line (the needs wrapped in their column, never cut), then its
description and model, wrapped and indented below. The whole catalog's id column is as
wide as its longest id, so that the ids line up.
"""
from __future__ import annotations

import textwrap
from collections.abc import Sequence

from ddp_conformance.catalog.scenario import Scenario

#: The widest line ``list`` writes: a terminal of 100 columns shows every line whole.
WIDTH = 100
#: The narrowest the needs column gets, however long an id is (a longer line, then).
MIN_NEEDS = 24
_GAP = "  "
_INDENT = "    "


def world_sizes(scenario: Scenario) -> str:
    """The world sizes ``scenario`` is defined for: ``2 or 4``, ``>= 2``, or ``any``."""
    if scenario.world_sizes:
        return " or ".join(map(str, scenario.world_sizes))
    return f">= {scenario.min_world_size}" if scenario.min_world_size > 1 else "any"


def catalog_table(scenarios: Sequence[Scenario]) -> str:
    """The entries of ``scenarios``, under a header line, with no line over :data:`WIDTH`
    unless an id alone is too long for it."""
    id_width = max([len("scenario"), *(len(s.id) for s in scenarios)])
    size_width = max([len("world size"), *(len(world_sizes(s)) for s in scenarios)])
    needs_at = id_width + len(_GAP) + size_width + len(_GAP)
    needs_width = max(MIN_NEEDS, WIDTH - needs_at)
    lines = [f"{'scenario':<{id_width}}{_GAP}{'world size':<{size_width}}{_GAP}needs"]
    for scenario in scenarios:
        needs = textwrap.wrap(", ".join(sorted(scenario.needs)) or "-", needs_width,
                              break_long_words=False, break_on_hyphens=False)
        lines.append(f"{scenario.id:<{id_width}}{_GAP}{world_sizes(scenario):<{size_width}}"
                     f"{_GAP}{needs[0]}")
        lines += [" " * needs_at + more for more in needs[1:]]
        about = f"{scenario.description} (model {scenario.model})".lstrip()
        lines += textwrap.wrap(about, WIDTH, initial_indent=_INDENT, subsequent_indent=_INDENT,
                               break_long_words=False, break_on_hyphens=False)
        if scenario.rule:  # the DDP rule it checks (catalog.rules)
            lines += textwrap.wrap(f"rule: {scenario.rule}", WIDTH, initial_indent=_INDENT,
                                   subsequent_indent=_INDENT + " " * len("rule: "),
                                   break_long_words=False, break_on_hyphens=False)
        if scenario.guards:  # the upstream bugs it guards (catalog.history)
            lines += textwrap.wrap(f"guards: {', '.join(scenario.guards)}", WIDTH,
                                   initial_indent=_INDENT,
                                   subsequent_indent=_INDENT + " " * len("guards: "))
    lines.insert(1, "-" * max(map(len, lines)))
    return "\n".join(lines)
