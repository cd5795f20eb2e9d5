"""The registry of checks: every check is a named unit that declares the ids it may report.

A unit is a function of a :class:`Context` registered with :func:`check`, which names it,
lists the check ids it may report (``init.param``, ``trace.dtype``, ...) and says when it
applies. :func:`ddp_conformance.judge.checks.run_checks` runs the registered units in
registration order (the order :mod:`ddp_conformance.judge.checks` imports them in), each
inside :meth:`Evidence.reporting`, so a unit that reports an id it did not declare raises
``AssertionError``: the registry's ids are everything the judge can fail.

A unit's docstring is its contract: what it demands, and why torch's DDP behaves so.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ddp_conformance.catalog.scenario import Scenario
from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.oracle import OracleRecord
from ddp_conformance.judge.tolerance import Policy
from ddp_conformance.ranks.records import RankRecord

T = TypeVar("T")


@dataclass(frozen=True)
class Context:
    """What the checks of one DDP group see: the records and what they are judged against.

    ``reference``: the reference DDP's records of the same group (None: not compared);
    ``strict``: the strict profile (torch, the reference, ``--strict-profile``: torch's
    bucket layout and wire dtypes); ``trace``: the records carry a collective trace;
    ``strict_messages``: a refusal must match torch's message (``--strict-messages``).
    """

    scenario: Scenario
    records: dict[int, RankRecord]
    oracle: OracleRecord
    reference: dict[int, RankRecord] | None
    strict: bool
    trace: bool
    evidence: Evidence
    strict_messages: bool = False
    #: What :meth:`once` computed for this group, by the function that computed it.
    _facts: dict[Callable[..., Any], Any] = field(default_factory=dict, compare=False,
                                                  repr=False)

    @property
    def policy(self) -> Policy:
        """The tolerance of every value comparison with the oracle or the reference: the
        scenario's (bitwise where exact, its override) over the model's gradient dtypes."""
        return Policy.for_model(self.scenario.exact, self.scenario.rtol, self.oracle.grad_dtypes)

    def once(self, fact: Callable[[Context], T]) -> T:
        """``fact(self)``, computed once for this group and shared by every unit that asks
        (e.g. why the trace cannot judge the run, for all the ``trace.*`` units:
        :func:`ddp_conformance.judge.trace_blind.bypass`)."""
        if fact not in self._facts:
            self._facts[fact] = fact(self)
        return self._facts[fact]

    @property
    def expects_error(self) -> bool:
        """The scenario's iteration must raise, or (at a torch limit) the candidate refused:
        it is no DDP step, only the error counts."""
        return self.scenario.expect_error is not None or self.refused

    @property
    def refused(self) -> bool:
        """At a torch limit (``Scenario.torch_limit``), some rank raised: the candidate
        refused, as torch does, and every rank must have."""
        return self.scenario.torch_limit is not None and any(
            rec.raised for rec in self.records.values())


Applies = Callable[[Context], bool]
Body = Callable[[Context], None]


@dataclass(frozen=True)
class CheckUnit:
    """One registered check: its name, the ids it may report, when it applies, its body."""

    name: str
    ids: tuple[str, ...]
    applies: Applies
    body: Body

    @property
    def contract(self) -> str:
        return self.body.__doc__ or ""

    def __call__(self, ctx: Context) -> None:
        if self.applies(ctx):
            with ctx.evidence.reporting(self.name, self.ids):
                self.body(ctx)


_REGISTRY: list[CheckUnit] = []


def check(name: str, *ids: str, when: Applies) -> Callable[[Body], Body]:
    """Register the decorated function as check unit ``name`` reporting ``ids`` (default:
    ``name`` alone), run where ``when(ctx)`` holds."""
    declared = ids or (name,)

    def register(body: Body) -> Body:
        if not (body.__doc__ or "").strip():
            raise ValueError(f"check unit {name!r} has no docstring: state its contract")
        if any(u.name == name for u in _REGISTRY):
            raise ValueError(f"check unit {name!r} registered twice")
        taken = {i for u in _REGISTRY for i in u.ids} & set(declared)
        if taken:
            raise ValueError(f"check unit {name!r} declares ids of another unit: {sorted(taken)}")
        _REGISTRY.append(CheckUnit(name, declared, when, body))
        return body

    return register


def units() -> tuple[CheckUnit, ...]:
    """The units registered so far, in registration order: all of them once
    :mod:`ddp_conformance.judge.checks` is imported (read them through its
    ``registered``)."""
    return tuple(_REGISTRY)


# When units apply. An expected error ends the scenario's iteration: that iteration is no
# DDP step, so value and volume checks do not apply (only the error and trace agreement).

def values(ctx: Context) -> bool:
    """The scenario trains (expects no error)."""
    return not ctx.expects_error


def expecting_error(ctx: Context) -> bool:
    return ctx.expects_error


def against_reference(ctx: Context) -> bool:
    """Values to compare with the reference DDP's, which went on too (at a torch limit the
    reference may itself have refused)."""
    return values(ctx) and ctx.reference is not None and not any(
        rec.raised for rec in ctx.reference.values())


def traced(ctx: Context) -> bool:
    """A trace to check, of a scenario that trains."""
    return values(ctx) and ctx.trace
