"""World sizes up to 16 on one machine: 8 forked ranks run a job; a world size that does not
fit (ranks per core, measured memory) is refused with one line and exit 2, unless
``--allow-oversubscribe``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_conformance.errors import UsageError
from ddp_conformance.ranks.capacity import RANKS_PER_CORE, check_cores, check_memory
from ddp_conformance.ranks.pool import RankPool
from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parent.parent


def test_eight_forked_ranks_run_a_collective() -> None:
    with RankPool(8) as pool:
        assert pool.call("tests.test_pool:allreduce_rank", 0.0) == [28.0] * 8  # 0+1+...+7
        assert pool._zygote is not None


def test_more_ranks_than_the_cores_take_are_refused_unless_allowed() -> None:
    check_cores(2 * RANKS_PER_CORE, allow=False, cores=2)
    with pytest.raises(UsageError, match=r"--world-size 17: 17 ranks on 2 cores.*"
                                         r"--allow-oversubscribe"):
        check_cores(2 * RANKS_PER_CORE + 1, allow=False, cores=2)
    check_cores(64, allow=True, cores=2)


def test_ranks_that_memory_cannot_hold_are_refused_unless_allowed() -> None:
    check_memory(16, rank_mib=300.0, allow=False, available_mib=16 * 300.0)
    with pytest.raises(UsageError, match=r"16 ranks of 300 MiB \(measured\) need 4\.7 GiB, "
                                         r"4\.0 GiB available"):
        check_memory(16, rank_mib=300.0, allow=False, available_mib=4096.0)
    check_memory(16, rank_mib=300.0, allow=True, available_mib=4096.0)


def test_the_cli_refuses_a_world_size_beyond_the_cores_with_one_line(tmp_path: Path) -> None:
    size = RANKS_PER_CORE * (os.cpu_count() or 1) + 1
    proc = subprocess.run([sys.executable, "-m", "ddp_conformance", "run", "--world-size",
                           str(size), "--report-dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=deadline(300), check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"ddp-conformance: error: --world-size {size}: {size} ranks on {os.cpu_count()} cores "
        f"is more than {RANKS_PER_CORE} per core; pass --allow-oversubscribe to run anyway"]
