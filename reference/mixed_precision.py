"""DDP-native mixed precision (torch's ``mixed_precision=_MixedPrecision(...)``).

Specifies ``torch/nn/parallel/distributed.py`` (``_setup_mixed_precision_params``,
``_cast_buffers``, ``_root_copy_hook``, ``_module_wait_for_copy_hook``) and
``torch/distributed/algorithms/ddp_comm_hooks/mixed_precision_hooks.py``
(``_reducer_allreduce_and_upcast_hook``):

* at construction every parameter not marked ``_ddp_ignored`` gets a storage-less
  ``param_dtype`` twin ``_mp_param`` (and ``_fp_param``, its full-precision data), floating
  buffers are cast to ``buffer_dtype``, and the buckets hold ``param_dtype`` gradients;
* a forward pre-hook on the wrapped module (so it also runs for ``ddp.module(x)``) copies
  each parameter into its twin, swaps ``param.data`` to it, casts an existing ``.grad`` to
  ``param_dtype``, and hooks the low-precision gradient accumulator to the reducer;
* the comm hook casts the bucket to ``reduce_dtype`` (no-op when ``None``), allreduces the
  sum, divides by the group size in that dtype, and swaps parameters and gradients back to
  full precision; the reducer then copies the reduced bucket into the full-precision
  ``.grad`` (a cast);
* at the end of backward the accumulator hooks are removed and parameters that do not
  require grad are swapped back too.

A torch defect not kept: torch's ``set_mixed_precision_param_dtype`` replaces each bucket's
``gradients`` by a ``param_dtype`` copy but keeps the views gradients are copied into
(views of the old buffer), so until its bucket rebuild (after the first iteration; never
with ``find_unused_parameters=True``) it reduces uninitialised memory. The reference's
views follow the new buffer; after torch's rebuild both agree bitwise.

Where torch needs CUDA: torch runs the copies on a side stream and synchronises with
``torch.Event``; on CPU its first forward raises "cpu backend doesn't support events".
The reference does the same work synchronously on the current thread, so it runs on CPU
as well (and on CUDA it is stream-ordered on the current stream).
"""
from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.autograd import Variable
from torch.distributed.utils import _alloc_storage, _free_storage

from .comm_hook import GradBucket

if TYPE_CHECKING:
    from .ddp import DistributedDataParallel


def _ignored(t: torch.Tensor) -> bool:
    return bool(getattr(t, "_ddp_ignored", False))


def _twin(param: torch.Tensor) -> torch.Tensor:
    twin: torch.Tensor = getattr(param, "_mp_param")  # noqa: B009 - set dynamically
    return twin


def _full(param: torch.Tensor) -> torch.Tensor:
    full: torch.Tensor = getattr(param, "_fp_param")  # noqa: B009 - set dynamically
    return full


def setup_params(param_dtype: torch.dtype | None, root: nn.Module) -> None:
    """Storage-less low-precision twins (``_mp_param``) and the full-precision data
    (``_fp_param``) of every parameter DDP does not ignore; kept if already there."""
    for param in root.parameters():
        if _ignored(param) or hasattr(param, "_mp_param"):
            continue
        twin = torch.zeros_like(param, dtype=param_dtype, requires_grad=param.requires_grad)
        _free_storage(twin)
        param._mp_param = twin  # type: ignore[attr-defined]
        param._fp_param = param.data  # type: ignore[attr-defined]


def cast_buffers(buffer_dtype: torch.dtype | None, root: nn.Module) -> None:
    """Every buffer DDP does not ignore, as ``buffer_dtype`` (``None`` keeps it)."""
    for buf in root.buffers():
        if not _ignored(buf):
            buf.data = buf.to(dtype=buffer_dtype)


def root_copy_hook(ddp_ref: weakref.ReferenceType[DistributedDataParallel],
                   module: nn.Module, *args: Any, **kwargs: Any) -> None:
    """Forward pre-hook of the wrapped module: parameters to low precision, and the
    reducer's hooks on their (new) gradient accumulators."""
    ddp = ddp_ref()
    if ddp is None or ddp.mixed_precision is None:
        return
    dtype = ddp.mixed_precision.param_dtype
    for submodule in ddp.module.modules():
        for param in submodule.parameters(recurse=False):
            if _ignored(param):
                continue
            twin = _twin(param)
            _alloc_storage(twin, param.size())
            with torch.no_grad():
                twin.copy_(param.data)
                if param.grad is not None:
                    param.grad.data = param.grad.to(dtype)
            param.data = twin
        for param in submodule.parameters(recurse=False):
            if not param.requires_grad or _ignored(param) or not hasattr(param, "_idx"):
                continue
            acc = param.expand_as(param).grad_fn.next_functions[0][0]  # type: ignore[union-attr]
            assert acc is not None
            handle = acc.register_hook(functools.partial(_fire_reducer_hook, ddp_ref, param._idx))
            param._ddp_mp_hook_state = (acc, handle)  # type: ignore[attr-defined]


def _fire_reducer_hook(ddp_ref: weakref.ReferenceType[DistributedDataParallel], index: int,
                       *unused: Any) -> None:
    ddp = ddp_ref()
    if ddp is not None:
        ddp.reducer.autograd_hook(index)


class AllreduceUpcastState:
    """State of :func:`allreduce_and_upcast_hook`: the DDP module, weakly."""

    def __init__(self, ddp: DistributedDataParallel) -> None:
        self.ddp_ref = weakref.ref(ddp)
        self.wait_enqueued = False


def allreduce_and_upcast_hook(state: AllreduceUpcastState,
                              bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Reduce in ``reduce_dtype``, divide by the group size, and return the parameters and
    their gradients to full precision (torch's ``_reducer_allreduce_and_upcast_hook``)."""
    ddp = state.ddp_ref()
    assert ddp is not None and ddp.mixed_precision is not None
    config = ddp.mixed_precision
    if config.param_dtype != config.reduce_dtype:
        bucket.set_buffer(bucket.buffer().to(config.reduce_dtype))
    ddp.reducer.run_allreduce_hook(bucket).wait()
    bucket.buffer().div_(ddp.process_group.size())
    result: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    result.set_result(bucket.buffer())
    for param in bucket.parameters():
        param.data = _full(param)
        _free_storage(_twin(param))
        assert param.grad is not None
        param.grad.data = param.grad.to(param.data.dtype)
    if not state.wait_enqueued:
        Variable._execution_engine.queue_callback(functools.partial(_end_of_backward, state))
        state.wait_enqueued = True
    return result


def _end_of_backward(state: AllreduceUpcastState) -> None:
    """Remove this iteration's accumulator hooks; parameters that do not require grad
    back to full precision."""
    ddp = state.ddp_ref()
    if ddp is not None:
        for _, param in ddp.module.named_parameters():
            if hasattr(param, "_ddp_mp_hook_state"):
                param._ddp_mp_hook_state[1].remove()
                delattr(param, "_ddp_mp_hook_state")
            if not param.requires_grad and not hasattr(param, "_ddp_ignored"):
                param.data = _full(param)
    state.wait_enqueued = False
