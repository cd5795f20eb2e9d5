"""A backend whose works do not support ``get_future()``.

c10d's own ``Work.get_future`` raises for a backend that does not implement it (Gloo's
point-to-point works, MPI's, many third-party ones); torchft's ``ProcessGroupBabyGloo``
has one with side effects. A harness that asks for a future of its own breaks such a
backend; its ``wait()``-based collectives must run traced exactly as untraced::

    --backend tests.backends.no_future:no_future

Every work the example backend would return is wrapped in :class:`NoFutureWork`:
``wait()`` and ``is_completed()`` are the real work's; ``get_future()`` raises, and, as
asking ``ProcessGroupBabyGloo`` for one does, leaves the backend dead: every later
operation in the process raises (the calls are counted in :data:`FUTURES_ASKED`).
Importing this module registers ``no_future`` (CPU).
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from tests.backends.example import ExampleProcessGroup, register

#: How many times anything in this process asked one of this backend's works for a future.
FUTURES_ASKED = [0]


class NoFutureWork(dist.Work):
    """A real work, less its future."""

    def __init__(self, inner: dist.Work) -> None:
        super().__init__()
        self._inner = inner

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        return bool(self._inner.wait(timeout) if timeout else self._inner.wait())

    def is_completed(self) -> bool:
        return bool(self._inner.is_completed())

    def get_future(self) -> torch.futures.Future:
        FUTURES_ASKED[0] += 1
        raise RuntimeError("no_future backend: its works do not support get_future()")


def _no_future(method: Callable[..., dist.Work]) -> Callable[..., dist.Work]:
    def call(self: ExampleProcessGroup, *args: Any, **kwargs: Any) -> dist.Work:
        if FUTURES_ASKED[0]:
            raise RuntimeError("no_future backend: dead since one of its works was asked for "
                               "a future")
        return NoFutureWork(method(self, *args, **kwargs))

    call.__name__ = method.__name__
    call.__doc__ = method.__doc__
    return call


class NoFutureProcessGroup(ExampleProcessGroup):
    """The example backend, whose works have no future."""

    backend_name = "no_future"


for _name in ("allreduce", "allreduce_coalesced", "reduce", "broadcast", "allgather",
              "all_gather_single", "gather", "scatter", "reduce_scatter",
              "reduce_scatter_single", "alltoall", "all_to_all_single", "send", "recv",
              "recv_anysource", "barrier"):
    setattr(NoFutureProcessGroup, _name, _no_future(getattr(ExampleProcessGroup, _name)))

register(NoFutureProcessGroup)
no_future = NoFutureProcessGroup.backend_name
