"""The bug history's full matrix: every guarding scenario on torch and the reference at
world sizes 1-4, and every historical mutant against its bug's scenarios at 2-4.

    python benchmarks/bug_history.py                 # world sizes 1 2 3 4
    python benchmarks/bug_history.py --world-sizes 2 3

``tests/test_bug_history.py`` runs the cheap slice in the default test run (the mutants at
the one world size their scenarios are defined for first); this is the whole matrix. Per
world size one runner; a scenario not defined at a world size is N/A there (its reason is
printed). Prints one line per (scenario, candidate) verdict that is not the expected one,
then a table of counts per world size. Exit status 1 when torch or the reference does not
pass a guarding scenario that is defined at the world size, or a mutant is not caught at
any world size where its scenarios are defined.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORRECT = ("torch", "reference")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--timeout", type=float, default=30.0, help="per-case deadline (s)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)  # candidate specs tests.mutants.* import from the repository root
    sys.path.insert(0, ROOT)
    from ddp_conformance.catalog.history import HISTORY
    from ddp_conformance.catalog.loader import load_catalog
    from ddp_conformance.config import RunConfig
    from ddp_conformance.judge.verdict import Verdict
    from ddp_conformance.runner import Runner
    from tests.test_bug_history import CAUGHT, MUTANTS

    catalog = {s.id: s for s in load_catalog()}
    guarded = {bug.ref: bug for bug in HISTORY if bug.scenarios}
    scenario_ids = sorted({s for bug in guarded.values() for s in bug.scenarios})
    bad, caught_somewhere, rows = [], set(), []
    for ws in args.world_sizes:
        started = time.monotonic()
        defined = [catalog[s] for s in scenario_ids
                   if not catalog[s].unsupported_world_size(ws)]
        counts = {"PASS": 0, "N/A": len(scenario_ids) - len(defined), "caught": 0,
                  "missed": 0}
        config = RunConfig(candidates=[*CORRECT, *MUTANTS], world_size=ws,
                           timeout_s=args.timeout)
        with Runner(config) as runner:
            for scenario in defined:
                for candidate in CORRECT:
                    result = runner.run_case(scenario, candidate)
                    if result.verdict is Verdict.PASS:
                        counts["PASS"] += 1
                    else:
                        bad.append((ws, scenario.id, candidate))
                        print(f"world size {ws}: {scenario.id}[{candidate}] "
                              f"{result.verdict.name}: {result.summary_line()}")
            for spec, ref in MUTANTS.items():
                mine = [s for s in defined if s.id in guarded[ref].scenarios]
                if not mine:
                    continue
                verdicts = [runner.run_case(s, spec).verdict for s in mine]
                if any(v in CAUGHT for v in verdicts):
                    counts["caught"] += 1
                    caught_somewhere.add(spec)
                else:
                    counts["missed"] += 1
                    print(f"world size {ws}: {spec} ({ref}) not caught by "
                          f"{[s.id for s in mine]}: {[v.name for v in verdicts]}")
        rows.append((ws, counts, time.monotonic() - started))
    print("\n| world size | torch + reference PASS | N/A (not defined there) | mutants caught "
          "| mutants missed | seconds |\n|---|---|---|---|---|---|")
    for ws, c, seconds in rows:
        print(f"| {ws} | {c['PASS']} | {c['N/A']} | {c['caught']} | {c['missed']} | "
              f"{seconds:.0f} |")
    never = sorted(set(MUTANTS) - caught_somewhere)
    print(f"\n{len(scenario_ids)} guarding scenarios, {len(MUTANTS)} mutants; "
          f"never caught: {never or 'none'}; torch/reference not passing: {bad or 'none'}")
    return 1 if bad or never else 0


if __name__ == "__main__":
    raise SystemExit(main())
