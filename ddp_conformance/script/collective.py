"""One collective as a process group saw it, and the kinds and dtypes the trace rules read.

The harness's tracing group (:mod:`ddp_conformance.ranks.tracing`) and a reproducer's
logging group record the same :class:`Collective`; the rules over a list of them
(:mod:`.trace_rules`, :mod:`.summed_memory`) are the same on both sides.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Collective:
    """One collective as the tracing group saw it. Equality ignores the time stamps."""

    step: int
    microbatch: int
    stage: str
    kind: str
    dtype: str
    numel: int
    group_size: int
    nbytes: int = 0
    #: ``time.perf_counter()`` when it was issued, and when its work completed (only when
    #: the tracer asked for completions; ``None`` until then).
    launched: float = field(default=0.0, compare=False)
    done: float | None = field(default=None, compare=False)
    #: Which storage bytes a backward reduction summed (:mod:`.extents`; empty otherwise).
    extents: tuple[tuple[int, int, int], ...] = field(default=(), compare=False)
    #: Of that memory, what an earlier reduction of the backward summed, as it was at this
    #: one's launch (:data:`.extents.Again`: block digests; empty otherwise).
    again: tuple[tuple[int, int, int, tuple[str, ...]], ...] = field(default=(), compare=False)
    #: Block digests of all an in-place backward reduction summed, at its launch
    #: (:func:`.extents.launch_digests`; empty otherwise).
    blocks: tuple[str, ...] = field(default=(), compare=False)

    def signature(self) -> tuple[str, str, int, int]:
        """What must match across ranks: kind, dtype, element count, group size."""
        return (self.kind, self.dtype, self.numel, self.group_size)

    def describe(self) -> str:
        return f"{self.kind}({self.numel} x {self.dtype}, group of {self.group_size})"

    def __reduce__(self) -> tuple[type[Collective], tuple[Any, ...]]:
        # Positional: a rank's trace travels to the parent; this pickles smaller than the
        # field-named state (and smaller than the frozen dataclass this replaced).
        return (Collective, tuple(getattr(self, f) for f in self.__slots__))


#: Collectives that reduce (sum) data across ranks: what gradient synchronisation uses.
REDUCING = frozenset({"allreduce", "allreduce_coalesced", "reduce", "reduce_scatter",
                      "_reduce_scatter_base", "reduce_scatter_tensor_coalesced",
                      "reduce_scatter_single", "reduce_scatter_single_coalesced"})
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
