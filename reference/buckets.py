"""Gradient bucket assignment, as torch's DDP computes it.

Specifies torch's ``_BucketCapacityConfig`` (``torch/nn/parallel/distributed.py``) and the
C++ ``compute_bucket_assignment_by_size`` (``torch/csrc/distributed/c10d/reducer.cpp``):

* tensors are grouped per (dtype, device); each group fills one open bucket at a time;
* a bucket closes as soon as its byte size *reaches* the current limit (``>=``), and the
  group then moves on to the next limit of the list (the last limit repeats);
* sparse-gradient tensors get a bucket of their own;
* buckets still open at the end are appended in the order torch's ``unordered_map``
  yields them (reverse order of first appearance of their key, see below);
* without explicit ``tensor_indices`` (construction time) the buckets are sorted by their
  smallest tensor index; with them (the rebuild after the first iteration, where tensors
  come in gradient-ready order) the order is kept as produced.

The layout torch's DDP starts with is this assignment, reversed (so that the last-defined
parameters, whose gradients come first, are in bucket 0).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

MB_TO_BYTES = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25
# torch's ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB); read from torch when it has it.
DEFAULT_FIRST_BUCKET_BYTES: int = getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", MB_TO_BYTES)


@dataclass(frozen=True)
class BucketCapacity:
    """Byte limits of DDP's buckets (torch's ``_BucketCapacityConfig``).

    ``bucket_cap_mb=None`` means the 25 MiB default *and* a 1 MiB first bucket; an explicit
    value (even 25) makes the first bucket as large as the others.

    ``bucket_cap_mb_list`` (torch's ``_BucketCapacityConfig.create``): one limit per bucket,
    in MiB, used as they are for the initial layout *and* the rebuild (the last one
    repeats); ``bucket_cap_mb`` is then ignored, and ``bytes_cap`` is the largest of them.
    """

    bytes_cap: int
    first_bytes_cap: int
    per_bucket_caps: tuple[int, ...] = ()

    @classmethod
    def from_bucket_cap_mb(cls, bucket_cap_mb: float | None,
                           bucket_cap_mb_list: Sequence[float] | None = None) -> BucketCapacity:
        if bucket_cap_mb_list:
            caps = tuple(int(mb * MB_TO_BYTES) for mb in bucket_cap_mb_list)
            cap = int(max(bucket_cap_mb_list) * MB_TO_BYTES)
            return cls(bytes_cap=cap, first_bytes_cap=cap, per_bucket_caps=caps)
        if bucket_cap_mb is None:
            cap = int(DEFAULT_BUCKET_CAP_MB * MB_TO_BYTES)
            return cls(bytes_cap=cap, first_bytes_cap=DEFAULT_FIRST_BUCKET_BYTES)
        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        cap = int(bucket_cap_mb * MB_TO_BYTES)
        return cls(bytes_cap=cap, first_bytes_cap=cap)

    @property
    def bucket_cap_mb(self) -> int:
        """Whole MiB of ``bytes_cap`` (torch's ``_BucketCapacityConfig.bucket_cap_mb``,
        which DDP passes, as a *byte* count, to the delayed parameters' broadcast)."""
        return self.bytes_cap // MB_TO_BYTES

    def initial_limits(self, static_graph: bool, find_unused_parameters: bool) -> list[int]:
        """Limits of the construction-time layout.

        Without dynamic unused-parameter search (``find_unused_parameters=False`` or a
        static graph) torch starts with one bucket per dtype (an unbounded limit) and
        rebuilds the layout from the gradient-ready order after the first iteration.
        """
        if self.per_bucket_caps:
            return list(self.per_bucket_caps)
        if static_graph or not find_unused_parameters:
            return [sys.maxsize]
        if self.first_bytes_cap < self.bytes_cap:
            return [self.first_bytes_cap, self.bytes_cap]
        return [self.bytes_cap]

    def rebuild_limits(self) -> list[int]:
        """Limits of the one-time rebuild (the C++ reducer's ``bucket_bytes_cap_list_`` when
        given, else ``{first_cap, cap}``)."""
        if self.per_bucket_caps:
            return list(self.per_bucket_caps)
        return [self.first_bytes_cap, self.bytes_cap]


def assign_buckets(
    tensors: Sequence[torch.Tensor],
    size_limits: Sequence[int],
    expect_sparse_gradient: Sequence[bool] | None = None,
    tensor_indices: Sequence[int] | None = None,
) -> list[list[int]]:
    """Group tensor indices into buckets (torch's ``compute_bucket_assignment_by_size``).

    ``tensors[i]`` stands for index ``tensor_indices[i]`` when ``tensor_indices`` is given
    (and ``expect_sparse_gradient`` is indexed by that index), for ``i`` otherwise.
    """
    if not tensors:
        raise ValueError("bucket assignment needs at least one tensor")
    if not size_limits:
        raise ValueError("bucket assignment needs at least one size limit")
    result: list[list[int]] = []
    # Open bucket, its byte size and its position in size_limits, per (dtype, device).
    # Python dicts keep insertion order: the key order is first appearance.
    open_buckets: dict[tuple[torch.dtype, torch.device], tuple[list[int], int, int]] = {}
    for position, tensor in enumerate(tensors):
        index = position if tensor_indices is None else int(tensor_indices[position])
        if tensor.is_sparse:
            raise RuntimeError("No support for sparse tensors.")
        if expect_sparse_gradient is not None and expect_sparse_gradient[index]:
            result.append([index])
            continue
        key = (tensor.dtype, tensor.device)
        indices, size, limit_pos = open_buckets.get(key, ([], 0, 0))
        indices.append(index)
        size += tensor.numel() * tensor.element_size()
        if size >= size_limits[limit_pos]:
            result.append(indices)
            indices, size = [], 0
            limit_pos = min(limit_pos + 1, len(size_limits) - 1)
        open_buckets[key] = (indices, size, limit_pos)
    # torch iterates a std::unordered_map here; with libstdc++ and the handful of keys a
    # model has, that yields the keys in reverse order of insertion.
    for indices, _, _ in reversed(list(open_buckets.values())):
        if indices:
            result.append(indices)
    if tensor_indices is None:
        result.sort(key=min)
    return result


def initial_bucket_layout(
    params: Sequence[torch.Tensor],
    capacity: BucketCapacity,
    expect_sparse_gradient: Sequence[bool],
    static_graph: bool,
    find_unused_parameters: bool,
) -> list[list[int]]:
    """The layout torch's DDP constructs its reducer with (assignment reversed)."""
    limits = capacity.initial_limits(static_graph, find_unused_parameters)
    return list(reversed(assign_buckets(params, limits, expect_sparse_gradient)))
