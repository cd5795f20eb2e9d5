"""The rank pool: reuse, deadlines, stacks, crashes, released peers, desync diagnosis,
replacements forked from the zygote, spare hand-overs without it, fresh mode."""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from ddp_conformance.ranks import watch as watch_module
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.outcome import Outcome
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


LEAKED: list[object] = []


def leak_and_raise_on_rank1(rank: int, world_size: int) -> None:
    """Rank 1 leaks its group (as a candidate that keeps itself alive does) and raises."""
    if rank == 1:
        LEAKED.append(dist.group.WORLD)
        raise ValueError("rank 1 fails on purpose")
    dist.all_reduce(torch.ones(1))


def raise_everywhere(rank: int, world_size: int) -> None:
    raise ValueError(f"rank {rank} fails on purpose")


def raise_with_allreduce_in_flight(rank: int, world_size: int) -> None:
    """Every rank launches the same async allreduce, then raises before waiting for it (as
    DDP does when its reducer asserts between launching a bucket and finalising)."""
    if rank == 1:
        time.sleep(0.05)  # rank 0's work is still in flight when it raises
    dist.all_reduce(torch.ones(1000), async_op=True)
    raise ValueError(f"rank {rank} fails on purpose")


def mismatched(rank: int, world_size: int) -> None:
    """Rank 0 in an allreduce while rank 1 is in a broadcast: never completes."""
    if rank == 0:
        dist.all_reduce(torch.ones(3))
    else:
        dist.broadcast(torch.ones(5), 0)


def skips_collective_on_rank1(rank: int, world_size: int) -> None:
    """Rank 1 finishes the job without the allreduce rank 0 waits in."""
    if rank == 0:
        dist.all_reduce(torch.ones(1))


def async_then_compute_then_raise(rank: int, world_size: int) -> None:
    """Rank 0 launches an allreduce rank 1 never issues, then computes (outside any
    collective) for 1.5 s and raises; rank 1 finishes at once."""
    if rank == 0:
        dist.all_reduce(torch.ones(1), async_op=True)
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            pass
        raise ValueError("rank 0 gives up after computing")


def slow_but_matching(rank: int, world_size: int, delay: float) -> float:
    """Rank 0 waits in an allreduce while rank 1 sleeps, then joins it: merely slow."""
    if rank == 1:
        time.sleep(delay)
    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


def exit_on_rank1(rank: int, world_size: int) -> None:
    if rank == 1:
        os._exit(3)
    dist.all_reduce(torch.ones(1))


def call(pool: RankPool, fn: str, *args: object, timeout: float = 10.0, trace: bool = True) -> Outcome:
    return pool.run(Job("call", "", timeout + 30, function=f"{__name__}:{fn}", args=args,
                        trace=trace), timeout)


def test_pool_is_reused_and_each_job_starts_clean() -> None:
    with RankPool(2) as pool:
        assert pool.call(f"{__name__}:allreduce_rank", 1.0) == [3.0, 3.0]
        first = pool.call(f"{__name__}:state_after_previous")
        second = pool.call(f"{__name__}:state_after_previous")
        assert pool.spawned == 2
        assert [s[2] for s in first] == [s[2] for s in second], "same processes reused"
        # One group (the job's own) exists during a job: none left over from before, and
        # the RNG is reseeded per job.
        assert [s[0] for s in first] == [1, 1] == [s[0] for s in second]
        assert [s[1] for s in first] == [s[1] for s in second]


def test_a_raising_rank_is_reported_and_its_peer_released_promptly() -> None:
    with RankPool(2) as pool:
        pool.start()
        out = call(pool, "raise_on_rank1")
        assert out.status == "raised"
        assert "rank 1 fails on purpose" in out.tracebacks[1]
        assert out.released == {0}, "rank 0's failure is only the echo of rank 1's"
        assert out.elapsed_s < 5.0, f"peer not released promptly ({out.elapsed_s:.1f}s)"
        pids = pool.pids()
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]
        assert pool.pids() == pids, "both stay: rank 1 let its group go, rank 0 was released"


def test_a_raising_rank_that_cannot_let_go_leaves_and_releases_its_peer() -> None:
    with RankPool(2) as pool:
        pool.start()
        pids = pool.pids()
        out = call(pool, "leak_and_raise_on_rank1")
        assert out.status == "raised" and out.released == {0}
        assert out.elapsed_s < 5.0, f"peer not released promptly ({out.elapsed_s:.1f}s)"
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]
        now = pool.pids()
        assert now[0] == pids[0] and now[1] != pids[1], "rank 1 was replaced, rank 0 stayed"


def test_ranks_that_all_raise_stay_in_the_pool() -> None:
    """Nobody waits on anybody: every rank cleans up and stays; no process is started."""
    with RankPool(2) as pool:
        pool.start()
        pids = pool.pids()
        out = call(pool, "raise_everywhere")
        assert out.status == "raised" and out.released == set()
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]
        assert pool.pids() == pids and pool.spawned == 2


def test_ranks_that_raise_with_matched_work_in_flight_wait_for_it_and_stay() -> None:
    """The work completes (every rank launched it): no rank leaves, no process is started."""
    with RankPool(2) as pool:
        pool.start()
        pids = pool.pids()
        out = call(pool, "raise_with_allreduce_in_flight")
        assert out.status == "raised"
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]
        assert pool.pids() == pids and pool.spawned == 2


def test_without_the_trace_a_raising_rank_leaves() -> None:
    """Untraced, a rank cannot know whether its own work is in flight: it leaves."""
    with RankPool(2, spare=False) as pool:
        pool.start()
        pids = pool.pids()
        out = call(pool, "raise_everywhere", trace=False)
        assert out.status == "raised"
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]
        assert set(pool.pids()).isdisjoint(pids)


def test_mismatched_collectives_are_a_desync_named_within_seconds() -> None:
    with RankPool(2) as pool:
        pool.start()
        out = call(pool, "mismatched", timeout=60.0)
        assert out.status == "timeout"
        assert out.elapsed_s < 10.0, f"desync not diagnosed early ({out.elapsed_s:.1f}s)"
        assert out.desync is not None
        first = out.desync.summary
        assert "rank 0 waits in allreduce(3 x float32) #1" in first
        assert "rank 1 waits in broadcast(5 x float32) #1" in first
        assert "differ first at #1" in first
        assert "mismatched" in out.stacks[0] and "mismatched" in out.stacks[1]
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]


def test_a_rank_that_finished_while_a_peer_waits_is_a_desync() -> None:
    with RankPool(2) as pool:
        pool.start()
        out = call(pool, "skips_collective_on_rank1", timeout=60.0)
        assert out.status == "timeout" and out.elapsed_s < 10.0
        assert out.desync is not None
        assert "rank 1 never issued #1: it finished the job" in out.desync.summary
        assert set(out.stacks) == {0}


def test_a_wait_on_a_finished_rank_ends_without_the_quiet_period(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 sits in all_reduce (its stack says so) on a rank that finished without
    issuing it: the desync is final, and the job ends without the quiet period (made 30 s
    here, so that only the stacks can have decided it); the stack that showed it is rank
    0's evidence."""
    monkeypatch.setattr(watch_module, "DESYNC_QUIET_S", 30.0)
    with RankPool(2) as pool:
        pool.start()
        out = call(pool, "skips_collective_on_rank1", timeout=60.0)
        assert out.status == "timeout" and out.desync is not None and out.desync.final
        assert out.elapsed_s < 20.0, f"waited for the quiet period ({out.elapsed_s:.1f}s)"
        assert "rank 1 never issued #1: it finished the job" in out.desync.summary
        assert "skips_collective_on_rank1" in out.stacks[0] and set(out.stacks) == {0}
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]


def test_a_rank_computing_after_an_unmatched_launch_is_left_to_finish() -> None:
    """Rank 0's allreduce can never complete (rank 1 finished), but rank 0 computes outside
    any collective and then raises: its stack is not in a collective, so it is not cut short
    as a desync; the case ends as its own error."""
    with RankPool(2) as pool:
        pool.start()
        out = call(pool, "async_then_compute_then_raise", timeout=60.0)
        assert out.status == "raised", out.desync
        assert "rank 0 gives up after computing" in out.tracebacks[0]


def test_a_slow_rank_is_not_a_desync() -> None:
    """Rank 0 waits in a collective that rank 1 reaches after 3 s: no diagnosis fires."""
    with RankPool(2) as pool:
        out = call(pool, "slow_but_matching", 3.0, timeout=30.0)
        assert out.status == "done" and out.results == {0: 2.0, 1: 2.0}


def test_without_the_trace_a_desync_waits_for_the_deadline() -> None:
    with RankPool(2, spare=False) as pool:
        out = call(pool, "mismatched", timeout=3.0, trace=False)
        assert out.status == "timeout" and out.desync is None and out.elapsed_s >= 3.0


def test_replacements_come_from_a_spare_after_the_first_fault() -> None:
    """Without a zygote: the first fault starts processes (and the spares); the next takes
    the spares."""
    with RankPool(2, fork=False) as pool:
        pool.start()
        assert call(pool, "mismatched", timeout=60.0).status == "timeout"
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]
        assert pool.handovers == 0 and pool.spawned == 6  # 2 + 2 replacements + 2 spares
        spares = set(pool.pids(spares=True)) - set(pool.pids())
        assert len(spares) == 2
        assert call(pool, "mismatched", timeout=60.0).status == "timeout"
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]
        assert set(pool.pids()) == spares and pool.handovers == 2
        everyone = pool.pids(spares=True)
    gone_by = time.monotonic() + 5.0
    while any(_alive(p) for p in everyone) and time.monotonic() < gone_by:
        time.sleep(0.05)
    assert not [p for p in everyone if _alive(p)], "a rank or spare outlived close()"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_replacements_are_forked_when_needed_with_a_zygote() -> None:
    """With the zygote, a fault's replacements are forked from it before the next job (no
    spare is kept): two processes per fault, children of the zygote."""
    with RankPool(2) as pool:
        pool.start()
        before = pool.pids()
        assert call(pool, "mismatched", timeout=60.0).status == "timeout"
        out = call(pool, "state_after_previous")
        assert out.status == "done"
        after = pool.pids()
        assert set(after).isdisjoint(before) and [out.results[r][2] for r in (0, 1)] == after
        assert pool.spawned == 4 and pool.handovers == 0
        assert pool.pids(spares=True) == after, "no spare kept"
        assert pool._zygote is not None
        assert {_parent(p) for p in after} == {pool._zygote.proc.pid}


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_hang_times_out_with_every_rank_stack_and_a_fresh_pool() -> None:
    with RankPool(2) as pool:
        out = call(pool, "hang_on_rank0", timeout=2.0)
        assert out.status == "timeout"
        assert "hang_on_rank0" in out.stacks[0] and "hang_on_rank0" in out.stacks[1]
        assert "all_reduce" in out.stacks[1]
        assert out.desync is None, "rank 0 sleeps outside any collective: merely slow"
        assert pool.call(f"{__name__}:allreduce_rank", 0.0) == [1.0, 1.0]
        assert pool.spawned == 4  # 2, then 2 replacements forked from the zygote


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
        assert pool.spawned == 4
        assert {s[2] for s in a}.isdisjoint({s[2] for s in b})


def imported(rank: int, world_size: int, module: str) -> bool:
    import sys

    return module in sys.modules


def test_ranks_resolve_the_runs_candidates_before_they_say_ready() -> None:
    """A framework's import (seconds for Lightning) is paid at start, not in a case."""
    with RankPool(2, spare=False, preload=["tests.newcomers:NewcomerDDP", "no.such:thing"]) as pool:
        assert pool.call(f"{__name__}:imported", "tests.newcomers") == [True, True]
    with RankPool(2, spare=False) as pool:
        assert pool.call(f"{__name__}:imported", "tests.newcomers") == [False, False]


def leaves_a_thread_and_a_flag(rank: int, world_size: int) -> int:
    """A job that leaves what can be put back (a flag) and what cannot (a live thread)."""
    import threading

    torch.backends.mkldnn.enabled = False
    if rank == 1:
        threading.Thread(target=time.sleep, args=(300,), name="left-behind", daemon=True).start()
    return os.getpid()


def mkldnn_and_pid(rank: int, world_size: int) -> tuple[bool, int]:
    return torch.backends.mkldnn.enabled, os.getpid()


def test_a_job_that_leaves_state_is_cleaned_up_or_its_rank_retired() -> None:
    with RankPool(2) as pool:
        pool.start()
        out = call(pool, "leaves_a_thread_and_a_flag")
        assert out.status == "done"
        assert "torch.backends.mkldnn.enabled" in out.hygiene[0].restored[0]
        assert not out.hygiene[0].retire and out.hygiene[1].retire
        assert "left-behind" in out.hygiene[1].retired[0]
        after = pool.call(f"{__name__}:mkldnn_and_pid")
        assert [a[0] for a in after] == [True, True], "the flag was put back"
        assert after[0][1] == out.results[0], "rank 0 stays"
        assert after[1][1] != out.results[1], "rank 1 was retired: a fresh process"
