"""The sizes of the reproducers a bug report gets: one per failing case of the project's
defective DDPs (``tests/defective.py``), its failed checks known, as ``repro --report-dir``
reads them from a run's ``results.jsonl``.

    python benchmarks/repro_sizes.py [--runs DIR] [NAME ...]

For each defective DDP NAME (all of ``tests/defective.py`` by default) the catalog is run
once at 2 ranks (``ddp-conformance run --candidate tests.defective:NAME --report-dir
DIR/NAME``; an existing ``DIR/NAME/results.jsonl`` is read instead), and for each FAIL,
ERROR, CRASH or TIMEOUT the reproducer is written in this process
(:func:`ddp_conformance.repro.write_script` with the case's failed checks). Printed: the
distribution of their line counts (min, median, max, how many within 400), per DDP and per
kind of failed check (none: a crash, a hang; an expected error; a gradient or parameter; a
buffer; a trace check), and how many failing cases the script refuses.
"""
from __future__ import annotations

import argparse
import collections
import inspect
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ddp_conformance.errors import UsageError  # noqa: E402
from ddp_conformance.report.load import load_results  # noqa: E402
from ddp_conformance.repro import parse_case, write_script  # noqa: E402
from tests import defective  # noqa: E402

FAILING = ("FAIL", "ERROR", "CRASH", "TIMEOUT")


def _results(name: str, runs: str) -> list:  # type: ignore[type-arg]
    directory = os.path.join(runs, name)
    if not os.path.exists(os.path.join(directory, "results.jsonl")):
        subprocess.run([sys.executable, "-m", "ddp_conformance", "run", "--candidate",
                        f"tests.defective:{name}", "--report-dir", directory],
                       cwd=ROOT, stdout=subprocess.DEVNULL, check=False)
    return list(load_results(directory).results)


def _kind(failed: list[str]) -> str:
    if not failed:
        return "none (crash, hang)"
    for prefix, kind in (("expected_error", "expected error"), ("trace.", "trace"),
                         ("oracle.buffer", "buffer"), ("init.", "init"), ("replica.", "replica")):
        if any(c.startswith(prefix) for c in failed):
            return kind
    return "gradient, parameter"


def _line(label: str, sizes: list[int]) -> str:
    return (f"{label:28} {len(sizes):4} cases  min {min(sizes):4}  median "
            f"{statistics.median(sizes):6.1f}  max {max(sizes):4}  <= 400: "
            f"{sum(1 for n in sizes if n <= 400)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="classes of tests/defective.py (default: all)")
    parser.add_argument("--runs", default=None, help="report directories, one per DDP (kept)")
    args = parser.parse_args()
    names = args.names or [n for n, v in vars(defective).items() if inspect.isclass(v)
                           and v.__module__ == defective.__name__ and not n.startswith("_")]
    runs = args.runs or tempfile.mkdtemp(prefix="repro-sizes-")
    by_ddp, by_kind = collections.defaultdict(list), collections.defaultdict(list)
    refused = 0
    for name in names:
        for result in _results(name, runs):
            if result.verdict.value not in FAILING:
                continue
            failed = [f.check for f in result.failures]
            try:
                script = write_script(parse_case(result.scenario), result.candidate, 2, failed)
            except UsageError:
                refused += 1
                continue
            by_ddp[name].append(len(script.splitlines()))
            by_kind[_kind(failed)].append(len(script.splitlines()))
    print(_line("all", [n for sizes in by_ddp.values() for n in sizes]))
    for label, sizes in [*by_ddp.items(), *by_kind.items()]:
        print(_line(label, sizes))
    print(f"refused (torch's surface beyond the script): {refused} failing cases; runs in {runs}")


if __name__ == "__main__":
    main()
