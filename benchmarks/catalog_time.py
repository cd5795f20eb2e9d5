"""Whole-catalog wall time, this checkout against a baseline, interleaved.

    pip install --no-deps --target /tmp/basepkgs <older checkout>
    python benchmarks/catalog_time.py --baseline /tmp/basepkgs [--repeats 3] [--world-size 2]
    python benchmarks/catalog_time.py --coverage torch.nn.parallel.distributed [--coverage ...]

Each repeat runs ``ddp-conformance run --candidate torch --candidate reference`` once from
this checkout and once from the baseline (``PYTHONPATH`` pointing at an installed copy of
it, so that its catalog, reference and harness are all its own), back to back, and prints
per tree the case count, the verdicts and the wall time of every repeat (the machine is
noisy: compare the two columns of one row, and the medians). With ``--coverage TARGET``
(repeatable) instead of a baseline, the second tree is this checkout again with
``--coverage TARGET`` (what measuring costs), and the ratio of the medians is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent


def run_once(pythonpath: str | None, world_size: int, extra: list[str] | None = None
             ) -> tuple[float, Counter[str]]:
    reports = tempfile.mkdtemp(prefix="catalog-time-")
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, "-m", "ddp_conformance", "run", "--candidate", "torch",
           "--candidate", "reference", "--world-size", str(world_size), "--report-dir", reports,
           *(extra or [])]
    started = time.monotonic()
    subprocess.run(cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, timeout=1800,
                   check=False)
    wall = time.monotonic() - started
    verdicts: Counter[str] = Counter()
    with open(os.path.join(reports, "results.jsonl"), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row.get("type") == "result":
                verdicts[row["verdict"]] += 1
    shutil.rmtree(reports, ignore_errors=True)
    return wall, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--baseline", help="an installed older checkout")
    group.add_argument("--coverage", action="append", metavar="TARGET",
                       help="compare with this checkout run with --coverage TARGET")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    rows = []
    other = "baseline" if args.baseline else "this --coverage"
    extra = [a for t in args.coverage or [] for a in ("--coverage", t)]
    walls: dict[str, list[float]] = {"this": [], other: []}
    for i in range(args.repeats):
        for name, path, more in (("this", None, None), (other, args.baseline, extra)):
            wall, verdicts = run_once(path, args.world_size, more)
            walls[name].append(wall)
            rows.append([i, name, sum(verdicts.values()),
                         ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())), f"{wall:.1f}"])
    print(tabulate(rows, headers=["repeat", "tree", "cases", "verdicts", "wall s"]))
    for name, values in walls.items():
        print(f"{name}: median {statistics.median(values):.1f} s")
    ratios = [b / a for a, b in zip(walls["this"], walls[other], strict=True)]
    print(f"{other} / this: median ratio {statistics.median(ratios):.2f} "
          f"({', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
