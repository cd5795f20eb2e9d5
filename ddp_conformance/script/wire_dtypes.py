"""Which wire dtypes lose nothing of which gradient dtypes, and whether a reduction's
per-dtype volume can have carried every gradient element losslessly.

A wire dtype W is *lossless* for a gradient dtype G when W represents every value of G
exactly: float64 holds float32, which holds float16 and bfloat16 (both have fewer
exponent and fraction bits than float32); float16 and bfloat16 are incomparable (float16
has more fraction bits, bfloat16 more exponent bits). Reducing in a lossless W and
casting back loses nothing beyond the reduction's own rounding (it is finer, if anything).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import combinations

#: For each floating wire dtype, the gradient dtypes it represents exactly.
HOLDS: dict[str, frozenset[str]] = {
    "float64": frozenset({"float64", "float32", "float16", "bfloat16"}),
    "float32": frozenset({"float32", "float16", "bfloat16"}),
    "float16": frozenset({"float16"}),
    "bfloat16": frozenset({"bfloat16"}),
}

Relation = Callable[[str, str], bool]


def lossless(wire: str, grad: str) -> bool:
    """Whether wire dtype ``wire`` represents every ``grad`` value exactly."""
    return grad in HOLDS.get(wire, frozenset({wire}))


def same(wire: str, grad: str) -> bool:
    """The strict relation: gradients travel in their own dtype (torch's DDP)."""
    return wire == grad


def holders(grads: frozenset[str], relation: Relation) -> list[str]:
    """The floating wire dtypes that carry some dtype of ``grads`` under ``relation``."""
    return [w for w in sorted(HOLDS) if any(relation(w, g) for g in grads)]


@dataclass(frozen=True)
class Shortfall:
    """A set of gradient dtypes whose elements outnumber those reduced in dtypes that can
    carry them: Hall's condition fails for it."""

    dtypes: tuple[str, ...]
    needed: int
    covered: int
    carriers: tuple[str, ...]


def shortfall(needed: Mapping[str, int], reduced: Mapping[str, int],
              relation: Relation) -> Shortfall | None:
    """The first set S of gradient dtypes (smallest first, in ``needed``'s order) with
    ``sum(needed[S]) > sum(reduced[W] for W carrying some member of S)``, or None.

    Every needed element must be carried by a reduced element of a dtype related to its
    own; by Hall's theorem (supply and demand form), such an assignment exists exactly
    when no S falls short. There are at most four floating dtypes: 15 subsets.
    """
    dtypes = [d for d, n in needed.items() if n > 0]
    for size in range(1, len(dtypes) + 1):
        for subset in combinations(dtypes, size):
            need = sum(needed[d] for d in subset)
            carriers = tuple(w for w in reduced if any(relation(w, d) for d in subset))
            covered = sum(reduced[w] for w in carriers)
            if need > covered:
                return Shortfall(subset, need, covered, carriers)
    return None
