"""Defective DDPs with one planted defect each, and the cause code the diagnosis must name.

Some subclass torch's DDP (a comm hook or one method changed), some are written from
scratch on ``torch.distributed`` (:class:`ScratchDDP`: a flat allreduce queued at the end
of backward, as torch's reducer does). :data:`PLANTED` pairs each with its code and the
few scenarios enough to show it; ``tests/test_diagnosed.py`` checks the first finding of
each, and ``benchmarks/diagnosis_table.py`` runs each over the whole catalog for the table
of ``docs/diagnosis.md``. The correct ones (:data:`CORRECT`) must get no finding.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.nn.parallel import DistributedDataParallel
from torch.nn.parameter import is_lazy

# --- comm hooks (torch checks a hook's annotations: none here) ------------------------------


def _reduce(group, buffer, divide=True):  # type: ignore[no-untyped-def]
    world = dist.get_world_size(group)
    tensor = buffer.div(world) if divide else buffer
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()  # type: ignore[union-attr]
    return fut.then(lambda f: f.value()[0])


def _passthrough(group, bucket):  # type: ignore[no-untyped-def]
    return _reduce(group, bucket.buffer())


def _divide_twice(group, bucket):  # type: ignore[no-untyped-def]
    return _reduce(group, bucket.buffer().div_(dist.get_world_size(group)))


def _scale_09(group, bucket):  # type: ignore[no-untyped-def]
    return _reduce(group, bucket.buffer().mul_(0.9))


def _permute_on_odd_ranks(group, bucket):  # type: ignore[no-untyped-def]
    buffer = bucket.buffer()
    if dist.get_rank(group) % 2:
        buffer.copy_(buffer.flip(0))
    return _reduce(group, buffer)


def _reduce_twice(group, bucket):  # type: ignore[no-untyped-def]
    world = dist.get_world_size(group)
    buffer = bucket.buffer().div_(world)
    dist.all_reduce(buffer, group=group)
    buffer.div_(world)
    return _reduce(group, buffer, divide=False)


def _keep_last_bucket(group, bucket):  # type: ignore[no-untyped-def]
    if bucket.is_last():
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    return _reduce(group, bucket.buffer())


class _Stale:
    """Hook state: each parameter's reduced gradient of the previous step (zeros at the
    first), kept per parameter: torch rebuilds its buckets after the first step."""

    def __init__(self, group: Any, local_first: bool = False) -> None:
        self.group = group
        self.local_first = local_first
        self.last: dict[int, torch.Tensor] = {}


def _one_step_late(state, bucket):  # type: ignore[no-untyped-def]
    local = bucket.buffer().clone()
    reduced = bucket.buffer().div(dist.get_world_size(state.group))
    dist.all_reduce(reduced, group=state.group)
    parts, offset = [], 0
    for p in bucket.parameters():
        n = p.numel()
        first = local[offset:offset + n] if state.local_first else torch.zeros(n, dtype=reduced.dtype)
        parts.append(state.last.get(id(p), first))
        state.last[id(p)] = reduced[offset:offset + n].clone()
        offset += n
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(torch.cat(parts))
    return fut


def _mismatched_on_rank1(group, bucket):  # type: ignore[no-untyped-def]
    buffer = bucket.buffer()
    tensor = buffer[:-1] if dist.get_rank(group) == 1 and buffer.numel() > 1 else buffer
    dist.all_reduce(tensor, group=group)
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(buffer.div_(dist.get_world_size(group)))
    return fut


class _Calls:
    """Hook state: the group and how many times the hook ran on this rank."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.calls = 0


def _stop_on_rank1(state, bucket):  # type: ignore[no-untyped-def]
    state.calls += 1
    if dist.get_rank(state.group) == 1 and state.calls >= 4:
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    return _reduce(state.group, bucket.buffer())


class _HookedDDP(DistributedDataParallel):
    """torch's DDP with :attr:`HOOK` registered on its own group at construction."""

    HOOK: Any = None

    def __init__(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__(module, *args, **kwargs)
        super().register_comm_hook(self._hook_state(), type(self).HOOK)

    def _hook_state(self) -> Any:
        return self.process_group


# --- torch's DDP with one defect ------------------------------------------------------------


class DividesTwice(_HookedDDP):
    """Divides the local gradients by the world size before the averaging allreduce too."""

    HOOK = _divide_twice


class ScalesGradients(_HookedDDP):
    """Multiplies every gradient by 0.9 before averaging (a stray loss scale)."""

    HOOK = _scale_09


class PermutesBucketOnOddRanks(_HookedDDP):
    """Odd ranks reverse their bucket's elements before the allreduce (a bucket laid out
    in another order on some ranks)."""

    HOOK = _permute_on_odd_ranks


class ReducesEachBucketTwice(_HookedDDP):
    """Allreduces every bucket twice (the values come out right, the wire does not)."""

    HOOK = _reduce_twice


class KeepsLastBucketLocal(_HookedDDP):
    """Never reduces its last bucket: those gradients stay local."""

    HOOK = _keep_last_bucket


class OneStepLate(_HookedDDP):
    """Hands back each bucket's previous result: every gradient is one step stale."""

    HOOK = _one_step_late

    def _hook_state(self) -> Any:
        return _Stale(self.process_group)


class OneStepLateLocalFirst(_HookedDDP):
    """Hands back each bucket's previous result, and at the first step the local
    gradients: every gradient one step stale, the first never reduced."""

    HOOK = _one_step_late

    def _hook_state(self) -> Any:
        return _Stale(self.process_group, local_first=True)


class MismatchedBucketOnRank1(_HookedDDP):
    """Rank 1 allreduces its bucket less one element: the backend aborts the process."""

    HOOK = _mismatched_on_rank1


class StopsReducingOnRank1(_HookedDDP):
    """Rank 1 stops reducing from its fourth bucket on and goes on; rank 0 waits in an
    allreduce rank 1 never issues."""

    HOOK = _stop_on_rank1

    def _hook_state(self) -> Any:
        return _Calls(self.process_group)


class PassThroughHook(DistributedDataParallel):
    """Correct: a comm hook that averages exactly as torch's default reduction does,
    registered at the first forward unless the user registered one of their own (torch
    takes one hook only)."""

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        self._user_hook = True
        super().register_comm_hook(state, hook)

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_user_hook", False) and not getattr(self, "_hooked", False):
            self._hooked = True
            super().register_comm_hook(self.process_group, _passthrough)
        return super().forward(*inputs, **kwargs)


class BroadcastsBuffersFromLastRank(DistributedDataParallel):
    """Broadcasts buffers before each forward from the last rank instead of rank 0."""

    def _sync_module_buffers(self, authoritative_rank: int) -> None:
        super()._sync_module_buffers(dist.get_world_size(self.process_group) - 1)


class JoinDividesByActive(DistributedDataParallel):
    """Under Join, inverts ``divide_by_initial_world_size``."""

    def join_hook(self, **kwargs: Any) -> Any:
        kwargs["divide_by_initial_world_size"] = not kwargs.get("divide_by_initial_world_size",
                                                                True)
        return super().join_hook(**kwargs)


class SkipsJoinFinalSync(DistributedDataParallel):
    """Under Join, never syncs the final model from the last joiner."""

    def _sync_final_model(self, is_last_joiner: bool) -> None:
        pass


class HangsOnRank1(DistributedDataParallel):
    """Rank 1 sleeps forever in its second forward (stuck outside any collective)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._forwards = 0

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        self._forwards += 1
        while dist.get_rank() == 1 and self._forwards == 2:
            time.sleep(0.05)
        return super().forward(*inputs, **kwargs)


class TinyBuckets(DistributedDataParallel):
    """Correct: torch's DDP with a 1 KiB bucket cap whatever it is given."""

    def __init__(self, module: nn.Module, *args: Any, bucket_cap_mb: Any = None,
                 **kwargs: Any) -> None:
        super().__init__(module, *args, bucket_cap_mb=1 / 1024, **kwargs)


class BucketViews(DistributedDataParallel):
    """Correct: torch's DDP with ``gradient_as_bucket_view`` always on."""

    def __init__(self, module: nn.Module, *args: Any, gradient_as_bucket_view: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(module, *args, gradient_as_bucket_view=True, **kwargs)


# --- written from scratch -------------------------------------------------------------------


class ScratchDDP(nn.Module):
    """A small DDP written from scratch: rank 0's parameters and buffers broadcast at
    construction and buffers before every forward; after backward (a callback queued on
    the autograd engine), one flat allreduce of every gradient divided by the world size,
    with a used-flag per parameter so that a gradient used on no rank stays None."""

    def __init__(self, module: nn.Module, process_group: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self.module = module
        self.process_group = process_group
        self._queued = False
        self.attach()

    def attach(self) -> None:
        """Rank 0's parameters and buffers on every rank; the gradient hooks."""
        self.init_sync()
        for p in self.module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._on_grad)

    def init_sync(self) -> None:
        for t in [*self.module.parameters(), *self.module.buffers()]:
            dist.broadcast(t.data, self.source(), group=self.process_group)

    def source(self) -> int:
        """The global rank buffers come from: the group's first."""
        return dist.get_global_rank(self.process_group, 0) if self.process_group else 0

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        for b in self.module.buffers():
            dist.broadcast(b.data, self.source(), group=self.process_group)
        return self.module(*inputs, **kwargs)

    def _on_grad(self, _: torch.Tensor) -> None:
        if not self._queued:
            self._queued = True
            Variable._execution_engine.queue_callback(self._reduce)

    def _reduce(self) -> None:
        self._queued = False
        params = [p for p in self.module.parameters() if p.requires_grad]
        used = torch.tensor([int(p.grad is not None) for p in params], dtype=torch.int32)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        dist.all_reduce(used, group=self.process_group)
        dist.all_reduce(flat, group=self.process_group)
        world = dist.get_world_size(self.process_group)
        offset = 0
        for p, count in zip(params, used.tolist(), strict=True):
            n = p.numel()
            self.write(p, flat[offset:offset + n].view_as(p) / world, count > 0)
            offset += n

    def write(self, p: nn.Parameter, reduced: torch.Tensor, used_somewhere: bool) -> None:
        """Give ``p`` its reduced gradient where some rank used it."""
        if used_somewhere:
            p.grad = reduced.clone()


class ScratchNoInitSync(ScratchDDP):
    """Never broadcasts rank 0's parameters and buffers at construction."""

    def init_sync(self) -> None:
        pass


class ScratchUnusedGetsZeros(ScratchDDP):
    """Gives a parameter unused on every rank a zero gradient instead of leaving it None."""

    def write(self, p: nn.Parameter, reduced: torch.Tensor, used_somewhere: bool) -> None:
        p.grad = reduced.clone()


class ScratchUnusedLocallyStaysNone(ScratchDDP):
    """Leaves a parameter unused on this rank without the gradient the others reduced."""

    def write(self, p: nn.Parameter, reduced: torch.Tensor, used_somewhere: bool) -> None:
        if p.grad is not None:
            p.grad = reduced.clone()


class ScratchAcceptsLazy(ScratchDDP):
    """Accepts a module with uninitialized (lazy) parameters where DDP's constructor
    refuses it: its broadcast and gradient hooks wait for the first forward, which
    initializes them (a pre-hook after the lazy modules' own)."""

    def attach(self) -> None:
        if not any(is_lazy(p) for p in self.module.parameters()):
            super().attach()
            return

        def at_first_forward(*_: Any) -> None:
            handle.remove()
            ScratchDDP.attach(self)

        handle = self.module.register_forward_pre_hook(at_first_forward)


class ScratchAveragesParameters(ScratchDDP):
    """Averages the parameters before each forward instead of the gradients: every
    gradient stays this rank's local one."""

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        world = dist.get_world_size(self.process_group)
        with torch.no_grad():
            for p in self.module.parameters():
                dist.all_reduce(p.data, group=self.process_group)
                p.data.div_(world)
        return super().forward(*inputs, **kwargs)

    def _on_grad(self, _: torch.Tensor) -> None:
        pass


class ScratchNoSync(ScratchDDP):
    """A ScratchDDP with ``no_sync``, correct."""

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        previous, self._skip = getattr(self, "_skip", False), True
        try:
            yield
        finally:
            self._skip = previous

    def _on_grad(self, g: torch.Tensor) -> None:
        if not getattr(self, "_skip", False):
            super()._on_grad(g)


class ScratchNoSyncIgnored(ScratchNoSync):
    """Its ``no_sync`` is accepted and does nothing: every microbatch is reduced."""

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        yield


# --- what each must be diagnosed as ---------------------------------------------------------


class Planted(NamedTuple):
    """A defective DDP, its planted defect in words, the code its first finding must carry,
    and the scenarios (catalog ids) enough to show it."""

    spec: str
    defect: str
    code: str
    scenarios: tuple[str, ...]
    world_size: int = 2


_D = "tests.defective:"
_S = "tests.diagnosed:"
PLANTED: tuple[Planted, ...] = (
    Planted(_D + "SumsWithoutDividing", "sums, never divides by the world size",
            "no-division", ("gradients/mlp-sgd",)),
    Planted(_S + "DividesTwice", "divides by the world size twice", "double-division",
            ("gradients/mlp-sgd",)),
    Planted(_S + "ScalesGradients", "multiplies every gradient by 0.9", "scaled",
            ("gradients/mlp-sgd",)),
    Planted(_S + "KeepsLastBucketLocal", "never reduces its last bucket", "not-reduced",
            ("buckets/mlp-tiny-cap",)),
    Planted(_S + "ScratchAveragesParameters", "averages parameters instead of gradients "
            "(from scratch)", "not-reduced", ("gradients/mlp-sgd",)),
    Planted(_S + "OneStepLate", "hands back the previous step's reduced bucket",
            "stale-gradient", ("gradients/mlp-sgd",)),
    Planted(_S + "OneStepLateLocalFirst", "hands back the previous step's reduced bucket, "
            "the local one at first", "stale-gradient", ("gradients/mlp-sgd",)),
    Planted(_S + "PermutesBucketOnOddRanks", "odd ranks reverse their bucket before the "
            "allreduce", "layout-mismatch", ("gradients/mlp-sgd",)),
    Planted(_D + "ReducesInFloat16", "reduces float32 gradients in float16",
            "narrowed-precision", ("gradients/mlp-sgd",)),
    Planted(_D + "UsesWorldGroup", "ignores its process group, reduces over the world",
            "wrong-group", ("process-groups/two-pairs-in-four",), world_size=4),
    Planted(_S + "ReducesEachBucketTwice", "allreduces every bucket twice", "reduced-twice",
            ("gradients/mlp-sgd",)),
    Planted(_S + "ScratchNoSyncIgnored", "no_sync does nothing (from scratch)",
            "no-sync-ignored", ("no-sync/window-of-3",)),
    Planted(_D + "NoSyncSwitchesSyncOn", "leaving no_sync switches sync on",
            "no-sync-not-restored", ("no-sync/nested",)),
    Planted(_D + "NeverBroadcastsBuffers", "ignores broadcast_buffers", "buffers-not-broadcast",
            ("buffers/conv-bn-broadcast",)),
    Planted(_S + "BroadcastsBuffersFromLastRank", "broadcasts buffers from the last rank",
            "buffers-wrong-source", ("buffers/conv-bn-broadcast",)),
    Planted(_S + "ScratchNoInitSync", "no broadcast at construction (from scratch)",
            "no-init-sync", ("init-sync/per-rank-weights",)),
    Planted(_S + "ScratchUnusedGetsZeros", "zero gradient for a parameter no rank used "
            "(from scratch)", "unused-not-none", ("unused/always-and-alternate",)),
    Planted(_S + "ScratchUnusedLocallyStaysNone", "no gradient where only another rank used "
            "the parameter (from scratch)", "unused-not-reduced", ("unused/used-on-some-ranks",)),
    Planted(_S + "JoinDividesByActive", "Join's divisor inverted", "join-divisor",
            ("join/uneven-divide-by-initial",)),
    Planted(_D + "JoinHookDoesNotShadow", "its join hook shadows nothing",
            "join-not-shadowed", ("join/uneven-divide-by-initial",)),
    Planted(_S + "SkipsJoinFinalSync", "no final sync from the last joiner", "join-final-sync",
            ("join/uneven-divide-by-initial",)),
    Planted(_D + "AcceptsSecondCommHook", "a second register_comm_hook is ignored",
            "api-refusal-missing", ("errors/comm-hook-registered-twice",)),
    Planted(_S + "ScratchAcceptsLazy", "accepts a module with uninitialized (lazy) "
            "parameters (from scratch)", "api-refusal-missing",
            ("surface/uninitialized-parameters",)),
    Planted(_D + "RaisesOnRank1", "rank 1 raises in its second forward", "raises",
            ("gradients/mlp-sgd",)),
    Planted(_S + "MismatchedBucketOnRank1", "rank 1 reduces one element less", "crash",
            ("gradients/mlp-sgd",)),
    Planted(_S + "StopsReducingOnRank1", "rank 1 stops reducing from its fourth bucket on",
            "hang-in-collective", ("gradients/mlp-sgd",)),
    Planted(_S + "HangsOnRank1", "rank 1 sleeps forever in its second forward",
            "hang-outside-collective", ("gradients/mlp-sgd",)),
)

#: Correct DDPs: no finding anywhere, and the scenarios the test runs them on.
#: (Torch's DDP and the reference refuse the lazy module: a PASS.)
LAZY = "surface/uninitialized-parameters"
_PLAIN = ("gradients/mlp-sgd-momentum", "buffers/conv-bn-broadcast", "no-sync/window-of-3")
CORRECT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", (*_PLAIN, LAZY)), ("reference", (*_PLAIN, LAZY)), (_S + "TinyBuckets", _PLAIN),
    (_S + "BucketViews", _PLAIN), (_S + "PassThroughHook", _PLAIN),
)
