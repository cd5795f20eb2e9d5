"""The mutant zoo's table for the README: which scenario and check catch each mutant.

    python benchmarks/mutant_zoo.py            # the table, then the count and the time
    python benchmarks/mutant_zoo.py --width 100

Runs the same hunt as ``tests/test_mutant_zoo.py`` (``tests/mutants/hunt.py``) and prints
Markdown for the README's "Proof of power: the mutant zoo": one table with a row per
mutant (the defect is the mutant's docstring, less its "Caught by ..." sentence, which the
table's columns say), then "N of N mutants caught; hunt took S s". Known gaps
(``tests.mutants.GAP_MODULES``, none today) are hunted too and listed after it, if any.
Exit status 1 when a mutant is not caught or the reference fails a scenario that caught one.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def defect(doc: str) -> str:
    """The docstring without its "Caught by ..." sentences (the table's columns say it)."""
    return re.sub(r"\s*Caught by .*?\.(?=\s|$)", "", doc).strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--width", type=int, default=140, help="evidence column width")
    parser.add_argument("--timeout", type=float, default=10.0, help="per-case deadline (s)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)  # candidate specs tests.mutants.* import from the repository root
    sys.path.insert(0, ROOT)
    from tests.mutants import gap_mutants, zoo
    from tests.mutants.hunt import ZooRun, hunt, table

    mutants, gaps = zoo(), gap_mutants()
    run = hunt([*mutants, *gaps], timeout_s=args.timeout)
    zoo_run = ZooRun({m: run.catches[m] for m in mutants}, run.reference, run.seconds)
    caught = sum(c.result is not None for c in zoo_run.catches.values())
    print(table(zoo_run, {m: defect(d) for m, d in mutants.items()}, args.width))
    print(f"\n{caught} of {len(mutants)} mutants caught; hunt took {run.seconds:.0f} s "
          f"({os.cpu_count()}-core machine).")
    if gaps:
        gap_run = ZooRun({m: run.catches[m] for m in gaps}, run.reference, run.seconds)
        print("\nKnown gaps (no scenario catches them today; the docstring says what would):\n")
        print(table(gap_run, {m: d.split(". ")[0] + "." for m, d in gaps.items()}, args.width))
    bad = [k for k, r in run.reference.items() if r.verdict.name != "PASS"]
    if bad:
        print(f"\nWARNING: the reference does not pass {bad}")
    return 0 if caught == len(mutants) and not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
