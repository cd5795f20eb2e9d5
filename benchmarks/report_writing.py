"""How long writing a run's report set takes, and how big report.html is: two checkouts
side by side, interleaved, on the same recorded results.

    python benchmarks/report_writing.py RESULTS_DIR OLD_CHECKOUT NEW_CHECKOUT [--rounds 5]

Each round renders ``RESULTS_DIR/results.jsonl`` once with each checkout (A B A B ..., a
fresh process each, imports done before the clock starts) into a temporary directory, and
prints per checkout the median seconds of ``render`` (summary.md, junit.xml, report.html:
what a run does between its last case and its matrix), the report.html bytes, and the
ratio of the medians. A checkout's ``suites/`` and ``reference/`` are imported through a
shim of its own, as ``.shim/`` does in a worktree.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

#: Run in a fresh process per (round, checkout): prints {"s": seconds, "bytes": n}.
RENDER = """
import json, os, sys, time
from ddp_conformance.report import load_results, render
import ddp_conformance.report.html, ddp_conformance.report.junit, ddp_conformance.report.markdown
run = load_results(sys.argv[1])
started = time.perf_counter()
render(sys.argv[2], run.info, run.results, run.notes)
took = time.perf_counter() - started
print(json.dumps({"s": took, "bytes": os.path.getsize(os.path.join(sys.argv[2], "report.html"))}))
"""


def shim(checkout: str, where: str) -> str:
    """A directory that imports ``ddp_reference`` and ``ddp_conformance_suites`` from
    ``checkout``; returns the PYTHONPATH for it."""
    os.makedirs(where, exist_ok=True)
    for name, target in (("ddp_reference", "reference"), ("ddp_conformance_suites", "suites")):
        link = os.path.join(where, name)
        if not os.path.islink(link):
            os.symlink(os.path.join(os.path.abspath(checkout), target), link)
    return os.pathsep.join([os.path.abspath(checkout), where])


def render_once(results: str, pythonpath: str, out: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    # cwd away from any checkout: ``python -c`` puts the cwd before PYTHONPATH.
    proc = subprocess.run([sys.executable, "-c", RENDER, os.path.abspath(results), out], env=env,
                          cwd=os.path.dirname(out), capture_output=True, text=True, timeout=600,
                          check=True)
    data: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: shim(path, os.path.join(tmp, f"shim-{name}"))
                 for name, path in (("old", args.old), ("new", args.new))}
        seen: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
        for i in range(args.rounds):
            for name in ("old", "new"):
                out = os.path.join(tmp, f"{name}-{i}")
                os.makedirs(out)
                seen[name].append(render_once(args.results, paths[name], out))
    medians = {name: statistics.median(x["s"] for x in runs) for name, runs in seen.items()}
    for name, runs in seen.items():
        each = ", ".join(f"{x['s']:.2f}" for x in runs)
        print(f"{name}: render median {medians[name]:.2f}s (runs {each}), report.html "
              f"{int(runs[0]['bytes']):,} bytes")
    print(f"new / old render time: {medians['new'] / medians['old']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
