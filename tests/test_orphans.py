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


def starts_a_sleeper_then_hangs(rank: int, world_size: int, token: str) -> None:
    """Starts a ``setsid`` sleeper marked with ``token``, then never ends (the pool kills it)."""
    subprocess.Popen(["sleep", "300"], env={**os.environ, "ORPHAN_TEST": token},
                     start_new_session=True)
    time.sleep(300)


def _marked(token: str, variable: str = "ORPHAN_TEST") -> list[int]:
    """Live processes whose environment carries ``variable=token``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"{variable}={token}".encode() in f.read() and _alive(int(entry)):
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def test_what_a_killed_rank_started_is_ended_by_the_pool() -> None:
    """A rank that times out is killed: it cannot end what it started; the pool does, by
    the marker in the rank's environment, and says so in the job's outcome."""
    import uuid

    from ddp_conformance.ranks.messages import Job
    from ddp_conformance.ranks.pool import RankPool

    token = uuid.uuid4().hex
    try:
        with RankPool(2) as pool:
            out = pool.run(Job("call", "", 60, function="tests.test_orphans:starts_a_sleeper_then_hangs",
                               args=(token,), trace=False), 3.0)
            assert out.status == "timeout"
            ended = [e for h in out.hygiene.values() for e in h.ended]
            assert len(ended) == 2 and all("sleep 300" in e for e in ended), ended
            assert not _marked(token)
    finally:
        for pid in _marked(token):
            os.kill(pid, signal.SIGKILL)
