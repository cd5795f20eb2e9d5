"""A probe run on every rank between repeats (``--repeat``): how much memory it holds."""
from __future__ import annotations


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
