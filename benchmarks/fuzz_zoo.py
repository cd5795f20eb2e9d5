"""Fuzz alone against the mutant zoo: is every mutant found, how fast, how small the shrunk scenario.

    python benchmarks/fuzz_zoo.py --budget 60 --shrink-budget 30      # the README's table

One session (one rank pool) for the whole zoo; torch's verdicts on generated scenarios are
shared between the mutants (the same seed draws the same scenarios for each). Prints a
Markdown table: mutant, found or not, seconds and scenarios until found, shrink runs, the
shrunk scenario's size (fields it sets beyond the model) and the literal; then the totals.
Exit status 1 when a mutant is not found within the budget.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of fuzzing per mutant")
    parser.add_argument("--shrink-budget", type=float, default=30.0, help="seconds of shrinking")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", help="mutant spec substring (repeatable)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    sys.path.insert(0, ROOT)
    from ddp_conformance.catalog.strategies import scenario_literal
    from ddp_conformance.config import RunConfig
    from ddp_conformance.fuzz import Fuzzer
    from ddp_conformance.session import Session
    from tests.mutants import zoo

    mutants = [m for m in zoo() if not args.only or any(o in m for o in args.only)]
    config = RunConfig(candidates=["torch", *mutants], timeout_s=20.0)
    shared: dict = {}
    rows, missed, started = [], [], time.monotonic()
    with Session(config) as session:
        session.start()
        for spec in mutants:
            fuzzer = Fuzzer(session, spec, args.budget, args.seed, args.shrink_budget,
                            verdicts=shared)
            t0 = time.monotonic()
            result = fuzzer.run()
            name = spec.split(":")[-1]
            if not result.findings:
                missed.append(name)
                rows.append(f"| {name} | not found | {result.ran} | - | - | - |")
            else:
                f = result.findings[0]
                size = len(scenario_literal(f.shrunk).split(", ")) - 2
                rows.append(f"| {name} | {time.monotonic() - t0 - 0:.1f} s | {result.ran} | "
                            f"{f.shrink_runs} | {size} | `{f.literal()}` |")
            print(rows[-1], flush=True)
    print()
    print("| mutant | found after | scenarios | shrink runs | shrunk size | shrunk scenario |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n{len(mutants) - len(missed)} of {len(mutants)} mutants found by fuzz alone "
          f"(budget {args.budget:.0f} s each, seed {args.seed}); {time.monotonic() - started:.0f} s"
          + (f"; not found: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
