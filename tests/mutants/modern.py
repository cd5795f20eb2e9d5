"""Mutants that only the real-world models and modern procedures catch: channels_last
layouts, an eval forward between steps, dropout's per-rank randomness, uneven batches."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from ddp_reference.reducer import Bucket, Reducer

from ._base import MutantDDP

# --- channels_last ------------------------------------------------------------------------------


class _RowMajorCopyReducer(Reducer):
    def _copy_grad_in(self, bucket: Bucket, intra: int) -> None:
        grad = bucket.params[intra].grad
        view = bucket.views_in[intra]
        if grad is None or grad.is_contiguous() or self.comm_hook is not None \
                or self.gradient_as_bucket_view:
            super()._copy_grad_in(bucket, intra)
            return
        # The view's memory, in storage order, filled in the gradient's row-major order.
        memory = view.as_strided((view.numel(),), (1,))
        torch.mul(grad.reshape(-1), self._reciprocal(grad.dtype), out=memory)


class MixesLayoutConventions(MutantDDP):
    """Writes each gradient into its bucket in row-major order but reads the bucket back through
    views with the parameter's strides: a channels_last gradient comes back permuted (a reducer
    mixing a flat memcpy convention with torch's gradient layout contract)."""

    reducer_class = _RowMajorCopyReducer


# --- an eval forward under no_grad --------------------------------------------------------------


class SkipsBroadcastInNoGradForward(MutantDDP):
    """Broadcasts buffers only in forwards that build a graph: a validation forward under no_grad
    runs on each rank's own BatchNorm statistics (buffer sync tied to preparing the backward)."""

    def will_sync_module_buffers(self) -> bool:
        return torch.is_grad_enabled() and super().will_sync_module_buffers()


# --- dropout -----------------------------------------------------------------------------------


class SameDropoutOnEveryRank(MutantDDP):
    """Reseeds the RNG from its forward counter before every forward ('reproducible dropout'):
    the seed is the same on every rank, so every rank draws the same dropout masks."""

    forwards = 0

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        self.forwards += 1
        torch.manual_seed(self.forwards)
        return super().forward(*inputs, **kwargs)


# --- uneven per-rank batches --------------------------------------------------------------------


class _SampleWeightedReducer(Reducer):
    sample_weight = 1.0

    def _reciprocal(self, dtype: torch.dtype) -> float | torch.Tensor:
        return super()._reciprocal(dtype) * self.sample_weight


class WeightsRanksBySamples(MutantDDP):
    """Weights each rank's gradient by its share of the global batch (the sample-weighted mean
    users often expect): DDP averages the per-rank means, whatever the batch sizes."""

    reducer_class = _SampleWeightedReducer

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled() and inputs and isinstance(inputs[0], torch.Tensor) \
                and not self._join_config.enable:
            count = torch.tensor([inputs[0].shape[0]], dtype=torch.int64)
            total = count.clone()
            dist.all_reduce(total, group=self.process_group)
            self.reducer.sample_weight = int(count) * self.process_group.size() / int(total)
        return super().forward(*inputs, **kwargs)
