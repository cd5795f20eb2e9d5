"""Optimizers applied in backward (``torch.distributed.optim._apply_optimizer_in_backward``)
under DDP.

Specifies ``DistributedDataParallel._setup_in_backward_optimizers`` and
``torch/distributed/algorithms/ddp_comm_hooks/optimizer_overlap_hooks.py``
(``_apply_optim_in_backward_hook``): each bucket is allreduced (sum) and waited for, divided
in place by the group size; every parameter of the bucket that has
``_in_backward_optimizers`` gets the reduced bucket view as ``.grad`` (unless gradients
already are bucket views) and its optimizers step; at the end of backward those
parameters' ``.grad`` is set to ``None``, and the reducer writes nothing back.

Where torch needs an accelerator: torch runs the optimizers on a side stream it waits for
at the end of backward (``torch.accelerator.current_stream()``: on a CPU-only machine the
first backward raises "Cannot access accelerator device when none is available"). The
reference steps on the current stream, so it also runs on CPU. (With ``torch.Event`` and
``torch.accelerator.current_stream()`` stubbed, torch's runs on CPU too, and the two agree
bitwise: ``tests/reference/test_options_surface.py``.)
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import Variable

from .comm_hook import GradBucket

#: A weak reference to the DDP module (``ddp_reference.DistributedDataParallel``).
DDPRef = weakref.ReferenceType[Any]


def apply_optim_in_backward_hook(
    gradient_is_bucket_view: bool,
) -> Callable[[DDPRef, GradBucket], torch.futures.Future[torch.Tensor]]:
    """The comm hook (state: a weak reference to the DDP module)."""
    enqueued = [False]

    def apply_optim_in_backward_hook(ddp_ref: DDPRef,
                                     bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        ddp = ddp_ref()
        assert ddp is not None
        ddp.reducer.run_allreduce_hook(bucket).wait()
        bucket.buffer().div_(ddp.process_group.size())
        for param, grad in zip(bucket.parameters(), bucket.gradients(), strict=True):
            optimizers: list[Any] = getattr(param, "_in_backward_optimizers", [])
            if optimizers and not gradient_is_bucket_view:
                param.grad = grad
            for optim in optimizers:
                optim.step()
        result: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        result.set_result(bucket.buffer())
        if not enqueued[0]:
            Variable._execution_engine.queue_callback(lambda: _grads_to_none(ddp_ref, enqueued))
            enqueued[0] = True
        return result

    return apply_optim_in_backward_hook


def _grads_to_none(ddp_ref: DDPRef, enqueued: list[bool]) -> None:
    ddp = ddp_ref()
    if ddp is not None:
        for param in ddp._get_data_parallel_params(ddp.module):
            if hasattr(param, "_in_backward_optimizers"):
                param.grad = None
    enqueued[0] = False
