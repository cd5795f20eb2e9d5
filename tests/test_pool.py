"""The rank pool: reuse, deadlines, stacks, crashes, released peers, fresh mode."""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.pool import RankPool


def allreduce_rank(rank: int, world_size: int, k: float) -> float:
    x = torch.tensor([float(rank) + k])
    dist.all_reduce(x)
    return x.item()


def state_after_previous(rank: int, world_size: int) -> tuple[int, float, int]:
    """What a job sees of the previous one: groups, RNG, and process id."""
    return (len(dist.distributed_c10d._world.pg_map), torch.rand(1).item(), os.getpid())


def raise_on_rank1(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.all_reduce(torch.ones(1))


def hang_on_rank0(rank: int, world_size: int) -> None:
    if rank == 0:
        time.sleep(600)
    dist.all_reduce(torch.ones(1))


def exit_on_rank1(rank: int, world_size: int) -> None:
    if rank == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(1))


def call(pool: RankPool, fn: str, *args: object, timeout: float = 10.0) -> object:
    return pool.run(Job("call", "", timeout + 30, function=f"{__name__}:{fn}", args=args), timeout)


def test_pool_is_reused_and_each_job_starts_clean() -> None:
    with RankPool(2) as pool:
        assert pool.call(f"{__name__}:allreduce_rank", 1.0) == [3.0, 3.0]
        first = pool.call(f"{__name__}:state_after_previous")
        second = pool.call(f"{__name__}:state_after_previous")
        assert pool.starts == 1
        assert [s[2] for s in first] == [s[2] for s in second], "same processes reused"
        # One group (the job's own) exists during a job: none left over from before, and
        # the RNG is reseeded per job.
        assert [s[0] for s in first] == [1, 1] == [s[0] for s in second]
        assert [s[1] for s in first] == [s[1] for s in second]


def test_a_raising_rank_is_reported_and_its_peer_released_promptly() -> None:
    with RankPool(2) as pool:
        started = time.monotonic()
        out = call(pool, "raise_on_rank1")
        elapsed = time.monotonic() - started
        assert out.status == "raised"
        assert "rank 1 fails on purpose" in out.tracebacks[1]
        assert out.released == {0}, "rank 0's failure is only the echo of rank 1's"
        assert elapsed < 5.0, f"peer not released promptly ({elapsed:.1f}s)"
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]


def test_a_hang_times_out_with_every_rank_stack_and_a_fresh_pool() -> None:
    with RankPool(2) as pool:
        out = call(pool, "hang_on_rank0", timeout=2.0)
        assert out.status == "timeout"
        assert "hang_on_rank0" in out.stacks[0] and "hang_on_rank0" in out.stacks[1]
        assert "all_reduce" in out.stacks[1]
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]
        assert pool.starts == 2


def test_a_dead_rank_is_a_crash_with_its_exit_code() -> None:
    with RankPool(2) as pool:
        out = call(pool, "exit_on_rank1")
        assert out.status == "crash"
        assert out.exit_codes == {1: 3}
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]


def test_fresh_mode_starts_new_processes_for_every_job() -> None:
    with RankPool(2, fresh=True) as pool:
        a = pool.call(f"{__name__}:state_after_previous")
        b = pool.call(f"{__name__}:state_after_previous")
        assert pool.starts == 2
        assert {s[2] for s in a}.isdisjoint({s[2] for s in b})
