"""Mutants of the gradient reduction itself: divisor, precision, op, buckets, write-back."""
from __future__ import annotations

import torch
import torch.distributed as dist
from ddp_reference import collectives
from ddp_reference.reducer import Bucket, Reducer, bucket_views

from ._base import MutantDDP, done_future, force_divisor

# --- the divisor --------------------------------------------------------------------------


class _NoDivisionReducer(Reducer):
    def _set_divide_factor(self) -> None:
        super()._set_divide_factor()
        force_divisor(self, 1)


class SumsWithoutDividing(MutantDDP):
    """Sums gradients over the ranks and never divides by the world size (a custom reducer or hook that
    allreduces with SUM and forgets the mean)."""

    reducer_class = _NoDivisionReducer


class _WorldPlusOneReducer(Reducer):
    def _set_divide_factor(self) -> None:
        super()._set_divide_factor()
        force_divisor(self, self.process_group.size() + 1)


class DividesByWorldPlusOne(MutantDDP):
    """Divides by world size + 1 (an off-by-one in counting ranks, e.g. counting a launcher or
    parameter-server process)."""

    reducer_class = _WorldPlusOneReducer


class _DivideAfterSumReducer(_NoDivisionReducer):
    def _finalize_bucket_dense(self, bucket: Bucket, check_unused: bool) -> None:
        if self.comm_hook is None:
            for view in bucket.views_out:
                view.div_(self.process_group.size())
        super()._finalize_bucket_dense(bucket, check_unused)


class DividesAfterSumming(MutantDDP):
    """Sums first and divides afterwards, in the gradient's dtype: a float16 sum overflows where DDP's
    divide-then-sum does not (the naive 'allreduce then /= world' of hand-written reducers)."""

    reducer_class = _DivideAfterSumReducer


# --- the collective -----------------------------------------------------------------------


class _MaxReducer(Reducer):
    def _all_reduce_bucket(self, bucket: Bucket) -> None:
        if bucket.expect_sparse or self.comm_hook is not None:
            super()._all_reduce_bucket(bucket)
            return
        bucket.work = collectives.allreduce(self.process_group, bucket.gradients, dist.ReduceOp.MAX)
        bucket.future = None


class ReducesWithMax(MutantDDP):
    """Allreduces buckets with ReduceOp.MAX instead of SUM (a wrong op constant passed through a backend
    wrapper)."""

    reducer_class = _MaxReducer


class _TwiceReducer(Reducer):
    def _all_reduce_bucket(self, bucket: Bucket) -> None:
        super()._all_reduce_bucket(bucket)
        if bucket.expect_sparse or self.comm_hook is not None or bucket.work is None:
            return
        bucket.work.wait()
        bucket.gradients.div_(self.process_group.size())  # re-averaged: the values stay right
        bucket.work = collectives.allreduce(self.process_group, bucket.gradients)


class ReducesEveryBucketTwice(MutantDDP):
    """Reduces every bucket twice, re-averaging so the values stay right (a grad hook registered twice, or a
    reducer plus a hook both reducing): twice the traffic."""

    reducer_class = _TwiceReducer


def _low_precision_reducer(dtype: torch.dtype) -> type[Reducer]:
    class _LowPrecisionReducer(Reducer):
        def _all_reduce_bucket(self, bucket: Bucket) -> None:
            grads = bucket.gradients
            if (bucket.expect_sparse or self.comm_hook is not None
                    or grads.element_size() <= torch.empty(0, dtype=dtype).element_size()):
                super()._all_reduce_bucket(bucket)
                return
            low = grads.to(dtype)
            fut = self.process_group.allreduce([low]).get_future()
            bucket.future = fut.then(lambda f: grads.copy_(f.value()[0]))
            bucket.work = None

    _LowPrecisionReducer.__name__ = f"_{str(dtype).removeprefix('torch.')}Reducer"
    return _LowPrecisionReducer


class ReducesInFloat16(MutantDDP):
    """Silently reduces float32 buckets in float16 (a 'communication compression' default left on, as in
    fp16_compress_hook registered by a framework)."""

    reducer_class = _low_precision_reducer(torch.float16)


class ReducesInBFloat16(MutantDDP):
    """Silently reduces float32 buckets in bfloat16 (mixed-precision wrappers that cast gradients for
    communication without being asked)."""

    reducer_class = _low_precision_reducer(torch.bfloat16)


class ReducesFloat64InFloat32(MutantDDP):
    """Reduces every bucket in one float32 flat buffer: float64 parameters lose precision (a flat buffer
    allocated in the default dtype instead of per dtype)."""

    reducer_class = _low_precision_reducer(torch.float32)


# --- bucket readiness and order -------------------------------------------------------------


class _UnsyncedLastReducer(Reducer):
    def _all_reduce_bucket(self, bucket: Bucket) -> None:
        if bucket is not self.buckets[-1] or bucket.expect_sparse:
            super()._all_reduce_bucket(bucket)
            return
        bucket.work = None
        bucket.future = done_future(bucket.gradients)  # never reduced


class LastBucketNeverReduced(MutantDDP):
    """Never launches the last bucket's allreduce (an off-by-one in the ready loop, or a final partial bucket
    that is never flushed)."""

    reducer_class = _UnsyncedLastReducer


class _StaleReducer(Reducer):
    def _copy_grad_in(self, bucket: Bucket, intra: int) -> None:
        if bucket.pending == 1 and len(bucket.params) > 1:
            return  # launched before its last gradient arrived: the view keeps old values
        super()._copy_grad_in(bucket, intra)


class ReducesBucketBeforeLastGradient(MutantDDP):
    """Launches a bucket before its last gradient is copied in, so that parameter is reduced with the
    previous iteration's value (a ready count off by one)."""

    reducer_class = _StaleReducer




class _OddRanksReverseReducer(Reducer):
    def _mark_bucket_ready(self, bucket: Bucket) -> bool:
        if self.process_group.rank() % 2 == 0:
            return super()._mark_bucket_ready(bucket)
        if any(b.pending for b in self.buckets):
            return False
        for b in reversed(self.buckets):  # odd ranks: last bucket first
            self._all_reduce_bucket(b)
            self.next_bucket += 1
        return True


class BucketOrderDependsOnRank(MutantDDP):
    """Odd ranks launch their buckets in reverse order (a per-rank iteration order, e.g. over a set or a dict
    keyed by tensor ids)."""

    reducer_class = _OddRanksReverseReducer


class _LocalLayoutReducer(Reducer):
    def _sync_bucket_indices(self, layout: list[list[int]]) -> list[list[int]]:
        return layout  # each rank keeps the layout from its own gradient-ready order


class RebuildKeepsLocalLayout(MutantDDP):
    """Rebuilds buckets from its own gradient-ready order without adopting rank 0's layout (torch broadcasts
    rank 0's; without it ranks can bucket differently)."""

    reducer_class = _LocalLayoutReducer


# --- writing results back -------------------------------------------------------------------


class _NoWriteBackReducer(Reducer):
    def _finalize_bucket_dense(self, bucket: Bucket, check_unused: bool) -> None:
        if not self.gradient_as_bucket_view:
            return  # the reduced bucket is never copied into param.grad


class ResultsNeverWrittenBack(MutantDDP):
    """Waits for the allreduce but never copies the reduced bucket back into .grad (backward returns with the
    local gradients)."""

    reducer_class = _NoWriteBackReducer


class _ShiftedReducer(Reducer):
    def _finalize_bucket_dense(self, bucket: Bucket, check_unused: bool) -> None:
        flat = torch.cat([v.reshape(-1) for v in bucket.views_out])
        shifted = torch.cat([flat[1:], flat[:1]])  # every offset off by one element
        bucket.views_out = bucket_views(shifted, bucket.params, bucket.offsets)
        super()._finalize_bucket_dense(bucket, check_unused)


class WritesBackAtWrongOffsets(MutantDDP):
    """Copies results back from offsets off by one element (offsets computed from padded or aligned sizes on
    one side only)."""

    reducer_class = _ShiftedReducer
