"""What a collective trace says about gradient synchronisation, and what it must cover.

Plain functions over :class:`~ddp_conformance.ranks.tracing.Collective` lists and the
oracle's record, shared by the ``trace.*`` check units:

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
from collections.abc import Iterable, Mapping

from ddp_conformance.catalog.procedure import synced
from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.oracle import OracleRecord
from ddp_conformance.ranks.records import RankRecord
from ddp_conformance.ranks.tracing import REDUCING, Collective

#: Complex dtypes and the real dtype of their parts. torch's reducer allreduces a complex
#: bucket as its ``view_as_real`` (n complex elements on the wire as 2n real ones); a DDP
#: that reduces the complex tensor itself sums the same numbers. Both count as reducing
#: 2n elements of the real dtype, so gradients, wire volumes and bucket sizes are all
#: counted in real elements.
REAL_PAIRS = {"complex64": "float32", "complex128": "float64", "complex32": "float16"}
FLOATING = frozenset({"float64", "float32", "float16", "bfloat16"}) | frozenset(REAL_PAIRS)
#: What ``no_sync`` forbids: reducing or overwriting data across ranks (not gathering).
SYNCING = REDUCING | {"broadcast", "scatter"}
STEP_STAGES = frozenset({"forward", "backward"})


def gradient_reduction(c: Collective) -> bool:
    """A collective that reduces floating-point data in a backward: a gradient reduction."""
    return c.stage == "backward" and c.kind in REDUCING and c.dtype in FLOATING


def as_real(dtype: str, numel: int) -> tuple[str, int]:
    """``(dtype, numel)`` counted in real elements (:data:`REAL_PAIRS`)."""
    real = REAL_PAIRS.get(dtype)
    return (real, 2 * numel) if real else (dtype, numel)


def real_counts(by_dtype: Mapping[str, int]) -> dict[str, int]:
    """Elements per dtype with complex dtypes folded into their real ones (in order)."""
    out: dict[str, int] = {}
    for dtype, numel in by_dtype.items():
        real, n = as_real(dtype, numel)
        out[real] = out.get(real, 0) + n
    return out


def real_dtypes(dtypes: Iterable[str]) -> frozenset[str]:
    """``dtypes`` with complex ones replaced by their real dtype."""
    return frozenset(as_real(d, 0)[0] for d in dtypes)


def reduced_numel(oracle: OracleRecord) -> int:
    """Real elements of the gradients a synced backward reduces (all that require one)."""
    return sum(real_counts(oracle.numel_by_dtype).values())


def gradient_elements(trace: Iterable[Collective]) -> dict[tuple[int, int], tuple[int, int]]:
    """Per (step, microbatch): elements reduced in backward, and the number of collectives."""
    totals: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0, 0])
    for c in trace:
        if gradient_reduction(c):
            entry = totals[(c.step, c.microbatch)]
            entry[0] += as_real(c.dtype, c.numel)[1]
            entry[1] += 1
    return {k: (v[0], v[1]) for k, v in totals.items()}


def elements_by_dtype(trace: Iterable[Collective]) -> dict[tuple[int, int], dict[str, int]]:
    """Per (step, microbatch): elements reduced in backward per wire dtype (in trace order)."""
    seen: dict[tuple[int, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for c in trace:
        if gradient_reduction(c):
            dtype, numel = as_real(c.dtype, c.numel)
            seen[(c.step, c.microbatch)][dtype] += numel
    return seen


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
    reduce: produced locally on some active rank in a microbatch since the previous
    synced one of the step (zero_grad at every step ends the window). None where the
    oracle did not record it: then every parameter that requires a gradient counts."""
    ostep = oracle.steps[step] if step < len(oracle.steps) else None
    if ostep is None or len(ostep.local_grads) < scenario.microbatches:
        return None
    start = max((mb + 1 for mb in synced_microbatches(scenario) if mb < microbatch), default=0)
    return frozenset().union(*ostep.local_grads[start:microbatch + 1])


def needed_by_dtype(oracle: OracleRecord, names: frozenset[str] | None) -> dict[str, int]:
    """Real elements per dtype of the gradients ``names`` (None: all that require
    gradients), in the model's dtype order (complex folded into real: :func:`as_real`)."""
    if names is None:
        return real_counts(oracle.numel_by_dtype)
    needed = dict.fromkeys(real_counts(oracle.numel_by_dtype), 0)
    for name in names:
        p = oracle.initial_params[name]
        dtype, numel = as_real(str(p.dtype).removeprefix("torch."), p.numel())
        needed[dtype] = needed.get(dtype, 0) + numel
    return needed


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
