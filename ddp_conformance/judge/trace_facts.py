"""What a collective trace says about gradient synchronisation, and what it must cover.

Plain functions over :class:`~ddp_conformance.script.collective.Collective` lists and the
oracle's record, shared by the ``trace.*`` check units (the rules a reproducer carries too
are :mod:`ddp_conformance.script.trace_rules`'s; these read them from the scenario):

- the floating-point reductions each backward issued (element counts, per dtype, sizes);
- the gradients a synced backward must reduce at least: those *defined on some rank*,
  i.e. produced by a local backward on some active rank since the previous synced
  backward (``OracleStep.local_grads``; under ``no_sync`` the union over the window's
  microbatches). A gradient that is ``None`` on every rank needs no reduction: torch
  reduces it anyway (its bucket is reduced whole, unused parameters included), a leaner
  DDP may skip it, and the values are the same.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ddp_conformance.catalog.procedure import synced
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.oracle import OracleRecord
from ddp_conformance.ranks.records import RankRecord
from ddp_conformance.script import trace_rules as rules
from ddp_conformance.script.collective import Collective, as_real, gradient_reduction


def reduced_numel(oracle: OracleRecord) -> int:
    """Real elements of the gradients a synced backward reduces (all that require one)."""
    return rules.reduced_numel(oracle.numel_by_dtype)


def gradient_elements(trace: Iterable[Collective]) -> dict[tuple[int, int], tuple[int, int]]:
    """Per (step, microbatch): elements reduced in backward, and the number of collectives."""
    totals: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for c in trace:
        if gradient_reduction(c):
            entry = totals[(c.step, c.microbatch)]
            entry[0] += as_real(c.dtype, c.numel)[1]
            entry[1] += 1
    return {k: (v[0], v[1]) for k, v in totals.items()}


def backward_allreduce_sizes(trace: Iterable[Collective]) -> dict[tuple[int, int], list[int]]:
    """Per (step, microbatch): the element counts of the backward's gradient reductions."""
    sizes: dict[tuple[int, int], list[int]] = defaultdict(list)
    for c in trace:
        if gradient_reduction(c):
            sizes[(c.step, c.microbatch)].append(as_real(c.dtype, c.numel)[1])
    return dict(sizes)


def scenario_group_size(rec: RankRecord) -> int:
    sizes = [c.group_size for c in rec.trace if c.stage == "backward"]
    return max(sizes) if sizes else 1


def synced_microbatches(scenario: Scenario) -> list[int]:
    return [mb for mb in range(scenario.microbatches) if synced(scenario, mb)]


def defined_gradients(scenario: Scenario, oracle: OracleRecord, step: int,
                      microbatch: int) -> frozenset[str] | None:
    """The parameters whose gradient the synced backward of (step, microbatch) must
    reduce (:func:`~ddp_conformance.script.trace_rules.defined_gradients`, read from the
    oracle's step)."""
    ostep = oracle.steps[step] if step < len(oracle.steps) else None
    return rules.defined_gradients(ostep.local_grads if ostep else None, scenario.microbatches,
                                   synced_microbatches(scenario), microbatch)


def needed_by_dtype(oracle: OracleRecord, names: frozenset[str] | None) -> dict[str, int]:
    """Real elements per dtype of the gradients ``names`` (None: all that require
    gradients), in the model's dtype order (complex folded into real)."""
    return rules.needed_by_dtype(oracle.numel_by_dtype, oracle.initial_params, names)


def side_by_side(left: list[Collective], right: list[Collective], start: int, left_name: str,
                 right_name: str, rows: int = 8) -> str:
    """Two collective sequences as columns, from a little before ``start``."""
    lo = max(0, start - 2)
    lines = [f"{'#':>4}  {left_name:<44} {right_name}"]
    for i in range(lo, min(max(len(left), len(right)), start + rows)):
        a = left[i] if i < len(left) else None
        b = right[i] if i < len(right) else None
        mark = ">>" if i == start else "  "

        def cell(c: Collective | None) -> str:
            return "(nothing)" if c is None else f"s{c.step} {c.stage}: {c.describe()}"

        lines.append(f"{mark}{i:>3}  {cell(a):<44} {cell(b)}")
    return "\n".join(lines)
