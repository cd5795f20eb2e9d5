"""One communicator for many jobs: kept while sound, renewed after anything else
(``ddp_conformance/ranks/communicator.py``). Real rank processes, real Gloo groups."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_conformance.ranks.communicator import (
    COMMUNICATORS,
    CommState,
    CommunicatorCache,
    Generations,
    sound,
)
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.outcome import Outcome
from ddp_conformance.ranks.pool import RankPool
from ddp_conformance.ranks.tracing import TracingProcessGroup

# -- the rules, without processes ---------------------------------------------------------


def test_sound_needs_every_rank_quiet_with_the_same_count() -> None:
    quiet = {0: CommState(5, True), 1: CommState(5, True)}
    assert sound(quiet, 2)
    assert not sound(quiet, 3), "a rank that did not report (it raised, died, hangs)"
    assert not sound({0: CommState(5, True), 1: CommState(4, True)}, 2)
    assert not sound({0: CommState(5, False), 1: CommState(5, True)}, 2)


def test_generations_renew_after_anything_but_a_sound_done() -> None:
    gens = Generations()
    first = gens.name()
    gens.settle(True, {0: CommState(2, True), 1: CommState(2, True)}, 2)
    assert gens.name() == first
    gens.settle(False, {0: CommState(2, True), 1: CommState(2, True)}, 2)
    second = gens.name()
    assert second != first
    gens.settle(True, {0: CommState(3, True), 1: CommState(2, True)}, 2)
    assert gens.name() not in (first, second)
    assert Generations(enabled=False).name() == ""


def test_the_cache_reuses_under_the_same_name_backend_and_timeout_only() -> None:
    cache = CommunicatorCache()
    made: list[object] = []

    def create() -> object:
        made.append(object())
        return made[-1]

    assert cache.arm("comm0", "gloo", 60.0) is None
    a = cache.default_backend(create)
    assert cache.arm("comm0", "gloo", 60.0) is None
    assert cache.default_backend(create) is a and cache.keeps(a)
    assert cache.arm("comm0", "gloo", 30.0) is a, "another timeout: the old one is let go"
    b = cache.default_backend(create)
    assert b is not a
    assert cache.arm("comm1", "gloo", 30.0) is b
    assert cache.arm("", "gloo", 30.0) is None
    c = cache.default_backend(create)
    assert not cache.keeps(c), "a job that names no generation keeps nothing"
    assert len(made) == 3


# -- on rank processes --------------------------------------------------------------------


def world_backend(rank: int, world_size: int, value: float) -> tuple[int, bool, float]:
    """How many communicators this rank created so far, whether the default group's is
    kept, and an allreduce of ``value + rank`` over it."""
    world = dist.group.WORLD
    assert isinstance(world, TracingProcessGroup)
    x = torch.tensor([value + rank])
    dist.all_reduce(x)
    return COMMUNICATORS.created, world.pooled, x.item()


def subgroup_is_fresh(rank: int, world_size: int) -> bool:
    group = dist.new_group([0, 1])
    assert isinstance(group, TracingProcessGroup)
    x = torch.ones(1)
    dist.all_reduce(x, group=group)
    return not group.pooled and x.item() == world_size


def leave_unmatched_allreduce_on_rank0(rank: int, world_size: int) -> None:
    """Rank 0 launches an allreduce rank 1 never joins, and does not wait for it."""
    if rank == 0:
        dist.all_reduce(torch.full((1,), 100.0), async_op=True)


def raise_on_rank1(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.all_reduce(torch.ones(1))


def call(pool: RankPool, fn: str, *args: object) -> Outcome:
    return pool.run(Job("call", "", 40.0, function=f"{__name__}:{fn}", args=args), 10.0)


def results(out: Outcome) -> list[tuple[int, bool, float]]:
    assert out.status == "done", out
    return [out.results[r] for r in sorted(out.results)]


def test_a_sound_job_leaves_its_communicator_to_the_next() -> None:
    with RankPool(2) as pool:
        first = results(call(pool, "world_backend", 1.0))
        second = results(call(pool, "world_backend", 2.0))
        assert [r[2] for r in first] == [3.0, 3.0] and [r[2] for r in second] == [5.0, 5.0]
        assert [r[0] for r in first] == [r[0] for r in second] == [1, 1], "one communicator"
        assert all(r[1] for r in first + second)
        assert pool.communicators.started == 2  # the constructor's and start()'s
        assert all(call(pool, "subgroup_is_fresh").results.values())


def test_an_unmatched_collective_is_not_carried_into_the_next_job() -> None:
    """Were rank 0's stale allreduce kept, the next job's allreduce would pair with it
    (Gloo pairs by tag): 100 + 1 instead of 1 + 2."""
    with RankPool(2) as pool:
        before = results(call(pool, "world_backend", 0.0))
        out = call(pool, "leave_unmatched_allreduce_on_rank0")
        assert out.status == "done"
        assert not out.communicators[0].quiet and out.communicators[1].quiet
        after = results(call(pool, "world_backend", 1.0))
        assert [r[2] for r in after] == [3.0, 3.0]
        assert [r[0] for r in after] == [r[0] + 1 for r in before], "each created a new one"


def test_a_failed_job_renews_the_communicator() -> None:
    with RankPool(2) as pool:
        before = results(call(pool, "world_backend", 0.0))
        assert call(pool, "raise_on_rank1").status == "raised"
        after = results(call(pool, "world_backend", 0.0))
        assert [r[2] for r in after] == [1.0, 1.0]
        assert after[0][0] == before[0][0] + 1, "rank 0 (which stayed) created a new one"


def test_reuse_can_be_turned_off() -> None:
    with RankPool(2, reuse_communicators=False) as pool:
        jobs = [results(call(pool, "world_backend", 0.0)) for _ in range(2)]
        assert not any(r[1] for job in jobs for r in job)
        assert [r[0] for r in jobs[1]] == [2, 2]

