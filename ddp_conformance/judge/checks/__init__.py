"""Every check the judge runs (docs/CONTRACT.md, "What every scenario checks"), in run order.

Each check is a unit registered with :func:`ddp_conformance.judge.registry.check` in a
module of its own; importing this module registers them all, in the order below, which
is the order they run and report in. A unit's docstring states its contract.

- ``expected_error`` (:mod:`.expected_error`): the scenario's error on every rank;
- ``init`` (:mod:`.init`): ``init.param``, ``init.buffer``: DDP's init sync;
- ``oracle`` (:mod:`.oracle`): ``oracle.grad``, ``oracle.grad_none``,
  ``oracle.param``, ``oracle.buffer``: the single-process oracle's trajectory;
- ``replica`` (:mod:`.replica`): ``replica.param``, ``replica.buffer_broadcast``,
  ``replica.final``: the ranks agree with each other;
- ``reference`` (:mod:`.reference`): ``reference.grad``, ``reference.grad_none``,
  ``reference.param``, ``reference.buffer``, ``reference.steps``: the reference DDP's
  trajectory on the same data;
- the collective trace: ``trace.dtype`` (:mod:`.trace_dtype`), ``trace.no_sync``
  (:mod:`.trace_no_sync`), ``trace.reduced_once``
  (:mod:`.trace_reduced_once`), ``trace.consistent``
  (:mod:`.trace_consistent`), ``trace.buckets`` (:mod:`.trace_buckets`).

Where the scenario expects an error only ``expected_error`` and ``trace.consistent`` run.
"""
from __future__ import annotations

# isort: off
# The order of these imports is the order the checks run in and report in.
from ddp_conformance.judge.checks import expected_error  # noqa: F401
from ddp_conformance.judge.checks import init  # noqa: F401
from ddp_conformance.judge.checks import oracle  # noqa: F401
from ddp_conformance.judge.checks import replica  # noqa: F401
from ddp_conformance.judge.checks import reference  # noqa: F401
from ddp_conformance.judge.checks import trace_dtype  # noqa: F401
from ddp_conformance.judge.checks import trace_no_sync  # noqa: F401
from ddp_conformance.judge.checks import trace_reduced_once  # noqa: F401
from ddp_conformance.judge.checks import trace_consistent  # noqa: F401
from ddp_conformance.judge.checks import trace_buckets  # noqa: F401
# isort: on

from ddp_conformance.judge.registry import CheckUnit, Context, units  # noqa: E402


def registered() -> tuple[CheckUnit, ...]:
    """Every check unit, in the order they run (all registered: this module imported them)."""
    return units()


def declared_ids() -> list[str]:
    """Every check id the judge can report, in run order."""
    return [i for unit in registered() for i in unit.ids]


def run_checks(ctx: Context) -> None:
    """Run every applicable unit on ``ctx``, in order, adding to ``ctx.evidence``."""
    for unit in registered():
        unit(ctx)
