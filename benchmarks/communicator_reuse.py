"""What keeping the default group's communicator across jobs saves, side by side in one run.

Two runners on the same backend, world size and candidate, one keeping the communicator
(the default, :mod:`ddp_conformance.ranks.communicator`), one creating it per job (as
before). For every catalog scenario the two alternate (A B, B A, ...) ``--repeats`` times;
the cost of a case is its wall time as the runner sees it (rank work, transfers, oracle,
checks). Reported: the median case time of each, the ratio of the totals, and how many
communicator generations each pool started. ``--versus`` adds a third runner on another
backend (NCCL's per-case cost next to Gloo's, in the same run).

    python benchmarks/communicator_reuse.py [--world-size 2] [--repeats 3] [--backend gloo]
    python benchmarks/communicator_reuse.py --backend nccl --world-size 1 --versus gloo/cpu
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
    parser.add_argument("--versus", default="", metavar="BACKEND/DEVICE",
                        help="also time the cases on this backend and device (e.g. gloo/cpu "
                             "next to --backend nccl), communicator kept")
    parser.add_argument("--candidate", default="torch")
    args = parser.parse_args()
    arms = [("kept", args.backend, args.device, True),
            ("per job", args.backend, args.device, False)]
    if args.versus:
        backend, _, device = args.versus.partition("/")
        arms.append((f"{args.versus} kept", backend, device or "cpu", True))
    runners = {}
    for name, backend, device, reuse in arms:
        config = RunConfig(world_size=args.world_size, backend=backend, device=device)
        pool = RankPool(args.world_size, backend, device, reuse_communicators=reuse)
        runners[name] = Runner(config, pool=pool)
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
                    assert result.verdict in (Verdict.PASS, Verdict.NA), result.summary_line()
                    times[name].append(result.duration_s)
                order.reverse()
        created = {name: r.pool.communicators.started  # type: ignore[attr-defined]
                   for name, r in runners.items()}
    finally:
        for runner in runners.values():
            runner.close()
    kept = times["kept"]
    print(f"{args.backend}/{args.device}, world size {args.world_size}, candidate "
          f"{args.candidate}: {len(kept)} cases each")
    for name, values in times.items():
        note = ("one communicator per traced job" if name == "per job"
                else f"{created[name]} generations")
        ratio = statistics.median(v / k for v, k in zip(values, kept, strict=True))
        print(f"  {name:16s} median {statistics.median(values) * 1e3:6.1f} ms, total "
              f"{sum(values):6.2f} s, total / kept {sum(values) / sum(kept):.3f}, median "
              f"paired ratio {ratio:.3f} ({note})")


if __name__ == "__main__":
    main()
