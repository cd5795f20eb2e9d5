"""Generated scenarios per second: ``ddp-conformance fuzz`` on a few candidates, interleaved.

    python benchmarks/fuzz_throughput.py [--budget 60] [--repeats 2] [--world-size 2]
        [--candidate torch --candidate reference ...]

Each repeat runs ``fuzz --candidate C --budget B --seed 0 --keep-going`` once per
candidate, one after the other (the machine is noisy: compare within a repeat). torch's
own cases are the floor (a torch case is one job, its reference job and the oracle);
``reference`` takes the comparison's reference run (no extra job); any other candidate adds
its own job per scenario: the default third candidate is torch's DDP named as a user's
callable (``torch.nn.parallel:DistributedDataParallel``), which the harness treats as a
candidate of its own. Prints per repeat and candidate: scenarios, scenarios/s, passed,
set aside, failing; then the median rate per candidate.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile

from tabulate import tabulate

FINAL = re.compile(r"(\d+) scenarios in (\d+)s \(([\d.]+)/s\); (\d+) passed, \d+ N/A, "
                   r"(\d+) set aside, (\d+) failing")


def run_once(candidate: str, budget: float, world_size: int) -> tuple[int, float, int, int, int]:
    cmd = [sys.executable, "-m", "ddp_conformance", "fuzz", "--candidate", candidate,
           "--budget", f"{budget:g}s", "--seed", "0", "--keep-going",
           "--world-size", str(world_size)]
    proc = subprocess.run(cmd, cwd=tempfile.gettempdir(), capture_output=True, text=True,
                          timeout=budget + 600, check=False)
    match = FINAL.search(proc.stdout + proc.stderr)
    if match is None:
        raise SystemExit(f"fuzz_throughput: no summary line from {' '.join(cmd)}:\n"
                         f"{(proc.stdout + proc.stderr)[-2000:]}")
    ran, _, rate, passed, aside, failing = match.groups()
    return int(ran), float(rate), int(passed), int(aside), int(failing)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds per fuzz run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--candidate", action="append",
                        help="repeatable (default: torch, reference, "
                             "torch.nn.parallel:DistributedDataParallel)")
    args = parser.parse_args()
    candidates = args.candidate or ["torch", "reference",
                                        "torch.nn.parallel:DistributedDataParallel"]
    rows, rates = [], {c: [] for c in candidates}
    for repeat in range(args.repeats):
        for candidate in candidates:
            ran, rate, passed, aside, failing = run_once(candidate, args.budget, args.world_size)
            rates[candidate].append(rate)
            rows.append([repeat, candidate, ran, f"{rate:.2f}", passed, aside, failing])
            print(tabulate([rows[-1]], tablefmt="plain"), flush=True)
    print()
    print(tabulate(rows, headers=["repeat", "candidate", "scenarios", "per s", "passed",
                                  "set aside", "failing"]))
    for candidate, values in rates.items():
        print(f"{candidate}: median {statistics.median(values):.2f} scenarios/s")


if __name__ == "__main__":
    main()
