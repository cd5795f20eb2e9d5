"""The code's shape (issue 25): no function over 60 lines in ``ddp_conformance/`` and
``reference/``, no code in a string literal longer than 20 lines (ruff, mypy and the
duplicate finder cannot see inside one), and no import cycle between the modules of
either package. Each checker lists its offenders, and is tested on code made to offend."""
from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The packages checked, by their import name: their folders.
PACKAGES = {"ddp_conformance": ROOT / "ddp_conformance", "ddp_reference": ROOT / "reference"}
MAX_FUNCTION_LINES = 60
MAX_CODE_STRING_LINES = 20


def _sources() -> Iterator[tuple[str, Path]]:
    """(module name, path) of every module of :data:`PACKAGES`."""
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join((package, *parts)), path


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- functions over 60 lines ----------------------------------------------------------


def long_functions(tree: ast.AST, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, first line, lines) of every function in ``tree`` longer than
    ``limit`` lines, counted from its first decorator to its last line (docstring and
    comments included: what a reader has to hold). Nested functions count on their own
    too, and inside their enclosing function."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                lines = (child.end_lineno or child.lineno) - first + 1
                if lines > limit:
                    found.append((prefix + child.name, first, lines))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_the_function_checker_finds_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    source = f"class A:\n    @staticmethod\n    def f():\n    {body.replace(chr(10), chr(10) + '    ')}\n"
    assert long_functions(ast.parse(source)) == [("A.f", 2, 62)]
    assert long_functions(ast.parse(source), limit=62) == []


def test_no_function_is_over_60_lines() -> None:
    offenders = [f"{_relative(path)}:{line}: {name} ({lines} lines)"
                 for _, path in _sources()
                 for name, line, lines in long_functions(ast.parse(path.read_text()))]
    assert not offenders, "functions over 60 lines:\n" + "\n".join(offenders)


# --- code in string literals ------------------------------------------------------------


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of ``tree``'s module, classes and functions."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _text(node: ast.AST) -> str | None:
    """A string literal's text, each f-string placeholder as a name; None if not one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "_"
                       for v in node.values)
    return None


def is_code(text: str) -> bool:
    """Whether ``text``, dedented, is Python with at least one definition, import,
    assignment or control statement (a paragraph of prose does not parse; a lone
    expression is data)."""
    try:
        tree = ast.parse(textwrap.dedent(text))
    except (SyntaxError, ValueError):
        return False
    return any(not isinstance(stmt, ast.Expr) for stmt in tree.body)


def code_strings(tree: ast.AST, limit: int = MAX_CODE_STRING_LINES) -> list[tuple[int, int]]:
    """(first line, lines) of every string literal in ``tree`` (docstrings aside) that
    holds code over ``limit`` lines."""
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = _text(node)
        if text is None or id(node) in docstrings or isinstance(node, ast.FormattedValue):
            continue
        lines = len(text.strip("\n").splitlines())
        if lines > limit and is_code(text):
            found.append((getattr(node, "lineno", 0), lines))
    return found


def test_the_string_checker_finds_code_and_leaves_prose() -> None:
    code = "\n".join(f"    x{i} = {{value}}" for i in range(21))  # indented: dedented
    prose = "\n".join("This line, like its neighbours, is prose: not code." for _ in range(30))
    source = (f'"""Doc.\n{code}\n"""\nA = f"""{code}"""\nB = """{prose}"""\n'
              f'C = """{chr(10).join(code.splitlines()[:20])}"""\n')
    found = code_strings(ast.parse(source))
    assert [lines for _, lines in found] == [21], found


def test_no_code_in_a_string_literal_is_over_20_lines() -> None:
    offenders = [f"{_relative(path)}:{line}: a string literal holding {lines} lines of code"
                 for _, path in _sources()
                 for line, lines in code_strings(ast.parse(path.read_text()))]
    assert not offenders, "\n".join(offenders)


# --- import cycles ------------------------------------------------------------------------


def _type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): a block that never runs."""
    return isinstance(node, ast.If) and (
        getattr(node.test, "id", None) == "TYPE_CHECKING"
        or getattr(node.test, "attr", None) == "TYPE_CHECKING")


def _run_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` except those inside an ``if TYPE_CHECKING:`` body (imports
    for annotations only: they import nothing when the code runs)."""
    for child in ast.iter_child_nodes(tree):
        yield child
        if _type_checking(child):
            assert isinstance(child, ast.If)
            for other in child.orelse:
                yield other
                yield from _run_nodes(other)
        else:
            yield from _run_nodes(child)


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of :data:`PACKAGES` that ``module`` imports when it runs (at its top
    level or lazily in a function; not for annotations only): ``from a.b import c`` is
    ``a.b.c`` where that is a module, else ``a.b``. A package's ``__init__`` run by
    importing one of its modules is not counted (Python runs it before the module,
    whoever imports it)."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    found = set()
    for node in _run_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
            source = ".".join(p for p in (base, node.module or "") if p)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in known else source)
    return {m for m in found if m in known and m != module}


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of :data:`PACKAGES` it imports."""
    sources = dict(_sources())
    return {module: _imports(module, path, set(sources)) for module, path in sources.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan),
    each sorted: every module of one imports every other, through the rest."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_the_imports_that_run() -> None:
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a.typed\n"
              "else:\n    import a.other\ndef f():\n    from .lazy import g\n")
    tree = ast.parse(source)
    names = {alias.name for node in _run_nodes(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    assert names == {"a.other"}
    assert any(isinstance(n, ast.ImportFrom) and n.module == "lazy" for n in _run_nodes(tree))
    graph = import_graph()
    assert "ddp_conformance.catalog.models.registry" in \
        graph["ddp_conformance.catalog.models.synthetic"]
    assert "ddp_conformance.catalog.models.composed" in graph["ddp_conformance.catalog.models"]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package: str) -> None:
    found = [c for c in cycles(import_graph()) if c[0].split(".")[0] == package]
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)
