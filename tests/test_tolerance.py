"""Tolerances: tight enough to catch a float16 reduction, loose enough for reordering."""
from __future__ import annotations

import math

import torch

from ddp_conformance.judge.tolerance import distance, rtol_for, ulp_distance


def reduce_like_ddp(grads: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """Divide each rank's gradient by W in ``dtype``, sum in rank order, back to float32."""
    total = torch.zeros_like(grads[0], dtype=dtype)
    for g in grads:
        total = total + (g.to(dtype) / len(grads))
    return total.float()


def test_reordered_float32_reduction_is_within_tolerance() -> None:
    gen = torch.Generator().manual_seed(0)
    for world_size in (2, 3, 4):
        grads = [torch.randn(1000, generator=gen) for _ in range(world_size)]
        forward = reduce_like_ddp(grads, torch.float32)
        backward = reduce_like_ddp(grads[::-1], torch.float32)
        assert distance(backward, forward).within(rtol_for(torch.float32, False))


def test_a_float16_or_bfloat16_reduction_is_caught() -> None:
    gen = torch.Generator().manual_seed(1)
    for world_size in (2, 3, 4):
        grads = [torch.randn(1000, generator=gen) for _ in range(world_size)]
        expected = reduce_like_ddp(grads, torch.float32)
        for low in (torch.float16, torch.bfloat16):
            d = distance(reduce_like_ddp(grads, low), expected)
            assert not d.within(rtol_for(torch.float32, False)), (world_size, low, d)
            assert d.max_abs > 10 * rtol_for(torch.float32, False) * d.scale


def test_exact_tolerance_is_bitwise() -> None:
    a = torch.tensor([1.0, 2.0])
    b = torch.nextafter(a, torch.tensor(math.inf))
    assert distance(a, a.clone()).within(0.0)
    assert not distance(b, a).within(0.0)
    assert rtol_for(torch.float32, True) == 0.0 and rtol_for(torch.int64, False) == 0.0


def test_ulp_distance_counts_representable_values() -> None:
    a = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float32)
    up = torch.nextafter(a, torch.tensor(math.inf))
    assert ulp_distance(up, a) == 1.0
    two_up = torch.nextafter(up, torch.tensor(math.inf))
    assert ulp_distance(two_up, a) == 2.0
    # Across zero: -min_subnormal to +min_subnormal is 2 steps.
    tiny = torch.tensor([1e-45])
    assert ulp_distance(tiny, -tiny) == 2.0
    for dtype in (torch.float64, torch.float16, torch.bfloat16):
        x = torch.tensor([3.0], dtype=dtype)
        assert ulp_distance(torch.nextafter(x, torch.tensor([9.0], dtype=dtype)), x) == 1.0


def test_distance_figures() -> None:
    d = distance(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0]))
    assert d.max_abs == 0.5 and d.max_rel == 0.25 and d.scale == 2.0
    assert distance(torch.zeros(2), torch.zeros(3)).max_abs == math.inf
    nan = distance(torch.tensor([math.nan]), torch.tensor([1.0]))
    assert not nan.within(1.0)
