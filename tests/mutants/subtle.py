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
    """Launches each bucket as soon as it is full instead of in bucket order, so the order follows each
    rank's gradient-ready order. Harmless while that order is the same on every rank, which it is in
    every catalog model: the only rank-dependent branch (`unused_on_rank1`'s `extra`) is defined after
    the used one, so it lands in the first buckets, which complete first anyway. Caught by a model
    whose rank-dependent unused branch is defined *before* the used one, with find_unused_parameters
    and a ~100-byte bucket cap (the later bucket then completes first on the rank that skips the
    branch: mismatched allreduces, trace.consistent or a Gloo abort)."""

    reducer_class = _WhenReadyReducer


class _InPlaceAssumedReducer(Reducer):
    def _finalize_bucket_dense(self, bucket: Bucket, check_unused: bool) -> None:
        bucket.views_out = bucket.views_in  # a hook's result tensor is never read
        super()._finalize_bucket_dense(bucket, check_unused)


class HookResultAssumedInPlace(MutantDDP):
    """Assumes a comm hook reduces the bucket in place and ignores the tensor its future returns. Every
    hook the catalog registers (allreduce, fp16_compress, PowerSGD) writes its result into
    bucket.buffer() and returns that, so the defect never shows. Caught by a comm-hook scenario with
    a hook that returns a new tensor, e.g. `fut.then(lambda f: f.value()[0].clone())` after a
    divide-then-allreduce (a valid hook: torch copies whatever tensor the future holds); the
    mutant then keeps the local gradients (oracle.grad)."""

    reducer_class = _InPlaceAssumedReducer


class InitSyncSkipsBuffers(MutantDDP):
    """The constructor broadcasts parameters but not buffers (torch syncs both when broadcast_buffers is
    on). Invisible to every scenario: with broadcast_buffers the first forward broadcasts rank 0's
    buffers anyway, and without it torch does not sync them at all. Caught by an `init.buffer` check
    next to `init.param` in checks.py: after wrapping, buffers equal rank 0's (the oracle already has
    `initial_buffers`) where the scenario broadcasts buffers; init-sync/per-rank-weights-and-buffers
    then fails (what a user sees: evaluating or checkpointing before the first training forward)."""

    def _sync_module_states(self, src: int, with_buffers: bool) -> None:
        super()._sync_module_states(src, with_buffers and not getattr(self, "_constructing", False))
