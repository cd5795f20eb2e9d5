"""The bucket handed to DDP communication hooks, and the hook contract.

Specifies ``c10d::GradBucket`` (``torch.distributed.GradBucket``) as torch's built-in hooks
use it (``default_hooks.allreduce_hook``, ``fp16_compress_hook``,
``powerSGD_hook.powerSGD_hook`` ...): ``index()``, ``is_last()``, ``buffer()``,
``set_buffer()``, ``gradients()`` and ``parameters()``. A hook is called as
``hook(state, bucket)`` and returns a ``torch.futures.Future`` whose value is the reduced
flat tensor (or a one-element list of it); the reducer copies that tensor back into the
gradients. With a hook registered, the reducer does not divide by the world size: the
hook does (torch's "Note [DDP Communication Hook]").
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .collectives import allreduce

CommHook = Callable[[Any, Any], "torch.futures.Future[Any]"]


class GradBucket:
    """A flat gradient bucket: one 1-D tensor holding several parameters' gradients."""

    __slots__ = (
        "_bucket_count",
        "_buffer",
        "_index",
        "_lengths",
        "_offsets",
        "_parameters",
        "_sizes",
    )

    def __init__(self, index: int, bucket_count: int, buffer: torch.Tensor,
                 offsets: Sequence[int], lengths: Sequence[int],
                 sizes: Sequence[torch.Size], parameters: Sequence[torch.Tensor]) -> None:
        self._index = index
        self._bucket_count = bucket_count
        self._buffer = buffer
        self._offsets = offsets
        self._lengths = lengths
        self._sizes = sizes
        self._parameters = parameters

    def index(self) -> int:
        """Position of the bucket in the reduction order (0 is reduced first)."""
        return self._index

    def is_last(self) -> bool:
        """Whether this is the last bucket reduced in the iteration."""
        return self._index == self._bucket_count - 1

    def buffer(self) -> torch.Tensor:
        """The flat gradient tensor (already in bucket layout; not divided)."""
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        """Replace the tensor ``buffer()`` returns (the reducer keeps its own)."""
        self._buffer = buffer

    def gradients(self) -> list[torch.Tensor]:
        """Per-parameter views of ``buffer()``, shaped like the parameters."""
        if self._buffer.is_sparse:
            return [self._buffer]
        return [self._buffer.narrow(0, off, length).view(size)
                for off, length, size in zip(self._offsets, self._lengths, self._sizes, strict=True)]

    def parameters(self) -> list[torch.Tensor]:
        """The parameters whose gradients the bucket holds, in bucket order."""
        return list(self._parameters)

    def __repr__(self) -> str:
        return (f"GradBucket(index={self._index}, bucket_count={self._bucket_count}, "
                f"numel={self._buffer.numel()}, dtype={self._buffer.dtype})")


def allreduce_sum_future(pg: dist.ProcessGroup, tensor: torch.Tensor) -> torch.futures.Future:
    """The reducer's default reduction as a future (c10d's ``_AllReduceBySumCommHook``):
    a plain SUM allreduce, no division (the reducer divided before)."""
    return allreduce(pg, tensor, dist.ReduceOp.SUM).get_future()


def builtin_comm_hook(kind: dist.BuiltinCommHookType) -> CommHook | None:
    """The hook for one of c10d's built-in types (``default_comm_hooks.cpp``), called with
    the process group as state: ``ALLREDUCE`` divides the bucket in place by the group size
    then allreduces it; ``FP16_COMPRESS`` divides a float16 copy, allreduces it and copies
    the result back into the bucket. ``None`` for any other type."""
    if kind == dist.BuiltinCommHookType.ALLREDUCE:
        return _builtin_allreduce
    if kind == dist.BuiltinCommHookType.FP16_COMPRESS:
        return _builtin_fp16_compress
    return None


def _builtin_allreduce(pg: dist.ProcessGroup, bucket: GradBucket) -> torch.futures.Future:
    tensor = bucket.buffer()
    tensor.div_(pg.size())
    return allreduce_sum_future(pg, tensor)


def _builtin_fp16_compress(pg: dist.ProcessGroup, bucket: GradBucket) -> torch.futures.Future:
    buffer = bucket.buffer()
    compressed = buffer.to(torch.float16)
    compressed.div_(pg.size())

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(hook_result(fut.value()))
        return buffer

    return allreduce_sum_future(pg, compressed).then(decompress)


def hook_result(value: Any) -> torch.Tensor:
    """The tensor a hook's future holds (a tensor or a one-tensor list, as torch parses)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], torch.Tensor):
        return value[0]
    raise RuntimeError(
        "The value of a DDP communication hook's future must be a tensor or a list of one "
        f"tensor, got {type(value).__name__}"
    )


def check_comm_hook(hook: Callable[..., Any]) -> None:
    """Validate a hook as torch's ``DistributedDataParallel._check_comm_hook`` does."""
    if not callable(hook):
        raise TypeError("Communication hook must be callable.")
    sig = inspect.signature(hook)
    bucket = sig.parameters.get("bucket")
    if (bucket is not None and bucket.annotation is not inspect.Parameter.empty
            and bucket.annotation not in (dist.GradBucket, GradBucket, "dist.GradBucket",
                                          "GradBucket")):
        raise ValueError("Communication hook: bucket annotation should be dist.GradBucket.")
    if (sig.return_annotation is not inspect.Signature.empty
            and sig.return_annotation != torch.futures.Future[torch.Tensor]
            and sig.return_annotation != "torch.futures.Future[torch.Tensor]"):
        raise ValueError(
            "Communication hook: return annotation should be torch.futures.Future[torch.Tensor]."
        )
    if getattr(hook, "__name__", None) in ("bf16_compress_hook", "bf16_compress_wrapper_hook"):
        cuda = torch.version.cuda is not None or torch.version.hip is not None
        nccl = cuda and dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10)
        xccl = dist.is_xccl_available() and torch.xpu.is_available()
        if not (nccl or xccl):
            raise TypeError("BF16 all reduce communication hook required CUDA 11+ and NCCL "
                            "2.10+ or XPU and XCCL")
