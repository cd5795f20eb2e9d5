"""Which failed check explains a case best: the checks ordered cause before effect.

A defect shows in several checks at once: buffers never broadcast make
``replica.buffer_broadcast`` fail, and through BatchNorm's running statistics
``oracle.buffer`` and then every later gradient drift. A person fixes the cause, so the
failure that leads a case's line (and its divergence table) is the check that names the
mechanism, not the biggest number. :data:`CAUSE_ORDER` declares that order; the judge
keeps a case's failures sorted by it (:meth:`Evidence.fail`), stably, so failures of one
check keep the order the check found them in (step by step, rank by rank).

The argument for each place, top to bottom:

- ``expected_error``: the scenario's contract is the refusal; nothing else was judged.
- ``init.*``: the constructor's broadcast comes before every step; ranks that start apart
  differ everywhere after.
- ``reference.steps``: a rank that ran another number of steps (Join) misaligns every
  later comparison.
- ``trace.no_sync``, ``trace.reduced_once``, ``trace.dtype``, ``trace.consistent``: the
  collectives are how gradients get their values; a reduction inside ``no_sync``, a
  gradient reduced twice or never, or reduced in float16 explains the value drift it
  causes, and ranks that issued different collectives explain everything after.
- ``replica.buffer_broadcast``: buffers not broadcast before a forward change that forward
  (BatchNorm), hence the buffers, gradients and parameters judged after it.
- ``*.grad_none`` before ``*.grad``: a gradient that is None where DDP gives a tensor
  (an unused parameter) is the mechanism; its value is the effect.
- ``*.grad`` before ``*.param``: parameters are the optimizer applied to gradients.
- ``replica.param`` after the gradients: ranks disagree because their gradients did.
- ``*.buffer`` after the parameters: buffers follow from the forwards.
- ``replica.final``, ``trace.buckets``: last; the end state, and the bucket layout (which
  changes no value beyond rounding).

Within each pair the oracle (the specification) comes before the reference DDP.
"""
from __future__ import annotations

CAUSE_ORDER: tuple[str, ...] = (
    "expected_error",
    "init.param", "init.buffer",
    "reference.steps",
    "trace.no_sync", "trace.reduced_once", "trace.dtype", "trace.consistent",
    "replica.buffer_broadcast",
    "oracle.grad_none", "reference.grad_none",
    "oracle.grad", "reference.grad",
    "oracle.param", "reference.param", "replica.param",
    "oracle.buffer", "reference.buffer",
    "replica.final", "trace.buckets",
)

_RANK = {check: i for i, check in enumerate(CAUSE_ORDER)}


def cause_rank(check: str) -> int:
    """The place of ``check`` in :data:`CAUSE_ORDER` (a check not listed, such as a
    collective case's, comes after every listed one)."""
    return _RANK.get(check, len(CAUSE_ORDER))
