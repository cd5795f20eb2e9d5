"""The bench's statistics, in one place (no torch: the report imports them).

Step times: a statistic is (median, q1, q3) (:func:`quartiles`); the spread of a ratio is
over per-round ratios (:func:`round_ratios`: each interleaved round's median of the
candidate over the baseline's in the same round); :func:`median_ci` is a bootstrap
interval of a median (run-to-run noise).

Bandwidth as nccl-tests report it: ``algbw = bytes / time``; for allreduce
``busbw = algbw * 2 (n - 1) / n``: each rank sends and receives 2 (n - 1) / n of the
buffer in a ring, so busbw is comparable with the link speed whatever the world size.
:func:`busy_time` is how long communication was in flight (the union of the
collectives' launch-to-completion intervals).
"""
from __future__ import annotations

import random
import statistics

Stat = tuple[float, float, float]
NAN = float("nan")


def quartiles(values: list[float]) -> Stat:
    """(median, q1, q3) (inclusive quantiles); q1 = q3 = median for fewer than 2 values,
    NaN for none."""
    if not values:
        return (NAN, NAN, NAN)
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return med, q1, q3


def flat(rounds: list[list[float]]) -> list[float]:
    """All values of all rounds, in order."""
    return [t for r in rounds for t in r]


def round_ratios(rounds: list[list[float]], base_rounds: list[list[float]]) -> list[float]:
    """Per interleaved round: median of ``rounds`` over median of ``base_rounds``."""
    return [statistics.median(a) / statistics.median(b) for a, b in zip(rounds, base_rounds, strict=False)]


def median_ci(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% bootstrap interval of the median of ``values`` (resampling the rounds): how far the
    reported median would move from run to run under the noise this run saw."""
    if len(values) < 2:
        return (values[0], values[0]) if values else (NAN, NAN)
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def relative_spread(stat: Stat) -> float:
    """Interquartile range over the median."""
    med, q1, q3 = stat
    return (q3 - q1) / med if med else NAN


def algbw(nbytes: float, seconds: float) -> float:
    """Bytes per second moved from the user's point of view."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return nbytes / seconds


def busbw(nbytes: float, seconds: float, world_size: int) -> float:
    """Allreduce bus bandwidth in bytes per second (nccl-tests' definition):
    ``algbw * 2 (n - 1) / n``."""
    if world_size < 1:
        raise ValueError(f"world size must be positive, got {world_size}")
    return algbw(nbytes, seconds) * 2 * (world_size - 1) / world_size


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end]`` intervals (overlapping ones count once)."""
    total = 0.0
    cur: tuple[float, float] | None = None
    for start, end in sorted(intervals):
        if cur is None or start > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = (start, end)
        else:
            cur = (cur[0], max(cur[1], end))
    if cur is not None:
        total += cur[1] - cur[0]
    return total
