"""Historical defects of torch's DDP, each re-introduced on torch 2.13's own DDP (or on the
reference DDP) with torch's fix undone: one class per bug of
``ddp_conformance/catalog/history.py``, its docstring naming the bug. Kept apart from the
zoo (``tests/mutants/__init__.py``): ``tests/test_bug_history.py`` runs each against the
scenarios that guard its bug only.
"""
from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.parallel.distributed as ddp_module
from ddp_reference.reducer import Reducer
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.nn.parallel.distributed import _DDPSink
from torch.utils._pytree import tree_flatten, tree_unflatten

from ._base import MutantDDP


class _Bucket:
    """A ``dist.GradBucket`` seen through a proxy that may answer one question wrong."""

    def __init__(self, bucket: Any) -> None:
        self._bucket = bucket

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bucket, name)


class _IsLastIsFirst(_Bucket):
    def is_last(self) -> bool:
        return bool(self._bucket.index() == 0)


class IsLastIsFirst(TorchDDP):
    """pytorch/pytorch#63210 (fixed by #63768, torch 1.10): ``GradBucket.is_last()`` answered
    whether the bucket was the *first* to be reduced (``index() == 0``), so a hook that ends
    its iteration on the last bucket (PowerSGD's iteration count) miscounted whenever there
    were several buckets."""

    def register_comm_hook(self, state: object, hook: Any) -> None:
        def wrong_is_last(state, bucket):  # type: ignore[no-untyped-def]
            return hook(state, _IsLastIsFirst(bucket))

        super().register_comm_hook(state, wrong_is_last)


class BuffersKeptFromConstruction(TorchDDP):
    """pytorch/pytorch#63916 (fixed by #64472, torch 1.10): DDP listed the module's buffers
    once, at construction, and broadcast that list before every forward; a module that
    reassigns a buffer (``self.mean = ...``) then had its new tensors left rank-local while
    DDP broadcast the stale ones."""

    def _assign_modules_buffers(self) -> None:
        if not hasattr(self, "modules_buffers"):
            super()._assign_modules_buffers()


class JoinShadowsWithoutHook(TorchDDP):
    """pytorch/pytorch#60611 (fixed by #61020, torch 1.10): a joined rank shadowed the
    backward with a plain allreduce of each zero bucket instead of running the registered
    comm hook on it, so under a hook that reduces otherwise (float16 compression,
    PowerSGD's two allreduces) the joined rank's collectives no longer matched."""

    def _match_all_reduce_for_bwd_pass(self) -> None:
        works = [dist.all_reduce(bucket.buffer(), group=self.process_group, async_op=True)
                 for bucket in self.reducer._get_zeros_like_grad_buckets()]
        for work in works:
            work.wait()


class JoinIgnoresNoSync(TorchDDP):
    """pytorch/pytorch#44425 (fixed in torch 1.7): the ranks did not agree whether the
    backward synchronises; a joined rank always shadowed the gradient allreduces, while an
    active rank inside ``no_sync()`` issued none, so their collectives paired wrongly."""

    def _check_global_requires_backward_grad_sync(self, is_joined_rank: bool) -> Any:
        return True if is_joined_rank else None


def _fp16_sum_then_divide(process_group, bucket):  # type: ignore[no-untyped-def]
    """torch's fp16 hook before the fix (unannotated: torch refuses a ``bucket``
    annotation that is not ``dist.GradBucket`` itself)."""
    group = process_group if process_group is not None else dist.group.WORLD
    world_size = group.size()
    compressed = bucket.buffer().to(torch.float16)
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut: Any) -> torch.Tensor:
        buffer = bucket.buffer()
        buffer.copy_(fut.value()[0].div_(world_size))
        return buffer

    return future.then(decompress)


class Fp16CompressDividesAfterSum(TorchDDP):
    """pytorch/pytorch#57410 (torch 1.9; C++ and the other hooks: #59576, torch 1.10):
    ``fp16_compress_hook`` summed the float16 buckets and divided by the world size
    afterwards, so a sum above 65504 overflowed to inf where the mean is in range."""

    def register_comm_hook(self, state: object, hook: Any) -> None:
        if hook is default_hooks.fp16_compress_hook:
            hook = _fp16_sum_then_divide
        super().register_comm_hook(state, hook)


class OutputsWithoutHistoryThroughSink(TorchDDP):
    """pytorch/pytorch#60733 (fixed by #60882, torch 1.10; introduced by #57081): under
    ``find_unused_parameters`` every output tensor went through ``_DDPSink``, so an output
    made outside autograd came back with a ``grad_fn``: fed into the next forward
    (Transformer-XL's memory), its backward ran into the previous iteration's graph."""

    def _post_forward(self, output: Any) -> Any:
        output = super()._post_forward(output)
        if not (self.find_unused_parameters and not self.static_graph
                and torch.is_grad_enabled()):
            return output
        flat, spec = tree_flatten(output)
        tensors = [i for i, t in enumerate(flat) if torch.is_tensor(t)]
        passed = _DDPSink.apply(weakref.ref(self), *[flat[i] for i in tensors])
        for i, through in zip(tensors, passed, strict=True):
            if flat[i].grad_fn is None and not flat[i].requires_grad:
                flat[i] = through
        return tree_unflatten(flat, spec)


class _UseInsideNoSyncForgotten(Reducer):
    def autograd_hook(self, index: int) -> None:
        used = self.local_used[index]
        super().autograd_hook(index)
        if not self.expect_autograd_hooks:
            self.local_used[index] = used


class NoSyncUseForgotten(MutantDDP):
    """pytorch/pytorch#69031 (fixed by #124193, torch 2.4; introduced by #54981): under
    ``find_unused_parameters`` the reducer recorded a parameter as locally used only in
    backwards that synchronise, so a parameter used on microbatches inside ``no_sync()``
    but not in the synced one counted as unused everywhere and its gradient stayed
    rank-local."""

    reducer_class = _UseInsideNoSyncForgotten


class _UnusedGradsZeroed(Reducer):
    def _globally_unused(self, index: int) -> bool:
        return False


class UnusedGradsZeroed(MutantDDP):
    """pytorch/pytorch#28294 (fixed by #28883, torch 1.4): a parameter no rank used got a
    zero gradient from the reduction instead of keeping ``None``, so an optimizer could not
    tell it apart from a parameter whose gradient is zero (momentum and weight decay moved
    it)."""

    reducer_class = _UnusedGradsZeroed


class HookSeesPredividedBuckets(TorchDDP):
    """pytorch/pytorch#42400 (torch 1.7): the reducer divided every bucket by the world
    size before handing it to the comm hook, so a hook that averages (``allreduce_hook``
    divides itself) produced gradients divided twice."""

    def register_comm_hook(self, state: object, hook: Any) -> None:
        world_size = self.process_group.size()

        def predivided(state, bucket):  # type: ignore[no-untyped-def]
            bucket.buffer().div_(world_size)
            return hook(state, bucket)

        super().register_comm_hook(state, predivided)


class _ViewsRepointedAtHookResult(Reducer):
    def finalize_backward(self) -> None:
        super().finalize_backward()
        for bucket in self.buckets:
            if not bucket.expect_sparse and bucket.views_out is not bucket.views_in:
                bucket.views_in = bucket.views_out


class HookResultTakesBucketViews(MutantDDP):
    """pytorch/pytorch#43307 (torch 1.7): when a comm hook's future returned a new tensor,
    the reducer re-pointed the bucket's views at it, so from the next iteration on the
    gradients were copied into that tensor while the hook went on reading the bucket's own
    buffer, stale since the first iteration."""

    reducer_class = _ViewsRepointedAtHookResult


def _tensors_in_sequences(obj: Any) -> Any:
    """torch's ``_find_tensors`` before dicts were searched: tensors and lists/tuples only."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors_in_sequences(item)]
    return []


class DictOutputsNotSearched(TorchDDP):
    """pytorch/pytorch#19354 (torch 1.1): under ``find_unused_parameters`` DDP looked for
    the output tensors in lists and tuples only, so a forward returning a dict gave it no
    tensor to traverse from: every parameter looked unused and was marked ready before its
    gradient arrived."""

    def _post_forward(self, output: Any) -> Any:
        original = ddp_module._find_tensors
        ddp_module._find_tensors = _tensors_in_sequences
        try:
            return super()._post_forward(output)
        finally:
            ddp_module._find_tensors = original


class StateNotReturned(TorchDDP):
    """pytorch/pytorch#3023 (torch 0.3): ``DistributedDataParallel.__getstate__`` built the
    state to pickle and returned nothing, so a pickled or deep-copied wrapper came back
    without its attributes."""

    def __getstate__(self) -> Any:
        super().__getstate__()
        return None


class GlobalRankInSubgroup(TorchDDP):
    """pytorch/pytorch#53793 (torch 1.9): DDP asked for its rank with ``dist.get_rank()``,
    the global rank, where it needed its rank in its own process group, so on a subgroup
    Join chose the rank to take buffers from by a number that is not a group rank."""

    @property
    def _distributed_rank(self) -> int:
        return dist.get_rank()


class ParameterCountNotChecked(TorchDDP):
    """pytorch/pytorch#73547 (fixed by #74113, torch 1.12): the constructor's check that
    every rank wraps the same model compared parameter shapes but not how many parameters
    each rank has, so a rank with an extra layer went on to the broadcasts and failed or
    hung there instead of refusing the model."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original = ddp_module._verify_param_shape_across_processes
        ddp_module._verify_param_shape_across_processes = _no_check
        try:
            super().__init__(*args, **kwargs)
        finally:
            ddp_module._verify_param_shape_across_processes = original


def _no_check(*args: Any, **kwargs: Any) -> None:
    """The verification a DDP without the count check passes for this model."""


class BuiltinFp16KeptFloat32(TorchDDP):
    """pytorch/pytorch#63375 (torch 1.10): the C++ FP16_COMPRESS hook copied the float16
    cast back into the float32 bucket before reducing it, so it allreduced float32: no
    compression at all."""

    def _register_builtin_comm_hook(self, comm_hook_type: Any) -> None:
        if comm_hook_type == dist.BuiltinCommHookType.FP16_COMPRESS:
            comm_hook_type = dist.BuiltinCommHookType.ALLREDUCE
        super()._register_builtin_comm_hook(comm_hook_type)


class _UnusedLeftOutOfRebuild(Reducer):
    def _finalize_callback(self) -> None:
        self.finalize_backward()


class StaticGraphRebuildWithoutUnused(MutantDDP):
    """pytorch/pytorch#58097 (torch 1.9): under ``static_graph`` the bucket rebuild listed
    only the parameters whose gradients arrived, leaving out those the static graph had
    found unused, so the rebuilt layout did not cover every parameter."""

    reducer_class = _UnusedLeftOutOfRebuild


class _NoPassThrough(torch.autograd.Function):
    """Hands the outputs back untouched (no pass-through node in the graph)."""

    @staticmethod
    def apply(ddp_ref: Any, *tensors: Any) -> Any:  # type: ignore[override]
        return tensors


class OutputsNotPassedThrough(TorchDDP):
    """pytorch/pytorch#61753 (torch 1.10, reland of #57081): before it, under
    ``find_unused_parameters`` DDP handed the outputs back as they were, without its
    pass-through node, so the parameters of an output left out of the loss, found used by
    the graph traversal, never got their hooks fired and the next iteration raised."""

    def _post_forward(self, output: Any) -> Any:
        original = ddp_module._DDPSink
        ddp_module._DDPSink = _NoPassThrough  # type: ignore[misc]
        try:
            return super()._post_forward(output)
        finally:
            ddp_module._DDPSink = original  # type: ignore[misc]
