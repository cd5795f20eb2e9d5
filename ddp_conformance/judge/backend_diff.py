"""Two backends, one scenario: how far apart the candidate's records are.

docs/CONTRACT.md, "Backends and scale": the DDP catalog on a custom backend is compared side by
side with Gloo in the same run. The candidate and the data are the same, so on exact
scenarios (dyadic data: every sum exact in any order) a conforming backend gives the very
same bits; elsewhere the reduction order of the two backends may differ, and the figure
is the largest absolute difference, for a person to read next to the oracle's tolerance.
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

from ddp_conformance.collectives.values import bits
from ddp_conformance.judge.tolerance import distance
from ddp_conformance.judge.verdict import BackendComparison
from ddp_conformance.ranks.records import RankRecord


def _tensors(record: RankRecord) -> Iterator[tuple[str, Tensor | None]]:
    """(where, tensor) of everything a rank recorded, in a fixed order."""
    for name, t in record.initial_params.items():
        yield f"initial parameter {name!r}", t
    for step, s in enumerate(record.steps):
        for name, g in s.grads.items():
            yield f"step {step}, gradient of {name!r}", g
        for name, t in s.params.items():
            yield f"step {step}, parameter {name!r}", t
        for name, t in s.buffers.items():
            yield f"step {step}, buffer {name!r}", t
    for name, t in record.final_params.items():
        yield f"final parameter {name!r}", t
    for name, t in record.final_buffers.items():
        yield f"final buffer {name!r}", t


def compare_records(backend: str, verdict: str, mine: dict[int, RankRecord] | None,
                    theirs: dict[int, RankRecord] | None) -> BackendComparison:
    """Compare the records of one case on two backends (None: that run has no records)."""
    out = BackendComparison(backend, verdict)
    if mine is None or theirs is None:
        return out
    max_abs, bitwise = 0.0, True
    for rank in sorted(set(mine) & set(theirs)):
        a, b = dict(_tensors(mine[rank])), dict(_tensors(theirs[rank]))
        for where in a.keys() | b.keys():
            x, y = a.get(where), b.get(where)
            if x is None and y is None:
                continue
            same, diff = _distance(x, y)
            out.compared += 1
            max_abs = max(max_abs, diff)
            if not same and bitwise:
                bitwise = False
                out.first_difference = f"rank {rank}, {where}" + (
                    f": differs by {diff:.3g}" if diff != float("inf") else
                    ": present in one run only, or of another shape or dtype")
    out.max_abs, out.bitwise = max_abs, bitwise
    return out


def _distance(x: Tensor | None, y: Tensor | None) -> tuple[bool, float]:
    """(bitwise equal, largest absolute difference; inf when not comparable, or where NaN
    stands in one run only)."""
    if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
        return False, float("inf")
    x, y = x.detach().cpu(), y.detach().cpu()
    if x.is_sparse:
        x, y = x.to_dense(), y.to_dense()
    if torch.equal(x, y) or _same_bits(x, y):
        return True, 0.0
    max_abs = distance(x, y).max_abs
    return False, float("inf") if math.isnan(max_abs) else max_abs


def _same_bits(x: Tensor, y: Tensor) -> bool:
    """Bit for bit the same (``torch.equal`` says no where both hold NaN at one place, in
    the same bits: bitwise equal all the same)."""
    if x.is_complex():
        x, y = torch.view_as_real(x), torch.view_as_real(y)
    return x.is_floating_point() and torch.equal(bits(x), bits(y))
