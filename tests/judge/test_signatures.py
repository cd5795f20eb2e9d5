"""The relations of judge/diagnose/signatures.py on synthetic values, near misses included:
a relation is named only when it holds to the rounding bound the module argues."""
from __future__ import annotations

import pytest
import torch

from ddp_conformance.judge.diagnose import signatures as sig


def locals_(world: int, n: int = 257, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, generator=g) for _ in range(world)]


def averaged(parts: list[torch.Tensor]) -> torch.Tensor:
    """DDP's average in float32: each part divided, summed in rank order."""
    total = parts[0] / len(parts)
    for p in parts[1:]:
        total = total + p / len(parts)
    return total


def summed(parts: list[torch.Tensor]) -> torch.Tensor:
    total = parts[0].clone()
    for p in parts[1:]:
        total = total + p
    return total


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_a_sum_without_division_is_world_size_times_the_average(world: int) -> None:
    parts = locals_(world)
    expected = averaged(parts)
    assert sig.fits_ratio(summed(parts), expected, float(world), world)
    c = sig.constant_ratio(summed(parts), expected, world)
    assert c is not None and abs(c - world) < 1e-5


@pytest.mark.parametrize("ratio", [1.98, 2.02, 1.999])
def test_a_ratio_near_two_is_not_two(ratio: float) -> None:
    parts = locals_(2)
    expected = averaged(parts)
    actual = (expected.double() * ratio).float()
    assert not sig.fits_ratio(actual, expected, 2.0, 2)
    c = sig.constant_ratio(actual, expected, 2)  # it is a constant, just not 2
    assert c is not None and abs(c - ratio) < 1e-6


def test_a_ratio_that_varies_by_element_is_no_constant() -> None:
    parts = locals_(2)
    expected = averaged(parts)
    noise = 1 + 0.01 * torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    actual = expected * 2 * noise
    assert sig.constant_ratio(actual, expected, 2) is None
    assert not sig.fits_ratio(actual, expected, 2.0, 2)


def test_one_wrong_element_breaks_the_ratio() -> None:
    parts = locals_(2)
    expected = averaged(parts)
    actual = summed(parts)
    actual[17] += 1e-3
    assert not sig.fits_ratio(actual, expected, 2.0, 2)


def test_no_ratio_to_all_zeros_and_no_ratio_across_shapes() -> None:
    zeros = torch.zeros(5)
    assert not sig.fits_ratio(torch.ones(5), zeros, 2.0, 2)
    assert sig.best_ratio(torch.ones(5), zeros) is None
    assert not sig.fits_ratio(torch.ones(5), torch.ones(6), 1.0, 2)
    assert not sig.fits_ratio(torch.tensor([float("nan"), 1.0]), torch.ones(2), 1.0, 2)


def test_equal_to_a_local_gradient_and_a_near_miss() -> None:
    local = locals_(2)[1]
    assert sig.equal_within(local.clone(), local, 2)
    assert not sig.equal_within(local * (1 + 1e-4), local, 2)
    assert sig.which_equal(local.clone(), {0: locals_(2)[0], 1: local}, 2) == 1
    assert sig.which_equal(local + 0.01, {0: locals_(2)[0], 1: local}, 2) is None
    assert sig.equal_within(torch.zeros(3), torch.zeros(3), 2)
    assert not sig.equal_within(torch.tensor([0.0, 1e-30, 0.0]), torch.zeros(3), 2)


def test_permuted_elements() -> None:
    expected = averaged(locals_(2))
    assert sig.permuted(expected.flip(0), expected, 2)
    assert not sig.permuted(expected.clone(), expected, 2)  # same order: no permutation
    shuffled = expected[torch.randperm(expected.numel(), generator=torch.Generator()
                                       .manual_seed(2))]
    assert sig.permuted(shuffled, expected, 2)
    near = shuffled.clone()
    near[3] *= 1.001
    assert not sig.permuted(near, expected, 2)


def test_rounded_through_float16() -> None:
    parts = locals_(2)
    expected = averaged(parts)
    through_half = ((parts[0] / 2).half() + (parts[1] / 2).half()).float()
    assert sig.narrowed_through(through_half, expected, 2) is torch.float16
    assert sig.rounding_dtype(through_half, expected, 2) is torch.float16
    # Not representable in float16: an error of that size alone is at float16's scale.
    assert sig.narrowed_through(through_half / 3, expected / 3, 2) is None
    assert sig.rounding_dtype(through_half / 3, expected / 3, 2) is torch.float16


def test_rounded_through_bfloat16() -> None:
    expected = averaged(locals_(2))
    assert sig.narrowed_through(expected.bfloat16().float(), expected, 2) is torch.bfloat16


def test_errors_not_at_a_narrow_dtypes_rounding() -> None:
    expected = averaged(locals_(2))
    g = torch.Generator().manual_seed(3)
    # Far finer than float16's rounding (1e-6 relative): float32 noise of another kind.
    fine = expected * (1 + 1e-6 * torch.randn(expected.shape, generator=g))
    assert sig.rounding_dtype(fine, expected, 2) is None
    assert sig.narrowed_through(fine, expected, 2) is None
    # Far coarser (5%): no narrow dtype rounds that badly.
    coarse = expected * (1 + 0.05 * torch.randn(expected.shape, generator=g))
    assert sig.rounding_dtype(coarse, expected, 2) is None
    # Within float32's own bound: nothing to explain.
    assert sig.rounding_dtype(expected.clone(), expected, 2) is None


def test_the_bound_scales_with_the_dtype_and_the_terms() -> None:
    assert sig.rounding_bound(torch.float32, 1.0, 2) == pytest.approx(8 * 2.0 ** -24)
    assert sig.rounding_bound(torch.float64, 1.0, 2) < sig.rounding_bound(torch.float32, 1.0, 2)
    assert sig.rounding_bound(torch.float32, 1.0, 4) == 2 * sig.rounding_bound(torch.float32,
                                                                                1.0, 2)
    assert sig.unit_roundoff(torch.complex64) == sig.unit_roundoff(torch.float32)
    assert sig.unit_roundoff(torch.int64) == 0.0


def test_a_sum_that_overflows_is_still_the_ratio_where_it_is_finite() -> None:
    g0 = torch.tensor([30000.0, 1.0, -2.0, 40000.0], dtype=torch.float16)
    g1 = torch.tensor([35000.0, 3.0, 2.0, 30000.0], dtype=torch.float16)
    expected, actual = g0 / 2 + g1 / 2, g0 + g1  # 70000 overflows float16
    assert torch.isinf(actual).any()
    assert sig.fits_ratio(actual, expected, 2.0, 2)
    assert not sig.fits_ratio(actual, expected, 1.0, 2)
    nan = actual.clone()
    nan[1] = float("nan")
    assert not sig.fits_ratio(nan, expected, 2.0, 2)
    # inf where twice the expected is far from float16's range: not an overflow.
    small = torch.tensor([10.0, 2.0], dtype=torch.float16)
    assert not sig.fits_ratio(torch.tensor([float("inf"), 4.0], dtype=torch.float16), small, 2.0, 2)
