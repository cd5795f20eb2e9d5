"""Which scenarios run a mutated line: per-case coverage contexts, measured once.

``python benchmarks/mutation_score.py --measure-coverage`` runs the catalog on torch's DDP
at each world size with ``--coverage`` on every target; each rank labels what it executes
with the case it runs (``scenario-id[torch]``: ``ddp_conformance.ranks.coverage_hook``).
:class:`Reach` reads those data: a mutant's scenarios are those whose ``[torch]`` case
executed one of its lines (:attr:`Mutant.lines`); a line run only while a module was
imported (the empty context: ``def``/``class`` statements, module constants) is reached by
every scenario; a line no ``[torch]`` case ran is **not reached** and its mutant is not run.
Only scenarios torch's DDP passes are kept (a scenario torch fails, an expected failure of
torch's, cannot tell a mutant from torch), ordered cheapest first (their time in the run).

The coverage run also runs torch's DDP in python-reducer mode (``torch-python-reducer``):
a scenario whose ``[torch-python-reducer]`` case ran a mutant's lines, and which that
candidate passes, is listed as ``<scenario id>@python-reducer`` and runs the mutant in that
mode (:data:`benchmarks.mutation.live.PYTHON_REDUCER`). A line run at import reaches the
C++-reducer runs only (as before python-reducer mode was measured).
"""
from __future__ import annotations

import ast
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks.mutation.population import TARGETS, Mutant

SUFFIX = "[torch]"
#: The python-reducer run's context suffix, and the mark of its scenarios in a Reach.
PR_SUFFIX = "[torch-python-reducer]"
PR_MARK = "@python-reducer"
#: The candidate name of each mode in the coverage run's results.
CANDIDATES = {"torch": "", "torch-python-reducer": PR_MARK}


@dataclass
class Reach:
    """The coverage contexts of one world size's torch run."""

    world_size: int
    #: target key -> line -> scenario ids whose torch case ran it ('' : at import)
    lines: dict[str, dict[int, set[str]]]
    #: scenario id -> its duration, for those torch passed
    passed: dict[str, float]

    @classmethod
    def read(cls, report_dir: Path, world_size: int) -> Reach:
        import coverage

        data = coverage.CoverageData(str(report_dir / "coverage" / ".coverage"))
        data.read()
        by_file = {str(Path(f).resolve()): f for f in data.measured_files()}
        lines: dict[str, dict[int, set[str]]] = {}
        for key, target in TARGETS.items():
            measured = by_file.get(str(target.file.resolve()))
            contexts = data.contexts_by_lineno(measured) if measured else {}
            lines[key] = {n: {_scenario(c) for c in cs
                              if c == "" or c.endswith(SUFFIX) or c.endswith(PR_SUFFIX)}
                          for n, cs in contexts.items()}
        passed = {}
        for row in map(json.loads, (report_dir / "results.jsonl").read_text().splitlines()):
            mark = CANDIDATES.get(row.get("candidate", ""))
            if row.get("type") == "result" and row.get("verdict") == "PASS" and mark is not None:
                passed[row["scenario"] + mark] = float(row["duration_s"])
        return cls(world_size, lines, passed)

    def scenarios(self, mutant: Mutant) -> list[str] | None:
        """The scenarios (torch passes them) that run ``mutant``'s lines, cheapest first;
        None when no torch case runs them (not reached). A line no case ran, inside a
        function some case entered, counts as run by those cases: coverage.py does not see
        code run on threads Python did not start, such as a comm hook's future callbacks
        completed on a Gloo thread (:func:`enclosing_function`)."""
        runs: set[str] = set()
        for line in mutant.lines:
            runs |= self.lines[mutant.target].get(line, set())
        if not runs:
            for line in enclosing_function(mutant.target, mutant.first_line):
                runs |= self.lines[mutant.target].get(line, set()) - {""}
        if not runs:
            return None
        everything = {s for s in self.passed if not s.endswith(PR_MARK)}
        chosen = everything if "" in runs else runs & set(self.passed)
        return sorted(chosen, key=lambda s: (self.passed[s], s))


@functools.cache
def _functions(target: str) -> list[tuple[int, int]]:
    """The line spans of the outermost functions (methods included) of ``target``."""
    tree = ast.parse(TARGETS[target].file.read_text())
    spans = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                spans.append((child.lineno, child.end_lineno or child.lineno))
            elif isinstance(child, ast.ClassDef):
                visit(child)

    visit(tree)
    return spans


def enclosing_function(target: str, line: int) -> range:
    """The lines of the outermost function holding ``line`` (empty at module level)."""
    for first, last in _functions(target):
        if first <= line <= last:
            return range(first, last + 1)
    return range(0)


def _scenario(context: str) -> str:
    if context.endswith(PR_SUFFIX):
        return context.removesuffix(PR_SUFFIX) + PR_MARK
    return context.removesuffix(SUFFIX)
