"""Exact-valued data for collective checks, at each dtype's full precision, and what each
operation must produce from it.

Every rank can compute every rank's input (it depends on the rank, its position in the
group, the element index and a salt only), so each rank computes the expected result
itself and compares bitwise.

**Full precision.** Let ``p`` be the dtype's significant bits (float64 53, float32 24,
float16 11, bfloat16 8; int64 63 and int32 31 value bits) and ``k = ceil(log2(n))`` for a
group of ``n``. An input element is ``s * a * 2**e`` with ``a`` an integer of exactly ``w``
bits (its top and bottom bits set), so it needs ``w`` significant bits, and a wire that
narrows the dtype changes it:

- data moved without reduction takes ``w = p`` and an exponent from a range that leaves
  the narrower types (float64: up to 2**+-300, outside float32; float32 and bfloat16: up
  to 2**+-100, outside float16; float16: its whole normal range), so a float64 sent
  through float32, a float32 through bfloat16 or float16, a float16 through bfloat16 or a
  bfloat16 through float16 changes it; int64 values exceed 2**53 (not float64-exact);
- SUM, MIN and MAX take ``w = p - k`` at one common scale (floats: ``a * 2**-w``, so
  ``|x| < 1``; integers: ``a``): every partial sum of up to ``n`` of them, in any order
  and grouping, is an integer multiple of that scale below ``n * 2**(p-k) <= 2**p`` in
  magnitude, so it is exactly representable and every addition is exact. The inputs use
  ``p - k`` bits (float64: 50 or more for up to 8 ranks, far beyond float32's 24), the
  results up to ``p``;
- AVG takes ``n`` times such values with ``w = p - 2k``: the sum stays below ``2**p``
  scales (exact as above) and is an exact multiple of ``n``, so dividing it by ``n`` is
  exact (a correctly rounded division of an exact quotient), and so is dividing each
  input first and summing, whichever a backend does;
- PRODUCT gives each element one carrier, the group member at position ``element mod
  n``, whose value has ``w = p`` bits (integers: ``p - n + 1``); the other members take
  ``{0.5, 1, 2, -1}`` (integers ``{1, 2, -1}``). A product of one ``w``-bit value and
  powers of two is exact in any order (floats: between ``2**-n`` and ``2**n``, inside
  every float type's normal range for up to 14 ranks; integers: below ``2**p``);
- bool reduces as logic: SUM and MAX are "any", PRODUCT and MIN are "all" (what Gloo and
  NCCL do).

``tests/test_backends.py`` checks every reduction order for 2, 3, 4 and 8 ranks, and that
the inputs are not representable in the narrower types.
"""
from __future__ import annotations

import torch
from torch import Tensor

_PRODUCT_FLOAT = torch.tensor([0.5, 1.0, 2.0, -1.0, 1.0, 1.0, 2.0, 0.5], dtype=torch.float64)
_PRODUCT_INT = torch.tensor([1, 2, -1, 1, 1, -1, 2, 1], dtype=torch.int64)
#: What the elements between a strided tensor's elements hold: no result takes this value
#: (it has 7 significant bits; every value above has at least 8, or is a power of two).
SENTINEL = 99
#: Significant bits of each float dtype's significand, and the integers' value bits.
PRECISION = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8,
             torch.int64: 63, torch.int32: 31}
#: Exponents of moved (unreduced) float data: beyond the narrower types' range.
_MOVED_EXPONENTS = {
    torch.float64: (0, -300, 140, -20, 300, -140, 20),
    torch.float32: (0, -100, 20, -20, 100),
    torch.bfloat16: (0, -100, 20, -20, 100),
    torch.float16: (0, -14, 5, -5, 15),
}
_MASK31 = (1 << 31) - 1


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def _mix(x: Tensor) -> Tensor:
    """A 31-bit integer hash of each element (xor-shift-multiply; products below 2**62)."""
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & _MASK31
    x = ((x ^ (x >> 12)) * 0x297A2D39) & _MASK31
    return x ^ (x >> 15)


def _pattern(rank: int, numel: int, salt: int) -> Tensor:
    """62 pseudo-random bits per element (int64, non-negative; indices below 2**31)."""
    i = torch.arange(numel, dtype=torch.int64)
    out = torch.zeros(numel, dtype=torch.int64)
    for half in (0, 1):
        seed = ((rank + 1) * 0x27D4EB2F + salt * 0x165667B1 + half * 0x61C88647) & _MASK31
        out |= _mix(((i * 0x5BD1E995) & _MASK31) ^ seed) << (31 * half)
    return out


def _significand(rank: int, numel: int, salt: int, width: int) -> Tensor:
    """Integers of exactly ``width`` bits (top and bottom bits set), ``width`` in 1..63."""
    if width <= 1:
        return torch.ones(numel, dtype=torch.int64)
    middle = _pattern(rank, numel, salt) >> (62 - (width - 2))
    return (1 << (width - 1)) | (middle << 1) | 1


def _signs(rank: int, numel: int, salt: int) -> Tensor:
    return 1 - 2 * ((torch.arange(numel) * 3 + rank * 5 + salt) % 7 % 2)


def _index(rank: int, numel: int, salt: int, period: int) -> Tensor:
    return (torch.arange(numel, dtype=torch.int64) * 7 + rank * 13 + salt * 5) % period


def _bits_for(n: int) -> int:
    """``ceil(log2(n))``: a sum of ``n`` values below ``2**m`` is below ``2**(m + k)``."""
    return max(n - 1, 0).bit_length()


def _scaled(a: Tensor, signs: Tensor, width: int, kind: torch.dtype,
            exponents: Tensor | None = None) -> Tensor:
    """``signs * a``: integers as they are, floats as ``a * 2**(e - width)`` (exact: ``a``
    has at most 53 bits and a power-of-two scale in range changes no bit)."""
    if not kind.is_floating_point:
        return (signs * a).to(kind)
    x = (signs * a).to(torch.float64) * 2.0 ** -width
    if exponents is not None:
        x = torch.ldexp(x, exponents.to(torch.float64))
    return x.to(kind)


def data(rank: int, numel: int, dtype: str, reduce_op: str = "", salt: int = 0,
         group_size: int = 1, index: int | None = None) -> Tensor:
    """Rank ``rank``'s ``numel`` elements (see the module docstring): ``index`` is its
    position in its group of ``group_size`` (default: ``rank``)."""
    kind = dtype_of(dtype)
    position = rank if index is None else index
    if kind == torch.bool:
        pick = _index(rank, numel, salt, 251 if not reduce_op else 8)
        return pick != 3 if reduce_op == "PRODUCT" else pick % 2 == 1
    p, k = PRECISION[kind], _bits_for(group_size)
    signs = _signs(rank, numel, salt)
    if not reduce_op:
        a = _significand(rank, numel, salt, p)
        exponents = None
        if kind.is_floating_point:
            table = torch.tensor(_MOVED_EXPONENTS[kind], dtype=torch.int64)
            exponents = table[(torch.arange(numel) + rank + salt) % len(table)] + 1
        return _scaled(a, signs, p, kind, exponents)
    if reduce_op == "PRODUCT":
        carrier = torch.arange(numel) % max(group_size, 1) == position
        # Integers: clamped to 1 bit past 31 (int32) or 63 (int64) ranks, where products
        # of 2s would overflow anyway.
        width = p if kind.is_floating_point else max(p - max(group_size, 1) + 1, 1)
        a = _scaled(_significand(rank, numel, salt, width), signs, width, torch.float64
                    if kind.is_floating_point else torch.int64)
        table = _PRODUCT_FLOAT if kind.is_floating_point else _PRODUCT_INT
        others = table[_index(rank, numel, salt, 8)]
        return torch.where(carrier, a, others.to(a.dtype)).to(kind)
    if reduce_op == "AVG":
        width = max(p - 2 * k, 1)  # 1 bit: +-1 times n, exact for any n a float can count
        return _scaled(_significand(rank, numel, salt, width) * group_size, signs,
                       p - k, kind)
    width = p - k
    return _scaled(_significand(rank, numel, salt, width), signs, width, kind)


def reduce(inputs: list[Tensor], reduce_op: str) -> Tensor:
    """The exact reduction of the members' ``inputs`` (same dtype and shape).

    Computed in float64 (floats) or int64 (integers): every input and every partial
    result is exact there (module docstring), so the one rounding, back to the dtype,
    changes nothing either.
    """
    dtype = inputs[0].dtype
    if dtype == torch.bool:
        stacked = torch.stack(inputs)
        return stacked.any(0) if reduce_op in ("SUM", "MAX") else stacked.all(0)
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stacked = torch.stack([t.to(wide) for t in inputs])
    if reduce_op == "SUM":
        out = stacked.sum(0)
    elif reduce_op == "AVG":
        out = stacked.sum(0) / len(inputs)
    elif reduce_op == "PRODUCT":
        out = stacked.prod(0)
    elif reduce_op == "MIN":
        out = stacked.amin(0)
    elif reduce_op == "MAX":
        out = stacked.amax(0)
    else:
        raise ValueError(f"unknown reduce op {reduce_op!r}")
    return out.to(dtype)


def bits(t: Tensor) -> Tensor:
    """``t``'s elements as integers of the same width: equal bits, equal integers."""
    if t.dtype == torch.bool or not t.dtype.is_floating_point:
        return t
    width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width)
