"""Process groups destroyed off the job's path: on the reaper's thread, waited for at exit."""
from __future__ import annotations

import threading
import time

from ddp_conformance.ranks.pool import RankPool
from ddp_conformance.ranks.reaper import GroupReaper


class Finalised:
    """Stands for a process group: records the thread its last reference went on."""

    def __init__(self, seen: list[str], delay_s: float = 0.0) -> None:
        self.seen, self.delay_s = seen, delay_s

    def __del__(self) -> None:
        time.sleep(self.delay_s)
        self.seen.append(threading.current_thread().name)


def test_retired_groups_go_on_the_reapers_thread_in_order() -> None:
    seen: list[str] = []
    reaper = GroupReaper()
    reaper.retire([Finalised(seen)])
    reaper.retire([Finalised(seen), Finalised(seen)])
    assert reaper.drain(5.0)
    assert seen == ["ddp-conformance-reaper"] * 3


def test_drain_waits_for_a_slow_destructor_and_has_a_deadline() -> None:
    seen: list[str] = []
    reaper = GroupReaper()
    reaper.retire([Finalised(seen, delay_s=0.5)])
    assert not reaper.drain(0.05), "drained while a destructor was still running"
    assert seen == []
    assert reaper.drain(5.0)
    assert seen == ["ddp-conformance-reaper"]


def test_nothing_retired_starts_no_thread() -> None:
    reaper = GroupReaper()
    reaper.retire([])
    assert reaper.drain(0.0)
    assert reaper._thread is None


def test_ranks_exit_cleanly_after_jobs_whose_groups_went_in_the_background() -> None:
    pool = RankPool(2)
    with pool:
        for k in range(6):
            assert pool.call("tests.test_pool:allreduce_rank", float(k)) == [2 * k + 1.0] * 2
        procs = [r.proc for r in pool._active if r is not None]
    assert [p.returncode for p in procs] == [0, 0], "a rank did not exit on its own (or aborted)"
