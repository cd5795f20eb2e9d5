"""How long the command line takes to answer ``--help`` and a usage error, this checkout
against a baseline, interleaved.

    pip install --no-deps --target /tmp/basepkgs <older checkout>   # or a tree with .shim/
    python benchmarks/cli_startup.py --baseline /tmp/basepkgs [--repeats 7]

Each repeat runs every command line below once from this checkout and once from the
baseline (``PYTHONPATH`` pointing at it), back to back, in a fresh interpreter each, and
prints per command line the median wall time of each tree and their ratio (the machine is
noisy: the ratio of one run is the figure, not the seconds).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ["--help", "run --help", "fuzz --help", "run --world-size 0",
            "fuzz --candidate a:A --candidate b:B"]


def seconds(pythonpath: str, command: str) -> float:
    """Wall time of ``python -m ddp_conformance COMMAND`` with ``pythonpath`` first, run
    from a directory outside both trees (``-m`` puts the current directory first)."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "ddp_conformance", *command.split()], env=env,
                   cwd=tempfile.gettempdir(), capture_output=True, timeout=120, check=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="PYTHONPATH of the baseline tree")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    here = os.pathsep.join([str(ROOT), str(ROOT / ".shim")])
    times: dict[str, dict[str, list[float]]] = {c: {"this": [], "baseline": []}
                                                for c in COMMANDS}
    for _ in range(args.repeats):
        for command in COMMANDS:
            times[command]["this"].append(seconds(here, command))
            times[command]["baseline"].append(seconds(args.baseline, command))
    rows = []
    for command, both in times.items():
        this, base = statistics.median(both["this"]), statistics.median(both["baseline"])
        rows.append([f"ddp-conformance {command}", f"{base:.2f}", f"{this:.2f}",
                     f"{base / this:.1f}x"])
    print(tabulate(rows, ["command line", "baseline s", "this s", "baseline / this"]))
    print(f"median of {args.repeats}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
