"""Run a function on several real ranks of a Gloo process group, for the project's tests.

`run_distributed(fn, world_size, *args)` calls ``fn(rank, world_size, *args)`` on every
rank with the default process group initialised (Gloo, localhost) and returns the list of
per-rank return values. ``fn`` must be a module-level function (it is sent by reference,
``module:qualname``) and its arguments and results picklable. An exception on any rank,
a hang past ``timeout`` or a dead rank raises ``DistributedTestError`` with every rank's
traceback or stack.

It runs on the harness's persistent rank pool (one pool per world size, kept for the whole
pytest process), so a call costs a process group and the function, not process starts.
"""
from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any

from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.outcome import describe_outcome
from ddp_conformance.ranks.pool import RankPool

_POOLS: dict[int, RankPool] = {}


class DistributedTestError(AssertionError):
    pass


def pool_for(world_size: int) -> RankPool:
    if world_size not in _POOLS:
        _POOLS[world_size] = RankPool(world_size)
    return _POOLS[world_size]


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()


def run_distributed(fn: Callable[..., Any], world_size: int = 2, *args: Any,
                    timeout: float = 120.0) -> list[Any]:
    ref = f"{fn.__module__}:{fn.__qualname__}"
    out = pool_for(world_size).run(Job("call", "", timeout + 30.0, function=ref, args=args,
                                       trace=False), timeout)
    if out.status != "done":
        raise DistributedTestError(describe_outcome(out))
    return [out.results[r] for r in range(world_size)]
