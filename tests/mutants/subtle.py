"""Subtle defects that slipped through the first catalog, and what now catches them.

Each docstring says the defect and the check or scenario added for it: the
``unused/branch-first-tiny-cap`` scenario (rank-dependent bucket readiness), the
``comm-hooks/returns-new-tensor`` scenario (a hook whose result is a new tensor), and the
``init.buffer`` check with ``init-sync/per-rank-random-buffer`` (buffers at init).
"""
from __future__ import annotations

from ddp_reference.reducer import Bucket, Reducer

from ._base import MutantDDP


class _WhenReadyReducer(Reducer):
    def _mark_bucket_ready(self, bucket: Bucket) -> bool:
        self._all_reduce_bucket(bucket)  # as soon as it is full, whatever the bucket order
        self.next_bucket += 1
        return True


class LaunchesBucketsWhenReady(MutantDDP):
    """Launches each bucket as soon as it is full instead of in bucket order, so the order
    follows each rank's gradient-ready order: harmless while that order is the same on every rank,
    mismatched allreduces when a rank-dependent branch makes ranks ready in different orders.
    Caught by ``unused/branch-first-tiny-cap`` (a Gloo abort on the mismatched collectives)."""

    reducer_class = _WhenReadyReducer


class _InPlaceAssumedReducer(Reducer):
    def _finalize_bucket_dense(self, bucket: Bucket, check_unused: bool) -> None:
        bucket.views_out = bucket.views_in  # a hook's result tensor is never read
        super()._finalize_bucket_dense(bucket, check_unused)


class HookResultAssumedInPlace(MutantDDP):
    """Assumes a comm hook reduces the bucket in place and ignores the tensor its future
    returns (torch copies whatever the future holds). Caught by ``comm-hooks/returns-new-tensor``:
    the local gradients stay (oracle.grad)."""

    reducer_class = _InPlaceAssumedReducer


class InitSyncSkipsBuffers(MutantDDP):
    """The constructor broadcasts parameters but not buffers (torch syncs both when
    broadcast_buffers is on); the first forward's broadcast hides it, evaluating or
    checkpointing before training does not. Caught by the ``init.buffer`` check on
    ``init-sync/per-rank-random-buffer``."""

    def _sync_module_states(self, src: int, with_buffers: bool) -> None:
        super()._sync_module_states(src, with_buffers and not getattr(self, "_constructing", False))
