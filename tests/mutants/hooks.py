"""Mutants of comm hooks and gradient_as_bucket_view, and two built on torch's own DDP."""
from __future__ import annotations

from typing import Any

import torch
from ddp_reference.reducer import Bucket, Reducer
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from ._base import MutantDDP


class CommHookIgnored(MutantDDP):
    """Accepts register_comm_hook and ignores the hook: buckets are still plain-allreduced (a wrapper that
    stores the hook on an inner object never used)."""

    def register_comm_hook(self, state: object, hook: Any) -> None:
        self._comm_hooks.append((hook, state))


class SecondCommHookAccepted(MutantDDP):
    """Silently accepts a second register_comm_hook, replacing the first (torch raises: a hook may be
    registered once only)."""

    def register_comm_hook(self, state: object, hook: Any) -> None:
        self.reducer.comm_hook = None
        super().register_comm_hook(state, hook)




class _NotRepointedReducer(Reducer):
    def _copy_grad_in(self, bucket: Bucket, intra: int) -> None:
        param = bucket.params[intra]
        grad = param.grad
        super()._copy_grad_in(bucket, intra)
        if self.gradient_as_bucket_view and grad is not None and param.grad is not grad:
            param.grad = grad  # .grad left on the fresh tensor autograd made after set_to_none

    def _finalize_bucket_dense(self, bucket: Bucket, check_unused: bool) -> None:
        if not self.gradient_as_bucket_view:
            super()._finalize_bucket_dense(bucket, check_unused)
            return
        for param, view in zip(bucket.params, bucket.views_in, strict=True):
            if param.grad is None:
                param.grad = view  # only where there was no gradient at all


class BucketViewNotRepointed(MutantDDP):
    """With gradient_as_bucket_view, does not re-point .grad at the bucket view after
    zero_grad(set_to_none=True): .grad keeps the local, unreduced gradient."""

    reducer_class = _NotRepointedReducer


class TorchDDPFp16Compressed(TorchDDP):
    """torch's DDP that registers fp16_compress_hook itself: float32 gradients silently reduced in float16 (a
    framework default)."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__(module, *args, **kwargs)
        super().register_comm_hook(self.process_group, default_hooks.fp16_compress_hook)

    def register_comm_hook(self, state: object, hook: Any) -> None:
        pass  # the user's hook is dropped: only one may be registered


class TorchDDPNoSyncIgnored(TorchDDP):
    """torch's DDP whose no_sync() is a no-op (a wrapper exposing no_sync for API compatibility): every
    microbatch synchronises."""

    def no_sync(self) -> Any:
        import contextlib

        return contextlib.nullcontext()
