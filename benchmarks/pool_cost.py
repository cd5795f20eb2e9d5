"""What the persistent rank pool saves: cost per scenario, persistent vs fresh, side by side.

For every catalog scenario (candidate ``torch``, Gloo, CPU), interleaved in one run: one case
on a fresh pool (new rank processes, as torch's ``MultiProcessTestCase`` does), then
``--repeats`` cases on the persistent pool. The cost of a case is its wall time as the
runner sees it (rank work, transfers, oracle and checks; for fresh, the process starts
too). The persistent pool's own start is reported once, apart.

With ``--start WORLD_SIZE ...`` it measures instead what starting ranks costs, per world
size: the zygote's start (once per pool: an interpreter, torch, its lazy imports, the
candidates ``torch`` and ``reference``), the ranks' start after it (forks, store connections,
Ready), and the hand-over that replaces one crashed rank (a fork); and, for the smallest
world size, the same pool without a zygote (every rank a process of its own), side by side.

    python benchmarks/pool_cost.py [--world-size 2] [--repeats 5]
    python benchmarks/pool_cost.py --start 2 8 16
"""
from __future__ import annotations

import argparse
import statistics
import time

from tabulate import tabulate

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.ranks.messages import Job
from ddp_conformance.ranks.pool import RankPool
from ddp_conformance.runner import Runner


def start_costs(world_size: int, fork: bool) -> list[str]:
    """One pool's start and one replacement: [world size, path, zygote s, ranks s, total
    s, replacing one crashed rank s]."""
    pool = RankPool(world_size, preload=["torch", "reference"], fork=fork, spare=False)
    try:
        started = time.perf_counter()
        pool.start()
        total = time.perf_counter() - started
        out = pool.run(Job("call", "", 60, function="tests.test_pool:exit_on_rank1",
                           trace=False), 60)
        assert out.status == "crash", out.status
        replaced = pool.run(Job("call", "", 60, function="tests.test_pool:allreduce_rank",
                                args=(0.0,), trace=False), 60)
        assert replaced.status == "done", replaced.status
    finally:
        pool.close()
    return [str(world_size), "fork (zygote)" if fork else "process per rank",
            f"{pool.start_costs['zygote']:.2f}", f"{pool.start_costs['ranks']:.2f}",
            f"{total:.2f}", f"{replaced.handover_s:.2f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--start", type=int, nargs="+", metavar="WORLD_SIZE",
                        help="measure starting ranks at these world sizes instead")
    args = parser.parse_args()
    if args.start:
        rows = [start_costs(min(args.start), fork=False)]
        rows += [start_costs(size, fork=True) for size in args.start]
        print(tabulate(rows, ["world size", "ranks", "zygote s", "ranks s (after the zygote)",
                              "pool start s", "replacing a crashed rank s"], tablefmt="github"))
        return
    persistent = Runner(RunConfig(world_size=args.world_size))
    fresh = Runner(RunConfig(world_size=args.world_size, pool="fresh"))
    started = time.perf_counter()
    persistent.pool.start()
    startup = time.perf_counter() - started
    rows, ratios, fresh_all, persistent_all = [], [], [], []
    try:
        for scenario in load_catalog():
            if scenario.unsupported_world_size(args.world_size):
                continue
            fresh_result = fresh.run_case(scenario, "torch")
            times = []
            for _ in range(args.repeats):
                result = persistent.run_case(scenario, "torch")
                assert result.verdict is Verdict.PASS, result.summary_line()
                times.append(result.duration_s)
            assert fresh_result.verdict is Verdict.PASS, fresh_result.summary_line()
            p = statistics.median(times)
            fresh_all.append(fresh_result.duration_s)
            persistent_all.append(p)
            ratios.append(fresh_result.duration_s / p)
            rows.append([scenario.id, f"{fresh_result.duration_s:.2f}", f"{p * 1e3:.0f}",
                         f"{min(times) * 1e3:.0f}-{max(times) * 1e3:.0f}",
                         f"{fresh_result.duration_s / p:.0f}x"])
    finally:
        persistent.close()
        fresh.close()
    print(f"world size {args.world_size}; persistent pool start {startup:.2f}s (once)")
    print(tabulate(rows, ["scenario", "fresh (s)", "persistent median (ms)",
                          "persistent range (ms)", "fresh / persistent"], tablefmt="github"))
    print(f"per scenario: fresh median {statistics.median(fresh_all):.2f}s, persistent median "
          f"{statistics.median(persistent_all) * 1e3:.0f}ms; ratio median "
          f"{statistics.median(ratios):.0f}x (min {min(ratios):.0f}x)")


if __name__ == "__main__":
    main()
