"""What keeping the default group's communicator across jobs saves, side by side in one run.

Two runners on the same backend, world size and candidate, one keeping the communicator
(the default, :mod:`ddp_conformance.ranks.communicator`), one creating it per job (as
before). For every catalog scenario the two alternate (A B, B A, ...) ``--repeats`` times;
the cost of a case is its wall time as the runner sees it (rank work, transfers, oracle,
checks). Reported: the median case time of each, the ratio of the totals, and how many
communicators each pool's ranks created.

    python benchmarks/communicator_reuse.py [--world-size 2] [--repeats 3] [--backend gloo]
"""
from __future__ import annotations

import argparse
import statistics

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.ranks.pool import RankPool
from ddp_conformance.runner import Runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--candidate", default="torch")
    args = parser.parse_args()
    runners = {}
    for reuse in (True, False):
        config = RunConfig(world_size=args.world_size, backend=args.backend, device=args.device)
        pool = RankPool(args.world_size, args.backend, args.device, reuse_communicators=reuse)
        runners["kept" if reuse else "per job"] = Runner(config, pool=pool)
    times: dict[str, list[float]] = {name: [] for name in runners}
    try:
        for runner in runners.values():
            runner.pool.start()
        order = list(runners)
        for scenario in load_catalog():
            if scenario.unsupported_world_size(args.world_size):
                continue
            for _ in range(args.repeats):
                for name in order:
                    result = runners[name].run_case(scenario, args.candidate)
                    assert result.verdict in (Verdict.PASS, Verdict.NA), \
                        result.summary_line()
                    times[name].append(result.duration_s)
                order.reverse()
        created = {name: r.pool.communicators.started  # type: ignore[attr-defined]
                   for name, r in runners.items()}
    finally:
        for runner in runners.values():
            runner.close()
    kept, fresh = times["kept"], times["per job"]
    print(f"{args.backend}/{args.device}, world size {args.world_size}, candidate "
          f"{args.candidate}: {len(kept)} cases each")
    for name, values in times.items():
        note = (f"{created[name]} generations" if name == "kept"
                else "one communicator per traced job")
        print(f"  {name:8s} median {statistics.median(values) * 1e3:6.1f} ms, total "
              f"{sum(values):6.2f} s ({note})")
    print(f"  total per job / kept: {sum(fresh) / sum(kept):.3f}; median of paired ratios "
          f"{statistics.median(f / k for f, k in zip(fresh, kept, strict=True)):.3f}")


if __name__ == "__main__":
    main()
