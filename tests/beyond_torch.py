"""Test DDPs for torch's limits and the procedures real DDPs get wrong (issue 27).

:class:`ReducesAfterBackward` goes on where torch's reducer refuses: it all-reduces every
gradient once backward has finished, so a parameter unused on every rank is no problem
for it. It is right wherever the ranks agree on which gradients exist, and wrong where
they do not (a rank keeps ``None`` where the others reduced a gradient).

:class:`NoSyncLeftOffAfterError` is torch's DDP with fairseq's ``no_sync``: it restores
synchronisation after the ``yield`` without a ``finally``, so an exception raised inside
``no_sync`` leaves synchronisation off for the rest of training.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel


class ReducesAfterBackward(nn.Module):
    """A DDP whose reduction runs at the end of backward, over every parameter.

    At construction it broadcasts parameters and buffers from the group's first rank;
    before every forward it broadcasts buffers (``broadcast_buffers``); after a backward
    that produced a gradient on this rank it all-reduces, in registration order, every
    parameter that requires one (zeros where this rank has none), each divided by the
    group's size first, as torch's default reduction does; a parameter without a local
    gradient keeps ``None`` (all ranks agreeing, none of them has one). It accepts
    ``find_unused_parameters`` and ``static_graph`` and needs neither: it waits for no
    gradient. The end of backward is a callback queued on autograd's engine by the first
    gradient accumulated in it.
    """

    def __init__(self, module: nn.Module, process_group: Any = None,
                 broadcast_buffers: bool = True, find_unused_parameters: bool = False,
                 static_graph: bool = False) -> None:
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.broadcast_buffers = broadcast_buffers
        self._queued = False
        self._source = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor, src=self._source, group=process_group)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._gradient_ready)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers:
            with torch.no_grad():
                for b in self.module.buffers():
                    dist.broadcast(b, src=self._source, group=self.process_group)
        return self.module(*inputs, **kwargs)

    def _gradient_ready(self, _: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            Variable._execution_engine.queue_callback(self._reduce)

    def _reduced(self) -> list[nn.Parameter]:
        """The parameters reduced after each backward, in order: every one that requires
        a gradient."""
        return [p for p in self.module.parameters() if p.requires_grad]

    def _reduce(self) -> None:
        self._queued = False
        size = dist.get_world_size(self.process_group)
        for p in self._reduced():
            local = p.grad
            summed = torch.zeros_like(p) if local is None else local.div(size)
            dist.all_reduce(summed, group=self.process_group)
            if local is not None:
                p.grad = summed


class AgreesOnUnused(ReducesAfterBackward):
    """:class:`ReducesAfterBackward` that first agrees with the other ranks on which
    parameters got a gradient anywhere (an all-reduce of a used mask, as torch's
    ``find_unused_parameters`` does): a parameter used on some rank gets the average,
    zeros from the ranks that did not use it, on every rank; one unused everywhere keeps
    ``None``. Right even where ranks use different parameters (experts)."""

    def _reduce(self) -> None:
        self._queued = False
        size = dist.get_world_size(self.process_group)
        params = self._reduced()
        used = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
        dist.all_reduce(used, group=self.process_group)
        for p, anywhere in zip(params, used.tolist(), strict=True):
            if not anywhere:
                continue
            summed = torch.zeros_like(p) if p.grad is None else p.grad.div(size)
            dist.all_reduce(summed, group=self.process_group)
            p.grad = summed


class ReducesFloat32Only(ReducesAfterBackward):
    """:class:`ReducesAfterBackward` that reduces float32 gradients only (a DDP whose list
    of bucket types lacks bfloat16 and float16): the others stay local."""

    def _reduced(self) -> list[nn.Parameter]:
        return [p for p in super()._reduced() if p.dtype == torch.float32]


class RaisesOnSecondBackward(ReducesAfterBackward):
    """:class:`ReducesAfterBackward` that refuses a second backward of one forward (a
    reducer that marks each gradient ready once per forward)."""

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        self._backwards = 0
        return super().forward(*inputs, **kwargs)

    def _reduce(self) -> None:
        self._backwards += 1
        if self._backwards > 1:
            self._queued = False
            raise RuntimeError("defective candidate: gradients already reduced in this "
                               "iteration")
        super()._reduce()


def swallows_find_unused(module: nn.Module, **kwargs: Any) -> nn.Module:
    """torch's DDP behind a factory that takes every option through ``**kwargs`` and
    drops ``find_unused_parameters``."""
    kwargs.pop("find_unused_parameters", None)
    return DistributedDataParallel(module, **kwargs)


class NoSyncLeftOffAfterError(DistributedDataParallel):
    """torch's DDP whose ``no_sync`` restores synchronisation only when its body
    succeeds (fairseq's legacy DDP): after an exception inside it, every later backward
    stays local."""

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:  # type: ignore[override]
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        yield
        self.require_backward_grad_sync = old


class ViewsEveryGradient(ReducesAfterBackward):
    """:class:`ReducesAfterBackward` whose end-of-backward hook reads every parameter's
    ``.grad.view(-1)``: where a parameter got no gradient it raises Python's
    ``AttributeError: 'NoneType' object has no attribute 'view'`` on every rank, a bug of
    its own hook, not a refusal of the scenario's misuse."""

    def _reduce(self) -> None:
        self._queued = False
        flat = [p.grad.view(-1) for p in self._reduced()]  # type: ignore[union-attr]
        size = dist.get_world_size(self.process_group)
        for g in flat:
            g.div_(size)
            dist.all_reduce(g, group=self.process_group)
