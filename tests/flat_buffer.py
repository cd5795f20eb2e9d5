"""Standalone DDPs on ``torch.distributed`` for the trace checks: flat buffers reduced
whole, gradients reduced twice, and reduction through a group the harness cannot trace.

- :class:`FlatBufferDDP`: fairseq's legacy DDP as it reduces: after backward, the
  gradients are copied into one flat buffer sized for *every* parameter (frozen ones
  included, as fairseq sizes it), the whole buffer (its uninitialised tail where the
  frozen parameters would be included) is divided by the world size and all-reduced
  once, and the gradients are copied back. Correct: values equal the oracle's; its
  stale tail is no gradient reduced twice.
- :class:`SmallBufferDDP`: the same with a buffer smaller than the model (fairseq's
  ``buffer_size``): a gradient larger than the buffer is reduced in place, the others
  are batched into the buffer, which is reduced whole once per batch that fits, reused
  within one backward, its tail stale from the previous batch. Correct.
- :class:`ReducesBufferTwice`: :class:`FlatBufferDDP` that all-reduces its buffer a
  second time (dividing again): values right, every gradient reduced twice.
- :class:`ReducesEachGradientTwice`: all-reduces each gradient in place, averages,
  and does it again: values right, every gradient reduced twice.
- :class:`OwnGroupDDP`: broadcasts and all-reduces through a ``ProcessGroupGloo`` of its
  own, built directly on a ``PrefixStore`` over the default store (as torchft's managed
  group is): correct, and no collective of it passes through the traced group.
"""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class FlatBufferDDP(nn.Module):
    """Gradients reduced after backward through one flat buffer, reduced whole."""

    def __init__(self, module: nn.Module, device_ids: Any = None, output_device: Any = None,
                 process_group: Any = None, buffer_size: int | None = None,
                 **ignored: Any) -> None:
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        params = list(module.parameters())
        whole = sum(p.numel() for p in params)
        size = buffer_size or whole
        self.buffer = params[0].new_empty(size)  # uninitialised: its tail is never written
        self.synced = True
        self._queued = False
        self._init_sync(params)
        for p in params:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._queue)

    # --- the collectives, on the traced group (subclasses may go elsewhere) ---
    def _init_sync(self, params: list[nn.Parameter]) -> None:
        source = dist.get_global_rank(self.process_group, 0) \
            if self.process_group is not None else 0
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, source, group=self.process_group)

    def _all_reduce(self, t: torch.Tensor) -> None:
        dist.all_reduce(t, group=self.process_group)

    # --- after backward ---
    def _queue(self, _: torch.Tensor) -> None:
        if self.synced and not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._reduce_all)

    def _reduce_all(self) -> None:
        self._queued = False
        batch: list[nn.Parameter] = []
        offset = 0
        for p in self.module.parameters():
            if not p.requires_grad:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            if p.numel() > self.buffer.numel():  # too big for the buffer: in place
                with torch.no_grad():
                    p.grad.div_(self.world_size)
                    self._reduce_buffer(p.grad)
                continue
            if offset + p.numel() > self.buffer.numel() and batch:
                self._reduce_batch(batch)
                batch, offset = [], 0
            batch.append(p)
            offset += p.numel()
        if batch:
            self._reduce_batch(batch)

    def _reduce_batch(self, params: list[nn.Parameter]) -> None:
        buffer, offset = self.buffer, 0
        with torch.no_grad():
            for p in params:
                assert p.grad is not None
                buffer[offset:offset + p.numel()].copy_(p.grad.view(-1))
                offset += p.numel()
            buffer.div_(self.world_size)  # the whole buffer, as fairseq does
            self._reduce_buffer(buffer)
            offset = 0
            for p in params:
                assert p.grad is not None
                p.grad.copy_(buffer[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def _reduce_buffer(self, buffer: torch.Tensor) -> None:
        self._all_reduce(buffer)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        previous, self.synced = self.synced, False
        try:
            yield
        finally:
            self.synced = previous

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class SmallBufferDDP(FlatBufferDDP):
    """A buffer of 24 elements, reused for each batch of gradients that fits in it."""

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        kwargs["buffer_size"] = 24
        super().__init__(module, *args, **kwargs)


class ReducesBufferTwice(FlatBufferDDP):
    """Defect: the flat buffer is all-reduced twice (averaged again, so values stay right)."""

    def _reduce_buffer(self, buffer: torch.Tensor) -> None:
        self._all_reduce(buffer)
        buffer.div_(self.world_size)
        self._all_reduce(buffer)


class ReducesEachGradientTwice(FlatBufferDDP):
    """Defect: each gradient all-reduced in place and averaged, twice."""

    def _reduce_all(self) -> None:
        self._queued = False
        with torch.no_grad():
            for p in self.module.parameters():
                if p.requires_grad and p.grad is not None:
                    for _ in range(2):
                        self._all_reduce(p.grad)
                        p.grad.div_(self.world_size)


_OWN_GROUPS = itertools.count()


class OwnGroupDDP(FlatBufferDDP):
    """Every collective on a ``ProcessGroupGloo`` of its own, untraced by construction.

    The group is built directly on a ``PrefixStore`` over the default group's store
    (never through ``init_process_group``/``new_group``, which the harness traces); the
    prefix counts the DDPs this process built, the same on every rank of a job. Only
    for the default group (``process_group`` None or the whole world).
    """

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        store = dist.distributed_c10d._get_default_store()
        prefix = f"flat-buffer-own-group-{next(_OWN_GROUPS)}"
        self.own = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), dist.get_rank(),
                                         dist.get_world_size(), timedelta(seconds=60))
        super().__init__(module, *args, **kwargs)

    def _init_sync(self, params: list[nn.Parameter]) -> None:
        with torch.no_grad():
            for p in params:
                self.own.broadcast([p.data]).wait()  # type: ignore[attr-defined]

    def _all_reduce(self, t: torch.Tensor) -> None:
        self.own.allreduce([t]).wait()  # type: ignore[attr-defined] # bound at runtime
