"""Exact-valued data for collective checks, and what each operation must produce from it.

Every rank can compute every rank's input (it depends on the rank, the element index and a
salt only), so each rank computes the expected result itself and compares bitwise.

Why every result is exact, in every dtype and in any order of reduction:

- data moved without reduction takes integer values 0..250: integers up to 256 are exact
  in bfloat16 (8 significant bits), float16 (11) and wider types;
- SUM, MIN and MAX take integers -4..3, so any partial sum of up to 64 ranks lies in
  [-256, 192]: exact in bfloat16 and wider, and in every integer type;
- AVG takes ``group size`` times such integers: the sum is exact as above (for up to 8
  ranks, |sum| <= 8 * 8 * 4 = 256), and dividing an exact multiple of n by n is exact
  (correctly rounded division of an exact quotient), whether a backend divides the sum
  or each input;
- PRODUCT takes values in {0.5, 1, 2, -1} (integers {1, 2, -1}): every partial product
  of up to 64 ranks is a signed power of two within 2**-64..2**64 (float16 and bfloat16
  need 8 ranks or fewer: 2**8 is exact and in range in both); integer products of up to
  30 ranks fit int32;
- bool reduces as logic: SUM and MAX are "any", PRODUCT and MIN are "all" (what Gloo and
  NCCL do).
"""
from __future__ import annotations

import torch
from torch import Tensor

_PRODUCT_FLOAT = torch.tensor([0.5, 1.0, 2.0, -1.0, 1.0, 1.0, 2.0, 0.5], dtype=torch.float64)
_PRODUCT_INT = torch.tensor([1, 2, -1, 1, 1, -1, 2, 1], dtype=torch.int64)
#: What the elements between a strided tensor's elements hold: no result takes this value.
SENTINEL = 99


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def _index(rank: int, numel: int, salt: int, period: int) -> Tensor:
    return (torch.arange(numel, dtype=torch.int64) * 7 + rank * 13 + salt * 5) % period


def data(rank: int, numel: int, dtype: str, reduce_op: str = "", salt: int = 0,
         group_size: int = 1) -> Tensor:
    """Rank ``rank``'s ``numel`` elements (see the module docstring for the ranges)."""
    kind = dtype_of(dtype)
    if not reduce_op:
        k = _index(rank, numel, salt, 251)
        return (k % 2 == 1) if kind == torch.bool else k.to(kind)
    k = _index(rank, numel, salt, 8)
    if reduce_op == "PRODUCT":
        if kind == torch.bool:
            return k != 3
        table = _PRODUCT_FLOAT if kind.is_floating_point else _PRODUCT_INT
        return table[k].to(kind)
    if kind == torch.bool:
        return k % 2 == 1
    values = k - 4
    if reduce_op == "AVG":
        values = values * group_size
    return values.to(kind)


def reduce(inputs: list[Tensor], reduce_op: str) -> Tensor:
    """The exact reduction of the members' ``inputs`` (same dtype and shape)."""
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

