"""Ranks forked from a warm zygote: fork-safe (one thread in the zygote), a forked rank's
first collective, RNG as fresh processes have it, orphans of killed ranks ended, the spawn
path when the zygote cannot run (said once), and no process left after SIGKILL of the
parent, SIGTERM or SIGINT of a run."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddp_conformance.ranks import zygote as zygote_module
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.pool import RankPool
from tests.test_orphans import _marked
from tests.test_pool import _alive

ROOT = Path(__file__).resolve().parent.parent


def first_collective_and_rng(rank: int, world_size: int) -> tuple[float, float, float, int]:
    """The job's allreduce, torch's and numpy's first draws, and the thread count now."""
    import numpy

    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    return (x.item(), torch.rand(1).item(), float(numpy.random.rand()),
            len(os.listdir("/proc/self/task")))


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_forked_ranks_run_collectives_and_draw_as_fresh_processes() -> None:
    """Forked or started, a job's torch RNG is the job's seed (equal on both paths), and
    numpy's is each process's own (seeded from the OS, as a fresh process's): it differs
    across ranks and across the zygote's forks. The zygote itself runs one thread."""
    with RankPool(2) as forked, RankPool(2, fork=False) as started:
        a = forked.call(f"{__name__}:first_collective_and_rng")
        assert forked._zygote is not None and forked.notes == []
        assert _threads(forked._zygote.proc.pid) == 1, "the zygote started a thread"
        b = started.call(f"{__name__}:first_collective_and_rng")
    assert [r[0] for r in a] == [3.0, 3.0] == [r[0] for r in b]
    assert [r[1] for r in a] == [r[1] for r in b], "the job's seed decides torch's draws"
    assert a[0][2] != a[1][2], "forked ranks share numpy's RNG state"


def forks_a_sleeper_then_hangs(rank: int, world_size: int, path: str) -> None:
    """Forks (no exec: no marker of its own in /proc) a child that sleeps, writes its pid
    to ``path``, then never ends (the pool kills the rank)."""
    child = os.fork()
    if child == 0:
        time.sleep(300)
        os._exit(0)
    with open(f"{path}.{rank}", "w") as f:
        f.write(str(child))
    time.sleep(300)


def test_what_a_killed_forked_rank_forked_is_ended_by_the_zygote(tmp_path: Path) -> None:
    with RankPool(2) as pool:
        out = pool.run(Job("call", "", 60, function=f"{__name__}:forks_a_sleeper_then_hangs",
                           args=(str(tmp_path / "pid"),), trace=False), 3.0)
        assert out.status == "timeout"
        pids = [int((tmp_path / f"pid.{r}").read_text()) for r in (0, 1)]
        ended = [e for h in out.hygiene.values() for e in h.ended]
        assert sorted(int(e.split()[1]) for e in ended) == sorted(pids), ended
        assert not [p for p in pids if _alive(p)]
        assert pool.call("tests.test_pool:allreduce_rank", 0.0) == [1.0, 1.0]


def test_an_unfit_zygote_falls_back_to_started_processes_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A zygote with a thread (numpy's OpenBLAS pool, let run here) is not forked from."""
    monkeypatch.setattr(zygote_module, "ZYGOTE_ENV",
                        {**zygote_module.ZYGOTE_ENV, "OPENBLAS_NUM_THREADS": "2"})
    with RankPool(2, spare=False) as pool:
        assert pool.call("tests.test_pool:allreduce_rank", 0.0) == [1.0, 1.0]
        pool.start()
        assert pool._zygote is None
        assert len(pool.notes) == 1, pool.notes
        assert "the zygote failed" in pool.notes[0] and "threads" in pool.notes[0]


def _tagged(token: str) -> list[int]:
    """Live processes whose environment carries ``ZYGOTE_TEST=token`` (the run's own: the
    zygote and its ranks inherit it, whatever else runs on the machine)."""
    return _marked(token, "ZYGOTE_TEST")


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_no_process_outlives_a_run_ended_by_a_signal(signum: int, tmp_path: Path) -> None:
    """``ddp-conformance run`` is sent ``signum`` while its cases run: its zygote and every
    rank (each forked from the zygote) are gone within seconds."""
    token = uuid.uuid4().hex
    run = subprocess.Popen(
        [sys.executable, "-m", "ddp_conformance", "run", "--candidate", "torch",
         "--report-dir", str(tmp_path), "--world-size", "2"],
        cwd=ROOT, env={**os.environ, "ZYGOTE_TEST": token}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    assert run.stdout is not None
    try:
        for line in run.stdout:  # the ranks are up and cases run
            if line.startswith("started"):
                break
        time.sleep(1.0)
        running = _tagged(token)
        assert len(running) >= 4, f"run, zygote and 2 ranks expected: {running}"
        run.send_signal(signum)
        run.communicate(timeout=60)
        deadline = time.monotonic() + 10.0
        while _tagged(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _tagged(token), "processes outlived the run"
    finally:
        run.kill()
        for pid in _tagged(token):
            os.kill(pid, signal.SIGKILL)
