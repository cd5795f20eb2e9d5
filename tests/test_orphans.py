"""No rank outlives its parent: killed with SIGKILL while its ranks are busy in a job, the
parent leaves no process behind (the kernel ends them: ``die_with_parent``)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PARENT = textwrap.dedent('''
    import sys
    from ddp_conformance.ranks.messages import Job
    from ddp_conformance.ranks.pool import RankPool

    pool = RankPool(2)
    pool.start()
    print(" ".join(map(str, pool.pids())), flush=True)
    pool.run(Job("call", "", 600, function="tests.test_orphans:busy", trace=False), 600)
''')


def busy(rank: int, world_size: int) -> None:
    """A job that keeps the rank busy (not reading its socket) for a long time."""
    time.sleep(300)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead
    except FileNotFoundError:
        return False


def test_ranks_die_with_a_killed_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    time.sleep(1.0)  # the job has reached the ranks
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10.0
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = [p for p in pids if _alive(p)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"rank processes {survivors} outlived their parent"
