"""Tests that wait, run several times each under a load: no test may depend on the machine's speed.

    python benchmarks/under_load.py [--load 8] [--runs 5] [--workers N] [--timeout S] [TEST ...]

Starts ``--load`` busy loops (processes spinning on the CPU, so that the load average on this
2-core machine reaches about that figure with the tests' own ranks), then runs each selected
test ``--runs`` times, one pytest process per run (``-p no:cacheprovider``, the test's own
deadlines scaled by ``tests/deadlines.py`` from the load it sees), and prints, per test, how
many runs passed, with the load average at the start and the end of each run. Exit 1 when
any run did not pass, 0 otherwise. ``TEST`` is a pytest node id or file; by default, every
test that waits on a subprocess or ranks through ``tests/deadlines.py``: a test function
whose code, or a helper or fixture of its module it reaches, calls ``deadline(``
(:func:`waiting_tests`), which is long: name the tests to check a few. ``--workers N``
runs each pass with ``pytest -n N`` (as the README's test command does), the busy loops
beside them.

Every wait has a deadline: each run gets ``--timeout`` seconds (default 1800) before it is
killed and counted as failed; the busy loops end with this script.
"""
from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPIN = "while True: pass"


def waiting_modules() -> list[str]:
    """The test modules that wait through ``tests/deadlines.py``."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "deadline(" in p.read_text(encoding="utf-8"))


def _calls(node: ast.AST) -> set[str]:
    """The plain names ``node`` calls or takes as parameters (fixtures)."""
    names = {n.func.id for n in ast.walk(node)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        names |= {a.arg for a in node.args.args}
    return names


def waiting_tests() -> list[str]:
    """Node ids (``module::function``) of the tests that reach ``deadline(``: in their own
    body or through a function of their module (a helper, a fixture) that does."""
    tests: list[str] = []
    for module in waiting_modules():
        tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
        funcs = {n.name: n for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        waits = {"deadline"}
        grown = True
        while grown:  # the helpers that reach deadline(, transitively
            new = {name for name, f in funcs.items() if _calls(f) & waits} - waits
            waits |= new
            grown = bool(new)
        tests += [f"{module}::{name}" for name in sorted(waits)
                  if name.startswith("test_") and name in funcs]
    return tests


def run_once(tests: list[str], timeout: float, workers: int) -> tuple[dict[str, bool], float, float]:
    """One pytest run of ``tests``: outcome per node id, load average before and after."""
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *(["-n", str(workers)] if workers else []), *tests]
        try:
            subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {t: False for t in tests}, before, os.getloadavg()[0]
        outcomes: dict[str, bool] = {}
        if junit.exists():
            for case in ET.parse(junit).getroot().iter("testcase"):
                name = f"{case.get('classname')}::{case.get('name')}"
                skipped = case.find("skipped") is not None
                failed = case.find("failure") is not None or case.find("error") is not None
                if not skipped:
                    outcomes[name] = not failed
        return outcomes, before, os.getloadavg()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", nargs="*")
    parser.add_argument("--load", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    args = parser.parse_args()
    tests = args.tests or waiting_tests()
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.load)]
    passes: dict[str, list[bool]] = defaultdict(list)
    try:
        time.sleep(20)  # let the 1-minute load average climb before the first run
        for run in range(args.runs):
            started = time.monotonic()
            outcomes, before, after = run_once(tests, args.timeout, args.workers)
            for name, ok in outcomes.items():
                passes[name].append(ok)
            bad = sum(not ok for ok in outcomes.values())
            print(f"run {run + 1}: {len(outcomes) - bad} passed, {bad} failed in "
                  f"{time.monotonic() - started:.0f} s (load {before:.1f} -> {after:.1f})",
                  flush=True)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    failing = {n: r for n, r in passes.items() if not all(r)}
    for name, results in sorted(failing.items()):
        print(f"  {sum(results)}/{len(results)} passed: {name}")
    print(f"{len(passes)} tests, {args.runs} runs each under {args.load} busy loops: "
          f"{len(passes) - len(failing)} passed every run")
    return 1 if failing or not passes else 0


if __name__ == "__main__":
    sys.exit(main())
