"""The bench's statistics (:mod:`ddp_conformance.bench.stats`), on values whose answers
are known exactly."""
from __future__ import annotations

import math
import statistics
import subprocess
import sys

import pytest

from ddp_conformance.bench.stats import (
    algbw,
    busbw,
    busy_time,
    flat,
    median_ci,
    quartiles,
    relative_spread,
    round_ratios,
)


def test_quartiles_are_median_and_inclusive_quartiles() -> None:
    assert quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0, 4.0)
    assert quartiles([5.0, 1.0, 4.0, 2.0, 3.0]) == (3.0, 2.0, 4.0)  # order does not matter
    assert quartiles([1.0, 2.0, 3.0, 4.0]) == (2.5, 1.75, 3.25)
    assert quartiles([7.0]) == (7.0, 7.0, 7.0)
    assert all(math.isnan(x) for x in quartiles([]))


def test_flat_and_per_round_ratios() -> None:
    assert flat([[1.0, 2.0], [], [3.0]]) == [1.0, 2.0, 3.0]
    assert flat([]) == []
    # each round's median over the baseline's median in the same round
    assert round_ratios([[2.0, 2.0], [3.0, 3.0]], [[1.0, 1.0], [2.0, 2.0]]) == [2.0, 1.5]
    assert round_ratios([[1.0, 3.0, 100.0]], [[1.0, 1.5, 2.0]]) == [2.0]  # medians, not means


def test_relative_spread_is_iqr_over_median() -> None:
    assert relative_spread((2.0, 1.5, 2.5)) == 0.5
    assert relative_spread(quartiles([1.0, 2.0, 3.0, 4.0, 5.0])) == pytest.approx(2 / 3)
    assert math.isnan(relative_spread((0.0, 0.0, 0.0)))


def test_median_ci_bootstraps_the_median() -> None:
    assert median_ci([4.0, 4.0, 4.0]) == (4.0, 4.0)  # no noise: no interval
    assert median_ci([3.0]) == (3.0, 3.0)
    assert all(math.isnan(x) for x in median_ci([]))
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    lo, hi = median_ci(values)
    assert min(values) <= lo <= statistics.median(values) <= hi <= max(values)
    assert lo < hi
    assert median_ci(values) == (lo, hi)                   # seeded: reproducible
    # the interval of a constant shift moves with it
    assert median_ci([v + 10 for v in values]) == (lo + 10, hi + 10)


def test_bandwidth_as_nccl_tests_define_it() -> None:
    assert algbw(1e9, 0.5) == 2e9
    assert busbw(1e9, 1.0, 4) == 1.5e9    # 1 GB in 1 s on 4 ranks: x 2 (n-1)/n = 1.5
    assert busbw(1e9, 1.0, 2) == 1e9      # 2 (n-1)/n = 1 for n = 2
    assert busbw(1e9, 1.0, 8) == 1.75e9
    assert busbw(1e9, 2.0, 4) == 0.75e9
    assert busbw(1e9, 1.0, 1) == 0.0      # nothing crosses a wire
    with pytest.raises(ValueError, match="time must be positive"):
        algbw(1.0, 0.0)
    with pytest.raises(ValueError, match="time must be positive"):
        busbw(1.0, -1.0, 2)
    with pytest.raises(ValueError, match="world size"):
        busbw(1.0, 1.0, 0)


def test_busy_time_is_the_length_of_the_union_of_intervals() -> None:
    assert busy_time([]) == 0.0
    assert busy_time([(1.0, 3.0)]) == 2.0
    assert busy_time([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == 3.0  # overlap counted once
    assert busy_time([(3.0, 4.0), (0.0, 1.0), (0.5, 2.0)]) == 3.0  # in any order
    assert busy_time([(0.0, 10.0), (2.0, 3.0), (4.0, 5.0)]) == 10.0  # nested
    assert busy_time([(0.0, 1.0), (1.0, 2.0)]) == 2.0              # touching
    assert busy_time([(0.0, 1.0), (2.0, 3.0), (4.0, 6.0)]) == 4.0  # disjoint


def test_stats_do_not_import_torch() -> None:
    """The report imports them; rendering a report must not need torch."""
    code = ("import sys; import ddp_conformance.bench.stats; import ddp_conformance.report.timing; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
