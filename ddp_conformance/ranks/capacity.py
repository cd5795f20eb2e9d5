"""Whether a world size fits this machine: refused with one line unless oversubscribing is
asked for (``--allow-oversubscribe``).

Every rank is a process holding torch (about 300 MiB resident here, measured on the warmed
zygote or, without one, on the parent that imported torch). A world size whose ranks cannot
all be resident (measured rank memory × ranks above the memory available now) would swap or
be killed by the kernel mid-run; one with far more ranks than cores (more than
:data:`RANKS_PER_CORE` per core) spends its cases waiting for the CPU, and Gloo's deadlines
then fire on a correct candidate. Both are refused before any rank starts, the memory check
once the rank size is measured (before the ranks are forked).
"""
from __future__ import annotations

import os

from ddp_conformance.errors import UsageError

#: More ranks than this per core are refused: 16 ranks on 2 cores run (measured: the world
#: size 16 catalog ends), 64 took 192 s only to start.
RANKS_PER_CORE = 8
ADVICE = "pass --allow-oversubscribe to run anyway"


def check_cores(world_size: int, allow: bool, cores: int | None = None) -> None:
    """:class:`UsageError` when ``world_size`` ranks are more than :data:`RANKS_PER_CORE`
    per core of this machine (``cores``: os.cpu_count()), unless ``allow``."""
    cores = cores or os.cpu_count() or 1
    if not allow and world_size > RANKS_PER_CORE * cores:
        raise UsageError(f"--world-size {world_size}: {world_size} ranks on {cores} cores is more "
                         f"than {RANKS_PER_CORE} per core; {ADVICE}")


def check_memory(world_size: int, rank_mib: float, allow: bool,
                 available_mib: float | None = None) -> None:
    """:class:`UsageError` when ``world_size`` ranks of ``rank_mib`` each exceed the memory
    available now (``available_mib``: /proc/meminfo's MemAvailable; unknown: no check),
    unless ``allow``."""
    available_mib = available() if available_mib is None else available_mib
    if allow or available_mib <= 0 or rank_mib <= 0:
        return
    needed = world_size * rank_mib
    if needed > available_mib:
        raise UsageError(f"--world-size {world_size}: {world_size} ranks of {rank_mib:.0f} MiB "
                         f"(measured) need {needed / 1024:.1f} GiB, {available_mib / 1024:.1f} "
                         f"GiB available; {ADVICE}")


def available() -> float:
    """MemAvailable in MiB (0.0 where /proc/meminfo does not say)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return 0.0
