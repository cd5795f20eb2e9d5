"""How far a candidate's tensor may be from the expected one, and how far it is.

The checks are norm-wise per tensor: ``max|actual - expected| <= rtol * scale`` with
``scale = max|expected|``. Element-wise relative error is meaningless where a sum cancels to
near zero. For gradients the scale is raised to ``max(sum_r |g_r| / W)``, the magnitude of
the terms DDP's reduction adds, which is what its rounding error is proportional to when
ranks' gradients cancel. (Within one rank nothing is reduced differently: the oracle runs
with the ranks' intra-op thread count, so its local gradients are the ranks' bitwise.)

Why these ``rtol`` values (u is the unit roundoff of the dtype):

- The oracle computes each rank's local gradient with the same operations on the same
  shapes as the rank does, so local gradients agree bitwise; what differs is the reduction:
  DDP divides each of W local gradients by W and sums them in the backend's order. That
  sum's error is at most (W - 1) u times the sum of magnitudes, plus u for the division:
  for W <= 4 in float32 (u = 2**-24 = 6.0e-8) that is <= 2.4e-7 relative.
- Trajectories are compared over a few steps (free-running oracle), so parameter
  differences of that size feed back into the next step's gradients: allow ~40x.
- float32: rtol = 1e-5. A reduction done in float16 (u = 2**-11 = 4.9e-4) or bfloat16
  (u = 2**-8 = 3.9e-3) moves the largest elements by ~1e-4 or more relative: 10x to 400x
  above the bound, so it is caught.
- float64: 1e-12 (u = 1.1e-16, same argument). float16 models: 4e-3 (8 u); bfloat16: 3e-2.
- Exact-valued scenarios (dyadic data, every sum exact in any order) demand 0: bitwise.
- A model mixing dtypes uses its loosest dtype's rtol for every tensor (``Policy.floor``):
  its float64 layers are fed by float32 ones and carry their rounding.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

RTOL: dict[torch.dtype, float] = {
    torch.float32: 1e-5,
    torch.float64: 1e-12,
    torch.float16: 4e-3,
    torch.bfloat16: 3e-2,
}

_INT_VIEW = {torch.float64: torch.int64, torch.float32: torch.int32,
             torch.float16: torch.int16, torch.bfloat16: torch.int16}


def rtol_for(dtype: torch.dtype, exact: bool) -> float:
    """The norm-wise relative tolerance for ``dtype`` (0: bitwise, integers are exact)."""
    if exact or not dtype.is_floating_point:
        return 0.0
    return RTOL.get(dtype, 1e-5)


@dataclass(frozen=True)
class Policy:
    """A scenario's tolerance policy: bitwise (exact-valued), a scenario override (a comm
    hook that changes the arithmetic, argued next to the scenario), or the dtype's rtol."""

    exact: bool = False
    override: float | None = None
    #: The loosest rtol of the model's parameter dtypes: in a mixed-precision model a
    #: float64 tensor is computed from float32 ones, and carries their rounding.
    floor: float = 0.0

    def rtol(self, dtype: torch.dtype) -> float:
        if self.exact or not dtype.is_floating_point:
            return 0.0
        return self.override if self.override is not None else max(rtol_for(dtype, False),
                                                                  self.floor)

    @classmethod
    def for_model(cls, exact: bool, override: float | None, dtypes: frozenset[str]) -> Policy:
        floor = max((rtol_for(getattr(torch, d), False) for d in dtypes), default=0.0)
        return cls(exact, override, floor)


BITWISE = Policy(exact=True)


@dataclass
class Distance:
    max_abs: float
    max_rel: float
    max_ulp: float
    scale: float

    def within(self, rtol: float) -> bool:
        if rtol == 0.0:
            return self.max_abs == 0.0 and not math.isnan(self.max_abs)
        return self.max_abs <= rtol * self.scale


def ulp_distance(a: Tensor, b: Tensor) -> float:
    """Largest number of representable values between corresponding elements."""
    view = _INT_VIEW.get(a.dtype)
    if view is None or a.numel() == 0:
        return float((a != b).any().item())
    mask = (1 << (view.itemsize * 8 - 1)) - 1
    ia = a.contiguous().view(view).to(torch.int64)
    ib = b.contiguous().view(view).to(torch.int64)
    # Sign-magnitude bit patterns: same sign, the magnitudes' difference counts the steps
    # (exact in int64); opposite signs, the steps to zero and back add up (in float64, as
    # the sum may exceed int64 for float64 inputs).
    ma, mb = ia & mask, ib & mask
    same_sign = (ia < 0) == (ib < 0)
    across = ma.double() + mb.double()
    within = (ma - mb).abs().double()
    return float(torch.where(same_sign, within, across).max().item())


def distance(actual: Tensor, expected: Tensor) -> Distance:
    """Error figures of ``actual`` against ``expected`` (same shape, dtype and device)."""
    if actual.shape != expected.shape:
        return Distance(math.inf, math.inf, math.inf, 0.0)
    a = actual.detach().cpu()
    e = expected.detach().cpu()
    if a.numel() == 0:
        return Distance(0.0, 0.0, 0.0, 0.0)
    if a.dtype == e.dtype and torch.equal(a, e):  # the common case, one cheap comparison
        scale = float(e.abs().max().item()) if e.dtype.is_floating_point else \
            float(e.long().abs().max().item())
        return Distance(0.0, 0.0, 0.0, scale)
    if not a.dtype.is_floating_point:
        diff = (a.long() - e.long()).abs().max().item()
        return Distance(float(diff), float(diff), float(diff), float(e.abs().max().item()))
    ulp = ulp_distance(a, e) if a.dtype == e.dtype else math.nan
    a64, e64 = a.double(), e.double()
    err = (a64 - e64).abs()
    if torch.isnan(a64).any() != torch.isnan(e64).any():
        return Distance(math.nan, math.nan, ulp, 0.0)
    nonzero = e64 != 0
    rel = float((err[nonzero] / e64[nonzero].abs()).max().item()) if nonzero.any() else 0.0
    return Distance(float(err.max().item()), rel, ulp, float(e64.abs().max().item()))
