"""Bucket assignment equals torch's C++ ``_compute_bucket_assignment_by_size`` (used here
only as the oracle; the reference never calls it), for initial layouts and rebuilds."""
from __future__ import annotations

import sys

import ddp_reference
import pytest
import torch
import torch.distributed as dist
from ddp_reference.buckets import BucketCapacity, assign_buckets, initial_bucket_layout

KIB = 1024


def _tensors(spec: list[tuple[int, torch.dtype]]) -> list[torch.Tensor]:
    return [torch.empty(n, dtype=dtype) for n, dtype in spec]


CASES = {
    "uniform": [(100, torch.float32)] * 12,
    "one_above_cap": [(10, torch.float32), (5000, torch.float32), (10, torch.float32)],
    "mixed_dtypes": [(300, torch.float32), (200, torch.float64), (300, torch.float32),
                     (50, torch.float64), (700, torch.float32), (10, torch.float16),
                     (90, torch.float64)],
    "many_tiny": [(3, torch.float32)] * 200,
    "exact_fit": [(256, torch.float32)] * 8,  # 1 KiB each: closes exactly at the limit
}
LIMITS = [[sys.maxsize], [KIB], [2 * KIB, 4 * KIB], [KIB // 2, 3 * KIB], [10 ** 9]]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("limits", LIMITS, ids=str)
def test_assignment_matches_torch(case: str, limits: list[int]) -> None:
    tensors = _tensors(CASES[case])
    expected, _ = dist._compute_bucket_assignment_by_size(tensors, limits)
    assert assign_buckets(tensors, limits) == [list(b) for b in expected]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("limits", LIMITS[1:], ids=str)
def test_rebuild_assignment_matches_torch(case: str, limits: list[int]) -> None:
    tensors = _tensors(CASES[case])
    order = list(torch.randperm(len(tensors), generator=torch.Generator().manual_seed(0)))
    order = [int(i) for i in order]
    ordered = [tensors[i] for i in order]
    flags = [False] * len(tensors)
    expected, _ = dist._compute_bucket_assignment_by_size(ordered, limits, flags, order)
    assert assign_buckets(ordered, limits, flags, tensor_indices=order) == [list(b) for b in expected]


def test_sparse_gradients_get_their_own_bucket() -> None:
    tensors = _tensors([(10, torch.float32)] * 5)
    flags = [False, True, False, False, True]
    expected, _ = dist._compute_bucket_assignment_by_size(tensors, [10 ** 6], flags)
    assert assign_buckets(tensors, [10 ** 6], flags) == [list(b) for b in expected]


def test_capacity_defaults_follow_torch() -> None:
    default = BucketCapacity.from_bucket_cap_mb(None)
    assert default.bytes_cap == 25 * 1024 * 1024
    assert default.first_bytes_cap == dist._DEFAULT_FIRST_BUCKET_BYTES
    explicit = BucketCapacity.from_bucket_cap_mb(25)
    assert explicit.first_bytes_cap == explicit.bytes_cap  # no small first bucket then
    assert default.initial_limits(static_graph=False, find_unused_parameters=False) == [sys.maxsize]
    assert default.initial_limits(static_graph=True, find_unused_parameters=True) == [sys.maxsize]
    assert default.initial_limits(static_graph=False, find_unused_parameters=True) == [
        dist._DEFAULT_FIRST_BUCKET_BYTES, 25 * 1024 * 1024]
    assert explicit.initial_limits(False, True) == [explicit.bytes_cap]


def test_initial_layout_is_reversed_assignment() -> None:
    params = _tensors([(200, torch.float32)] * 6)
    cap = BucketCapacity.from_bucket_cap_mb(1000 / (1024 * 1024))
    layout = initial_bucket_layout(params, cap, [False] * 6, static_graph=False,
                                   find_unused_parameters=True)
    assert layout == [[4, 5], [2, 3], [0, 1]]
    assert ddp_reference.initial_bucket_layout is initial_bucket_layout
