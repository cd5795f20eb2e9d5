"""The project's yardstick: how much of torch's DDP the catalog executes on Gloo/CPU.

    python benchmarks/torch_coverage.py [--world-size 2] [--from REPORT_DIR]

Runs ``ddp-conformance run --candidate torch --candidate reference --coverage``, then the
same with ``--candidate torch-python-reducer`` (torch's DDP in its other reduction mode:
the per-parameter hooks of ``optimize_ddp="python_reducer"``; without the mixture of
experts, whose ranks it leaves hanging, and a rank killed at a TIMEOUT loses its data), over
torch's ``nn/parallel/distributed.py``, ``distributed/algorithms/join.py`` and the
``ddp_comm_hooks`` package (or reads the coverage.json of an earlier run with ``--from``),
takes out the lines ``benchmarks/torch_coverage_exclusions.txt`` lists as unreachable on
Gloo/CPU (each with its reason), and prints per file the reachable statements, those run,
the share, and the functions never entered; for each comm-hook module whether it was
entered at all. Exit 1 when the exclusion file does not match the installed torch (a range
whose first line no longer starts with the pinned text, or another torch version), or
when a line it calls unreachable ran.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tabulate import tabulate

HERE = Path(__file__).resolve().parent
EXCLUSIONS = HERE / "torch_coverage_exclusions.txt"
TORCH_DIR = Path(torch.__file__).resolve().parent
TARGETS = ("torch.nn.parallel.distributed", "torch.distributed.algorithms.join",
           "torch.distributed.algorithms.ddp_comm_hooks")
HOOKS_DIR = "distributed/algorithms/ddp_comm_hooks/"


@dataclass(frozen=True)
class Exclusion:
    file: str
    first: int
    last: int
    starts_with: str
    reason: str


#: Comm-hook modules the exclusion file marks as unable to run on Gloo/CPU ("! reason").
INCAPABLE: dict[str, str] = {}


def read_exclusions(path: Path) -> tuple[str, list[Exclusion]]:
    """The torch version the file is written for, and its ranges (and, into
    :data:`INCAPABLE`, the modules that cannot run on Gloo/CPU at all)."""
    version, current, out = "", "", []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            if not current:
                sys.exit(f"{path}:{number}: '!' needs a [file] above it")
            INCAPABLE[current] = line[1:].strip()
        elif line.startswith("torch "):
            version = line.split()[1]
        elif line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        else:
            try:
                span, text, reason = (p.strip() for p in line.split(" | ", 2))
                first, last = (int(x) for x in span.split("-"))
            except ValueError:
                sys.exit(f"{path}:{number}: expected 'FIRST-LAST | text | reason'")
            if not current or not reason:
                sys.exit(f"{path}:{number}: a range needs a [file] above it and a reason")
            out.append(Exclusion(current, first, last, text, reason))
    return version, out


def check(version: str, exclusions: list[Exclusion]) -> list[str]:
    """What does not match the installed torch (empty: everything does)."""
    problems = []
    if version != torch.__version__.split("+")[0]:
        problems.append(f"written for torch {version}, installed {torch.__version__}")
    for e in exclusions:
        lines = (TORCH_DIR / e.file).read_text().splitlines()
        if e.last > len(lines) or e.first > e.last:
            problems.append(f"{e.file}:{e.first}-{e.last}: not in the file")
        elif not lines[e.first - 1].strip().startswith(e.starts_with):
            problems.append(f"{e.file}:{e.first}: does not start with {e.starts_with!r}")
    return problems


#: The runs whose coverage is combined: candidates, and a ``-k`` expression or None.
RUNS: tuple[tuple[tuple[str, ...], str | None], ...] = (
    (("torch", "reference"), None),
    (("torch-python-reducer",), "not real/moe"),
)


def run_catalog(world_size: int) -> list[str]:
    """Every run of :data:`RUNS`; their report directories."""
    out = []
    for candidates, keyword in RUNS:
        reports = tempfile.mkdtemp(prefix="torch-coverage-")
        cmd = [sys.executable, "-m", "ddp_conformance", "run", "--world-size", str(world_size),
               "--report-dir", reports, "--slow"]
        for candidate in candidates:
            cmd += ["--candidate", candidate]
        if keyword:
            cmd += ["-k", keyword]
        for target in TARGETS:
            cmd += ["--coverage", target]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
        last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"catalog ({', '.join(candidates)}): exit {proc.returncode}: {last}")
        out.append(reports)
    return out


def combined(report_dirs: list[str]) -> dict[str, Any]:
    """The union of the runs' coverage.py JSON reports: per file, a line or a function's
    line run in any run is run."""
    files: dict[str, Any] = {}
    for reports in report_dirs:
        data = json.loads((Path(reports) / "coverage" / "coverage.json").read_text())
        for path, entry in data["files"].items():
            if path not in files:
                files[path] = json.loads(json.dumps(entry))
                continue
            mine = files[path]
            _union(mine, entry)
            for name, function in entry.get("functions", {}).items():
                if name in mine.setdefault("functions", {}):
                    _union(mine["functions"][name], function)
                else:
                    mine["functions"][name] = function
    return {"files": files}


def _union(into: dict[str, Any], other: dict[str, Any]) -> None:
    run = set(into["executed_lines"]) | set(other["executed_lines"])
    statements = run | set(into["missing_lines"]) | set(other["missing_lines"])
    into["executed_lines"] = sorted(run)
    into["missing_lines"] = sorted(statements - run)
    into.setdefault("summary", {})["covered_lines"] = len(run)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--from", dest="from_dirs", metavar="REPORT_DIR", action="append",
                        help="read REPORT_DIR/coverage/coverage.json instead of running "
                             "(repeatable: the runs are combined)")
    args = parser.parse_args()
    version, exclusions = read_exclusions(EXCLUSIONS)
    problems = check(version, exclusions)
    if problems:
        for p in problems:
            print(f"exclusion file does not match: {p}", file=sys.stderr)
        return 1
    data = combined(args.from_dirs or run_catalog(args.world_size))
    excluded: dict[str, set[int]] = {}
    for e in exclusions:
        excluded.setdefault(e.file, set()).update(range(e.first, e.last + 1))
    rows, hooks, wrong = [], [], []
    missed_hooks: list[str] = []
    shares: dict[str, float] = {}
    for path, entry in sorted(data["files"].items()):
        rel = os.path.relpath(path, TORCH_DIR)
        statements = set(entry["executed_lines"]) | set(entry["missing_lines"])
        wrong += [f"{rel}:{n}" for n in sorted(set(entry["executed_lines"])
                                               & excluded.get(rel, set()))]
        reachable = statements - excluded.get(rel, set())
        run = set(entry["executed_lines"]) & reachable
        never = sorted(n for n, f in entry.get("functions", {}).items()
                       if n and f["summary"]["num_statements"] > 0
                       and not set(f["executed_lines"]) and set(f["missing_lines"]) & reachable)
        share = f"{100 * len(run) / len(reachable):.1f}%" if reachable else "-"
        rows.append([rel, len(statements), len(statements) - len(reachable), len(reachable),
                     len(run), share, len(never), ", ".join(never[:6]) + (" ..." if len(never) > 6
                                                                         else "")])
        if rel.startswith(HOOKS_DIR) and not rel.endswith("__init__.py"):
            entered = any(n and set(f["executed_lines"]) & reachable
                          for n, f in entry.get("functions", {}).items())
            capable = rel not in INCAPABLE
            hooks.append([rel[len(HOOKS_DIR):], "yes" if entered else "no",
                          "yes" if capable else f"no: {INCAPABLE[rel]}"])
            if capable and not entered:
                missed_hooks.append(rel)
        if rel.endswith(("nn/parallel/distributed.py", "algorithms/join.py")):
            shares[rel] = len(run) / len(reachable) if reachable else 1.0
    print(tabulate(rows, ["file", "statements", "excluded", "reachable", "run", "run %",
                          "functions never entered", "first of them"], tablefmt="github"))
    print()
    print(tabulate(hooks, ["comm-hook module", "entered", "Gloo/CPU-capable"],
                   tablefmt="github"))
    print()
    ddp, join = (next((v for k, v in shares.items() if k.endswith(name)), 0.0)
                 for name in ("distributed.py", "join.py"))
    print(f"issue 22's bar: distributed.py >= 90% of reachable: {'yes' if ddp >= 0.9 else 'no'} "
          f"({100 * ddp:.1f}%); join.py 100%: {'yes' if join == 1.0 else 'no'} "
          f"({100 * join:.1f}%); every Gloo/CPU-capable hook module entered: "
          f"{'yes' if not missed_hooks else 'no (' + ', '.join(missed_hooks) + ')'}")
    if wrong:  # an "unreachable" line that ran: the exclusion file is wrong there
        print(f"excluded lines that ran (fix the exclusion file): {', '.join(wrong)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
