"""Fuzz's finding rate, one tree against another: defective DDPs, the same seeds, side by side.

    python benchmarks/fuzz_rate.py --before DIR --before-python PY [--budget 60]
        [--seed 0 --seed 1 ...] [--candidate SPEC ...] [--applicable SPEC]
        [--applicable-budget 90]

DIR and PY, for the fuzz of e5fedcf (before it drew only what the candidate supports)::

    git worktree add --detach /tmp/fuzz-before e5fedcf
    python -m venv --system-site-packages /tmp/venv-fuzz-before
    /tmp/venv-fuzz-before/bin/pip install --no-deps -e /tmp/fuzz-before

For every candidate and seed, ``ddp-conformance fuzz --candidate SPEC --seed S --budget B
--shrink-budget 1s`` runs once with the code of DIR (a checkout of the commit to compare
with) and once with this tree's, one right after the other, each in its own process started
in its tree's directory with that tree first on ``PYTHONPATH``. PY is a Python where DIR is
installed (``pip install --no-deps -e DIR`` in a venv of its own: the catalog's package,
``ddp_conformance_suites``, is found through the installation); this tree runs with the
Python running this script. Each process says where its two packages come from, and a run
from the wrong tree stops the benchmark. Without ``--keep-going`` a run stops at its first finding: what is
timed is the fuzzing until the candidate's failure is found (from the start of the
scenario loop to the ``found:`` line; the rank pool's start and the shrinking are not
counted), or the whole budget where nothing is found. The findings per minute of each tree
are its runs that found something over the minutes they fuzzed in all.

Then the share of generated scenarios a plain hand-written DDP can run at all (not N/A):
``fuzz --candidate SPEC --keep-going`` for ``--applicable-budget`` seconds, both trees.

Prints a Markdown table (candidate, seed; each tree's time to the finding and scenarios
run), the totals (findings per minute in each tree and their ratio) and the applicable
shares. Exit status 1 when a run ends without fuzz's summary line.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Defective DDPs whose defect takes fuzz more than a scenario or two to meet (a defect
#: every scenario shows, such as ``tests.defective:SumsWithoutDividing``, is found by the
#: first scenario in either tree): five of tests/defective.py (torch's DDP with one defect)
#: and three hand-written ones that lack most of DDP's features.
CANDIDATES = (
    "tests.defective:NeverBroadcastsBuffers",
    "tests.defective:JoinHookDoesNotShadow",
    "tests.defective:SyncsInsideNoSync",
    "tests.defective:AcceptsSecondCommHook",
    "tests.defective:SetsStaticGraphLate",
    "tests.newcomers:NewcomerDDP",
    "tests.flat_buffer:ReducesBufferTwice",
    "tests.beyond_torch:ReducesFloat32Only",
)

#: Runs ``ddp-conformance`` (``python -m ddp_conformance``) with three lines more on stderr:
#: where the package and the catalog come from, and the monotonic clock (one clock for
#: every process of the machine) when the fuzz loop starts. Nothing else is changed.
CLOCK = """\
import sys, time
import ddp_conformance, ddp_conformance_suites, ddp_conformance.fuzz as fuzz
from ddp_conformance.cli import main
print("fuzz_rate: package " + ddp_conformance.__file__, file=sys.stderr, flush=True)
print("fuzz_rate: suites " + ddp_conformance_suites.__path__[0], file=sys.stderr, flush=True)
loop = fuzz.Fuzzer.run
def run(self):
    print(f"fuzz_rate: loop starts at {time.monotonic():.3f}", file=sys.stderr, flush=True)
    return loop(self)
fuzz.Fuzzer.run = run
sys.exit(main(sys.argv[1:]))
"""

SUMMARY = re.compile(r"(\d+) scenarios in (\d+)s \([\d.]+/s\); (\d+) passed, (\d+) N/A, "
                     r"(\d+) set aside, (\d+) failing")


@dataclass
class Run:
    """One fuzz process: what it found and when."""

    tree: str
    found_after_s: float | None  # seconds of fuzzing until the ``found:`` line
    scenarios: int
    not_applicable: int
    set_aside: int
    fuzzed_s: float  # fuzzing time counted for the rate: found_after_s, else the budget

    def cell(self) -> str:
        if self.found_after_s is None:
            return f"not found ({self.scenarios} scenarios)"
        return f"{self.found_after_s:.1f} s ({self.scenarios} scenarios)"


def fuzz(tree: str, python: str, args: list[str], budget_s: float) -> Run:
    """Run ``fuzz ARGS`` with the code of ``tree`` (``python`` has it installed); a clear
    exit when it does not finish or another tree's code ran."""
    with tempfile.TemporaryDirectory(prefix="fuzz-rate-") as reports:
        cmd = [python, "-c", CLOCK, "fuzz", *args, "--report-dir", reports]
        env = dict(os.environ, PYTHONPATH=tree)
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        lines, loop_start, found_at = [], None, None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("fuzz_rate: loop starts at ") and loop_start is None:
                loop_start = float(line.split()[-1])
            elif line.startswith("found: ") and found_at is None:
                found_at = time.monotonic()
        proc.wait(timeout=60)
    text = "".join(lines)
    package = os.path.join(tree, "ddp_conformance", "__init__.py")
    own = (f"fuzz_rate: package {package}\n" in text
           and f"fuzz_rate: suites {os.path.join(tree, 'suites')}\n" in text)
    match = SUMMARY.search(text)
    if not own or match is None or loop_start is None:
        sys.exit(f"fuzz_rate: no summary from {' '.join(args)} in {tree} (exit "
                 f"{proc.returncode}), or not its own code:\n{text[-3000:]}")
    ran, _, _, na, aside, _ = (int(g) for g in match.groups())
    found = None if found_at is None else found_at - loop_start
    return Run(tree, found, ran, na, aside, budget_s if found is None else found)


def rate(runs: list[Run]) -> tuple[int, float, float]:
    """Findings, minutes fuzzed, findings per minute."""
    found = sum(r.found_after_s is not None for r in runs)
    minutes = sum(r.fuzzed_s for r in runs) / 60
    return found, minutes, found / minutes if minutes else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--before", required=True, help="the checkout to compare with")
    parser.add_argument("--before-python", required=True,
                        help="a Python with --before installed (pip install --no-deps -e)")
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of fuzzing per run")
    parser.add_argument("--seed", type=int, action="append", help="repeatable (default 0 1)")
    parser.add_argument("--candidate", action="append", help="repeatable (default: CANDIDATES)")
    parser.add_argument("--applicable", default="tests.newcomers:NewcomerDDP",
                        help="the plain hand-written DDP of the applicable share")
    parser.add_argument("--applicable-budget", type=float, default=90.0,
                        help="seconds of its fuzz run (0: skip)")
    args = parser.parse_args(argv)
    trees = {"before": os.path.abspath(args.before), "after": ROOT}
    pythons = {"before": args.before_python, "after": sys.executable}
    seeds, candidates = args.seed or [0, 1], args.candidate or list(CANDIDATES)
    started, rows = time.monotonic(), []
    runs: dict[str, list[Run]] = {name: [] for name in trees}
    for spec in candidates:
        for seed in seeds:
            pair = {}
            for name, tree in trees.items():  # interleaved: before, after, before, after...
                pair[name] = fuzz(tree, pythons[name], ["--candidate", spec, "--seed", str(seed), "--budget",
                                         f"{args.budget:g}s", "--shrink-budget", "1s"],
                                  args.budget)
                runs[name].append(pair[name])
            rows.append(f"| {spec.split('.', 1)[-1]} | {seed} | {pair['before'].cell()} | "
                        f"{pair['after'].cell()} |")
            print(rows[-1], flush=True)
    print("\n| candidate | seed | before: found after | after: found after |\n|---|---|---|---|")
    print("\n".join(rows))
    totals = {name: rate(r) for name, r in runs.items()}
    for name, (found, minutes, per_minute) in totals.items():
        print(f"{name}: {found} of {len(runs[name])} found in {minutes:.1f} min of fuzzing: "
              f"{per_minute:.2f} findings per minute")
    if totals["before"][2]:
        print(f"findings per minute, after / before: {totals['after'][2] / totals['before'][2]:.2f}")
    print(f"budget {args.budget:g} s per run, seeds {', '.join(map(str, seeds))}; "
          f"{time.monotonic() - started:.0f} s")
    if args.applicable_budget > 0:
        for name, tree in trees.items():
            run = fuzz(tree, pythons[name], ["--candidate", args.applicable, "--seed", "0", "--budget",
                              f"{args.applicable_budget:g}s", "--shrink-budget", "1s",
                              "--keep-going"], args.applicable_budget)
            share = 1 - run.not_applicable / run.scenarios if run.scenarios else 0.0
            print(f"{name}: {args.applicable}: {run.scenarios} scenarios, "
                  f"{run.not_applicable} N/A, {run.set_aside} set aside: "
                  f"{share:.1%} applicable", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
