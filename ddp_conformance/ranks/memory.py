"""How much memory a rank holds: a probe run on every rank between repeats (``--repeat``),
and the reading the rank's hygiene takes after every job."""
from __future__ import annotations

import os


def rank_memory(rank: int, world_size: int) -> tuple[float, float]:
    """(resident MiB, peak resident MiB) of this rank process, from /proc/self/status."""
    values: dict[str, float] = {}
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = float(rest.split()[0]) / 1024.0
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        return peak, peak
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def resident_mib() -> float:
    """This process's resident memory in MiB now, from /proc/self/statm (a few
    microseconds: one short line); 0.0 where there is no /proc."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
