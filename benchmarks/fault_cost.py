"""What hangs and faults cost: the catalog's wall time for candidates that hang or raise,
next to torch's DDP, measured side by side (and next to an older checkout of the harness).

    python benchmarks/fault_cost.py [--baseline DIR] [--only NAME ...]

Each run is ``python -m ddp_conformance run --candidate SPEC [-k K]`` in a fresh process,
from this checkout (and, with ``--baseline DIR``, from the checkout in DIR, interleaved:
this machine is noisy, so the two are measured back to back per candidate). The table
gives the wall time of the whole command (start-up and reports included), the verdicts,
the longest TIMEOUT/ERROR/CRASH case (its duration includes the hand-over of replaced
ranks), and the longest time a desync TIMEOUT took to be diagnosed. The candidates are in
``tests/newcomers.py``, ``tests/defective.py`` and ``tests/mutants/``.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent

#: (name, candidate spec, -k selection or None)
RUNS = [
    ("torch", "torch", None),
    ("newcomer", "tests.newcomers:NewcomerDDP", None),
    ("needs-reset", "tests.newcomers:NeedsReset", None),
    ("raises-on-rank-1", "tests.newcomers:RaisesOnRank1", None),
    ("torch-ddp-raises-on-rank-1", "tests.defective:RaisesOnRank1", None),
    ("join-does-not-shadow", "tests.defective:JoinHookDoesNotShadow", "join"),
    ("join-shadows-nothing", "tests.mutants.join:JoinHookShadowsNothing", "join"),
]
FAULTS = ("TIMEOUT", "ERROR", "CRASH")
#: A desync TIMEOUT's reason ends "(diagnosed after 1.3s)".
DIAGNOSED = re.compile(r"\(diagnosed after ([0-9.]+)s\)")


def run_once(tree: Path, spec: str, keyword: str | None, timeout_s: float) -> dict[str, object]:
    """One ``ddp-conformance run`` from ``tree``: wall time, verdicts, slowest fault."""
    reports = tempfile.mkdtemp(prefix="fault-cost-")
    cmd = [sys.executable, "-m", "ddp_conformance", "run", "--candidate", spec,
           "--report-dir", reports] + (["-k", keyword] if keyword else [])
    env = dict(os.environ, PYTHONPATH=str(tree))
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
    wall = time.monotonic() - started
    verdicts: collections.Counter[str] = collections.Counter()
    worst = (0.0, "")
    diagnosed: list[float] = []
    with open(os.path.join(reports, "results.jsonl"), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row.get("type") != "result":
                continue
            verdicts[row["verdict"]] += 1
            found = DIAGNOSED.search(row.get("reason", ""))
            if found:
                diagnosed.append(float(found.group(1)))
            if row["verdict"] in FAULTS and row["duration_s"] > worst[0]:
                worst = (row["duration_s"], row["verdict"])
    shutil.rmtree(reports, ignore_errors=True)
    return {"wall": wall, "exit": proc.returncode, "verdicts": verdicts, "worst": worst,
            "diagnosed": max(diagnosed, default=None)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="an older checkout to compare with")
    parser.add_argument("--only", nargs="*", help="run only these names")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per run, seconds")
    args = parser.parse_args()
    trees = [("this", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    rows = []
    torch_wall: dict[str, float] = {}
    for name, spec, keyword in RUNS:
        if args.only and name not in args.only:
            continue
        for label, tree in trees:
            r = run_once(tree, spec, keyword, args.timeout)
            if name == "torch":
                torch_wall[label] = float(r["wall"])  # type: ignore[arg-type]
            wall = float(r["wall"])  # type: ignore[arg-type]
            ratio = wall / torch_wall[label] if label in torch_wall else float("nan")
            worst_s, worst_v = r["worst"]  # type: ignore[misc]
            counts = ", ".join(f"{n} {v}" for v, n in sorted(r["verdicts"].items()))  # type: ignore[attr-defined]
            diag = r["diagnosed"]
            rows.append([name, label, f"{wall:.1f}", f"{ratio:.2f}", counts,
                         f"{worst_s:.1f} ({worst_v})" if worst_v else "-",
                         f"{diag:.1f}" if diag is not None else "-"])
            print(tabulate([rows[-1]], tablefmt="plain"), flush=True)
    print()
    print(tabulate(rows, ["run", "harness", "wall s", "x torch", "verdicts",
                          "slowest fault case s", "desync diagnosed after s (max)"],
                   tablefmt="github"))


if __name__ == "__main__":
    main()
