"""Candidates with one defect each, for the project's own tests of the harness.

Each is torch's DDP with one thing broken, the kind of mistake a custom DDP makes; the
harness must give each the right verdict with evidence naming the rank and the check.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import JoinHook
from torch.nn.parallel import DistributedDataParallel


def _sum_without_dividing(group, bucket):  # type: ignore[no-untyped-def] # torch checks annotations
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()  # type: ignore[union-attr]
    return fut.then(lambda f: f.value()[0])


class SumsWithoutDividing(DistributedDataParallel):
    """Reduces gradients with a sum and never divides by the world size."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__(module, *args, **kwargs)
        super().register_comm_hook(self.process_group, _sum_without_dividing)


class NeverBroadcastsBuffers(DistributedDataParallel):
    """Accepts ``broadcast_buffers`` and ignores it: buffers are never broadcast."""

    def __init__(self, module: torch.nn.Module, *args: Any, broadcast_buffers: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(module, *args, broadcast_buffers=False, **kwargs)


class _IdleJoinHook(JoinHook):
    """A join hook that shadows nothing: active ranks wait for the joined one forever."""


class JoinHookDoesNotShadow(DistributedDataParallel):
    """Its Join hook does not shadow the active ranks' collectives (a hang).

    Join's own bookkeeping runs on a separate group, as a framework with its own join
    group would, so the joined rank keeps answering Join while the active ranks wait in
    a gradient allreduce it never enters. (On one Gloo group the mismatched collectives
    abort the process instead: a CRASH.)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._join_group = dist.new_group(backend="gloo")

    @property
    def join_process_group(self) -> Any:
        return self._join_group

    def join_hook(self, **kwargs: Any) -> JoinHook:  # type: ignore[override]
        self._divide_by_initial_world_size = kwargs.get("divide_by_initial_world_size", True)
        return _IdleJoinHook()


class _FailsInRank1SecondForward(DistributedDataParallel):
    """Rank 1 calls :meth:`fail` in its second forward, in the middle of a step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._forwards = 0

    def fail(self) -> None:
        raise NotImplementedError

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        self._forwards += 1
        if dist.get_rank() == 1 and self._forwards == 2:
            self.fail()
        return super().forward(*inputs, **kwargs)


class ExitsMidStep(_FailsInRank1SecondForward):
    """Rank 1 calls ``os._exit(3)`` in its second forward, in the middle of a step."""

    def fail(self) -> None:
        os._exit(3)


class SegfaultsMidStep(_FailsInRank1SecondForward):
    """Rank 1 reads address 0 in its second forward: killed by SIGSEGV mid-step."""

    def fail(self) -> None:
        ctypes.string_at(0)


class RaisesOnRank1(_FailsInRank1SecondForward):
    """Rank 1 raises in its second forward while rank 0 goes on into the collectives."""

    def fail(self) -> None:
        raise RuntimeError("defective candidate: rank 1 gives up")


class SyncsInsideNoSync(DistributedDataParallel):
    """``no_sync`` does nothing: values stay right, but every microbatch is reduced."""

    def no_sync(self) -> Any:  # type: ignore[override]
        import contextlib

        return contextlib.nullcontext()


class NoSyncSwitchesSyncOn(DistributedDataParallel):
    """``no_sync`` switches synchronisation back on when it ends instead of restoring what
    was before it: right unless nested, where leaving the inner one syncs too early."""

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:  # type: ignore[override]
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = True


def _allreduce_in_float16(group, bucket):  # type: ignore[no-untyped-def] # torch checks annotations
    world = dist.get_world_size(group)
    half = bucket.buffer().div(world).half()
    fut = dist.all_reduce(half, group=group, async_op=True).get_future()  # type: ignore[union-attr]
    return fut.then(lambda f: f.value()[0].float())


class ReducesInFloat16(DistributedDataParallel):
    """Silently reduces float32 gradients in float16 (precision lost)."""

    def __init__(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__(module, *args, **kwargs)
        super().register_comm_hook(self.process_group, _allreduce_in_float16)


class UsesWorldGroup(DistributedDataParallel):
    """Ignores the process group it is given and synchronises over the whole world."""

    def __init__(self, module: torch.nn.Module, *args: Any, process_group: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(module, *args, process_group=None, **kwargs)


class AcceptsSecondCommHook(DistributedDataParallel):
    """A second ``register_comm_hook`` is silently ignored instead of raising."""

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        if getattr(self, "_hooked", False):
            return
        self._hooked = True
        super().register_comm_hook(state, hook)


class SetsStaticGraphLate(DistributedDataParallel):
    """Accepts ``static_graph`` but builds its reducer without it and sets it afterwards
    (``_set_static_graph()``): the values are right, but with ``find_unused_parameters``
    the first iteration is reduced in ``bucket_cap_mb`` buckets instead of torch's one
    bucket per dtype (the reference DDP's defect before it passed ``static_graph`` on)."""

    def __init__(self, module: torch.nn.Module, *args: Any, static_graph: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(module, *args, **kwargs)
        if static_graph:
            self._set_static_graph()
