"""Pair coverage: which valid pairs of dimension values the catalog's scenarios hold.

A pair is two values of two different dimensions (``catalog/interactions.py``); it is
valid unless an exclusion names it (``catalog/exclusions.py``); a scenario covers every
pair of the values it takes. Scenarios that check a refusal (``expect_error``, a torch
limit) run no training through the combination and cover nothing; slow scenarios
(``--slow``) are counted apart, so the figure of a default run is known too.
"""
from __future__ import annotations

import itertools
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ddp_conformance.catalog.exclusions import GAPS, Exclusion, pair_exclusion
from ddp_conformance.catalog.interactions import DIMENSIONS, read
from ddp_conformance.catalog.listing import WIDTH
from ddp_conformance.catalog.scenario import Scenario

#: One value of one dimension, and a pair of them (dimensions in DIMENSIONS' order).
Point = tuple[str, str]
Pair = tuple[Point, Point]


def all_pairs() -> Iterator[Pair]:
    """Every pair of values of two dimensions, in the table's order."""
    for d1, d2 in itertools.combinations(DIMENSIONS, 2):
        for v1 in d1.values:
            for v2 in d2.values:
                yield (d1.name, v1), (d2.name, v2)


def valid_pairs() -> list[Pair]:
    return [p for p in all_pairs() if pair_exclusion(*p) is None]


def excluded_pairs() -> list[tuple[Pair, Exclusion]]:
    """Every pair an exclusion names, with it."""
    out = []
    for pair in all_pairs():
        why = pair_exclusion(*pair)
        if why is not None:
            out.append((pair, why))
    return out


def counts(scenario: Scenario) -> bool:
    """Whether ``scenario`` trains through its combination (a refusal covers nothing)."""
    return not scenario.may_raise


def covered_by(scenario: Scenario) -> set[Pair]:
    """The pairs ``scenario`` takes (valid or not)."""
    values = read(scenario)
    out: set[Pair] = set()
    for d1, d2 in itertools.combinations(DIMENSIONS, 2):
        out |= {((d1.name, v1), (d2.name, v2))
                for v1 in values[d1.name] for v2 in values[d2.name]}
    return out


@dataclass(frozen=True)
class Coverage:
    """Valid pairs, those covered, and the share."""

    valid: list[Pair]
    covered: set[Pair]

    @property
    def uncovered(self) -> list[Pair]:
        return [p for p in self.valid if p not in self.covered]

    @property
    def percent(self) -> float:
        return 100.0 * len(self.covered) / len(self.valid) if self.valid else 100.0


def coverage(scenarios: Iterable[Scenario], slow: bool = True) -> Coverage:
    """The valid pairs ``scenarios`` cover (``slow=False``: a default run's, without the
    slow scenarios)."""
    valid = valid_pairs()
    wanted = set(valid)
    covered: set[Pair] = set()
    for s in scenarios:
        if counts(s) and (slow or not s.slow):
            covered |= covered_by(s) & wanted
    return Coverage(valid, covered)


def pair_text(pair: Pair) -> str:
    (d1, v1), (d2, v2) = pair
    return f"{d1}={v1} x {d2}={v2}"


def coverage_text(scenarios: list[Scenario]) -> str:
    """What ``ddp-conformance list --pairs`` prints: the covered share of the valid pairs
    with and without the slow scenarios, then every uncovered pair, with the reason the
    generator leaves it out where it does (``exclusions.GAPS``)."""
    every, default_run = coverage(scenarios), coverage(scenarios, slow=False)
    excluded = len(excluded_pairs())
    lines = [f"pair coverage: {len(every.covered)} of {len(every.valid)} valid pairs "
             f"covered ({every.percent:.1f}%), {len(default_run.covered)} "
             f"({default_run.percent:.1f}%) without the --slow scenarios",
             f"{len(DIMENSIONS)} dimensions, {sum(len(d.values) for d in DIMENSIONS)} values, "
             f"{len(every.valid) + excluded} pairs, {excluded} excluded (docs/interactions.md)",
             f"uncovered: {len(every.uncovered)}"]
    for pair in every.uncovered:
        gap = gap_of(pair)
        lines += textwrap.wrap(f"{pair_text(pair)}" + (f": {gap.reason}" if gap else ""),
                               WIDTH, initial_indent="  ", subsequent_indent="      ",
                               break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)


def gap_of(pair: Pair) -> Exclusion | None:
    """The entry of ``exclusions.GAPS`` that keeps the generator off ``pair``, if any."""
    row = dict(pair)
    return next((g for g in GAPS if set(g.when) <= set(row) and g.matches(row)), None)
