"""Evidence: the figures and failures the checks of one case gather.

Every comparison of one tensor becomes a :class:`~ddp_conformance.judge.verdict.Figure`
(max abs, max rel, max ULP, the tolerance applied); the first failures of each check
become :class:`~ddp_conformance.judge.verdict.CheckFailure` lines saying where (check,
step, rank, parameter) and by how much.

While a check unit of the registry runs (:meth:`Evidence.reporting`), only the check ids
it declared may be reported: any other raises ``AssertionError``, so a unit's declaration
is the whole list of what it can fail.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import Tensor

from ddp_conformance.judge.cause_order import cause_rank
from ddp_conformance.judge.tolerance import Policy, distance, non_finite_mismatches
from ddp_conformance.judge.verdict import CheckFailure, Figure
from ddp_conformance.ranks.records import Tensors

MAX_FAILURES_PER_CHECK = 20


@dataclass
class Evidence:
    """Figures and failures gathered by the checks of one (scenario, candidate) run."""

    figures: list[Figure] = field(default_factory=list)
    failures: list[CheckFailure] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: The check unit running now and the ids it declared (None: no unit, anything goes).
    _unit: str = field(default="", init=False, repr=False, compare=False)
    _declared: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    @contextmanager
    def reporting(self, unit: str, ids: Iterable[str]) -> Iterator[None]:
        """While the block runs, only ``ids`` may be reported (by check unit ``unit``)."""
        previous = (self._unit, self._declared)
        self._unit, self._declared = unit, frozenset(ids)
        try:
            yield
        finally:
            self._unit, self._declared = previous

    def _declares(self, check: str) -> None:
        if self._declared is not None and check not in self._declared:
            raise AssertionError(f"check unit {self._unit!r} reported {check!r}, which it does "
                                 f"not declare (it declares {sorted(self._declared)})")

    def note(self, message: str) -> None:
        """Something reported that fails nothing (e.g. a check outside the profile)."""
        self.notes.append(message)

    def ran(self, check: str) -> None:
        self._declares(check)
        if check not in self.checks:
            self.checks.append(check)

    def figure(self, figure: Figure) -> None:
        """Record one figure computed by the check itself (counts, not tensor distances)."""
        self.ran(figure.check)
        self.figures.append(figure)

    def fail(self, check: str, message: str, step: int | None = None, rank: int | None = None,
             name: str | None = None, detail: str = "") -> None:
        """Record a failure of ``check``, at most :data:`MAX_FAILURES_PER_CHECK` of each.
        :attr:`failures` stays sorted cause before effect (:mod:`.cause_order`): a new
        failure goes after every failure of a check of its rank or before it."""
        self.ran(check)
        if sum(f.check == check for f in self.failures) < MAX_FAILURES_PER_CHECK:
            at = bisect.bisect_right([cause_rank(f.check) for f in self.failures],
                                     cause_rank(check))
            self.failures.insert(at, CheckFailure(check, f"{check}: {message}", step, rank, name,
                                                  detail))

    def compare(self, check: str, step: int, rank: int, name: str, actual: Tensor,
                expected: Tensor, rtol: float, against: str, scale: float = 0.0) -> None:
        """Compare one tensor; record its figures; record a failure if out of tolerance.

        ``scale`` raises the tolerance's reference magnitude above ``max|expected|`` where
        the expected value is a sum that cancels (see :mod:`ddp_conformance.judge.tolerance`).
        """
        self.ran(check)
        d = distance(actual, expected)
        # A non-finite ``scale`` (an inf or NaN among the summed gradients) says nothing of
        # the finite elements' rounding: the finite ``max|expected|`` stands alone then.
        if math.isfinite(scale):
            d.scale = max(d.scale, scale)
        # A parameter keeps its dtype outside forward and backward (under mixed_precision
        # too: torch's DDP swaps the low-precision copies back after backward); values that
        # round-trip through another dtype could still fall within the tolerance.
        wrong_dtype = check.endswith(".param") and actual.dtype != expected.dtype
        passed = actual.shape == expected.shape and not wrong_dtype and d.within(rtol)
        self.figures.append(Figure(check, step, rank, name, passed, d.max_abs, d.max_rel,
                                   d.max_ulp, rtol))
        if passed:
            return
        where = f"step {step}, rank {rank}, {name!r}"
        if actual.shape != expected.shape:
            self.fail(check, f"{where}: shape {tuple(actual.shape)} != {against}'s "
                             f"{tuple(expected.shape)}", step, rank, name)
            return
        if wrong_dtype:
            self.fail(check, f"{where}: parameter in {str(actual.dtype).removeprefix('torch.')}, "
                             f"{against}'s in {str(expected.dtype).removeprefix('torch.')}",
                      step, rank, name)
            return
        if _inexact(actual) and _inexact(expected) and actual.is_complex() == expected.is_complex():
            mismatched = non_finite_mismatches(actual.detach().cpu(), expected.detach().cpu())
            if mismatched:
                self.fail(check, f"{where}: {mismatched} element(s) non-finite on one side "
                                 f"only or with another value (NaN, +inf, -inf must match "
                                 f"{against}'s position by position)", step, rank, name)
                return
        bound = ("bitwise equality" if rtol == 0.0
                 else f"tolerance {rtol:.0e} x max|expected| {d.scale:.3g}")
        self.fail(check, f"{where}: max abs error {d.max_abs:.3g} against {against} "
                         f"(max rel {d.max_rel:.3g}, {d.max_ulp:.4g} ulp) exceeds {bound}",
                  step, rank, name)

    def compare_all(self, check: str, step: int, rank: int, actual: Tensors,
                    expected: Tensors, policy: Policy, against: str) -> None:
        self._declares(check)
        if set(actual) != set(expected):
            self.fail(check, f"step {step}, rank {rank}: names {sorted(set(actual) ^ set(expected))}"
                             f" present on one side only (against {against})", step, rank)
        # In the expected tensors' order, not a set's (string hashes differ per process):
        # the same run lists the same failures first.
        for name in (n for n in expected if n in actual):
            rtol = policy.rtol(expected[name].dtype, step)
            self.compare(check, step, rank, name, actual[name], expected[name], rtol, against)


def _inexact(t: Tensor) -> bool:
    """A floating or complex tensor: one that can hold inf and NaN."""
    return t.dtype.is_floating_point or t.is_complex()

