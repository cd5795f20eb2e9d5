"""Candidates that leave state behind in the rank process, for the harness's isolation tests.

Each is torch's DDP that, in its constructor or forward, changes what a later candidate in
the same rank would see (the leaks of issue 29), or starts processes that would outlive
the job. Their own verdicts do not matter; what matters is that a candidate run after them
in the same run (torch) gets the verdicts it gets alone, and that the report names the
leak (:mod:`ddp_conformance.ranks.hygiene`, :mod:`ddp_conformance.ranks.orphans`).
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.overrides import TorchFunctionMode

_ORIGINAL_ADD_ = torch.Tensor.add_
_ORIGINAL_ALL_REDUCE = dist.all_reduce


class DefaultDeviceMeta(DistributedDataParallel):
    """Leaves the default device on ``meta``: every later factory call makes meta tensors."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        torch.set_default_device("meta")


def _doubled_add_(self: torch.Tensor, other: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
    return _ORIGINAL_ADD_(_ORIGINAL_ADD_(self, other, *args, **kwargs), other, *args, **kwargs)


class PatchesTensorAdd(DistributedDataParallel):
    """Replaces ``torch.Tensor.add_`` with one that adds twice (optimizers' updates double)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        torch.Tensor.add_ = _doubled_add_  # type: ignore[method-assign]


class GlobalForwardHook(DistributedDataParallel):
    """Registers a global forward hook that scales every module's tensor output."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        torch.nn.modules.module.register_module_forward_hook(
            lambda module, inputs, output: output * 1.5 if isinstance(output, torch.Tensor)
            else output)


class _ScalesLinear(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        return out * 1.01 if func is torch.nn.functional.linear else out


class EntersFunctionMode(DistributedDataParallel):
    """Enters a TorchFunctionMode (scaling every linear layer's output) and never leaves."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _ScalesLinear().__enter__()


def _doubling_all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    work = _ORIGINAL_ALL_REDUCE(tensor, *args, **kwargs)
    tensor.mul_(2)
    return work


class PatchesAllReduce(DistributedDataParallel):
    """Replaces ``torch.distributed.all_reduce`` with one that doubles the result."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        dist.all_reduce = _doubling_all_reduce


class MkldnnOff(DistributedDataParallel):
    """Turns oneDNN off for the whole process."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        torch.backends.mkldnn.enabled = False


def _issue_collectives() -> None:
    time.sleep(0.5)  # after its own job: then in whatever job the rank runs next
    while True:
        try:
            dist.all_reduce(torch.ones(1))
        except Exception:  # noqa: BLE001, S110 - hostile: keeps trying in every job
            pass
        time.sleep(0.01)


class ThreadIssuingCollectives(DistributedDataParallel):
    """Starts a daemon thread that issues allreduces on the default group, forever."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        threading.Thread(target=_issue_collectives, name="hostile-collectives",
                         daemon=True).start()


def _fork(then: str) -> None:
    """Start a child that outlives the job: plain, a double fork, or in a new session."""
    pid = os.fork()
    if pid:
        if then == "double":
            os.waitpid(pid, 0)  # the intermediate child exits at once
        return
    try:
        if then == "double" and os.fork():
            os._exit(0)
        if then == "setsid":
            os.setsid()
        time.sleep(300)
    finally:
        os._exit(0)


class StartsChildren(DistributedDataParallel):
    """In every forward: a fork, a double fork, a ``setsid`` child and ``sleep 300``."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        for then in ("plain", "double", "setsid"):
            _fork(then)
        subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return super().forward(*args, **kwargs)
