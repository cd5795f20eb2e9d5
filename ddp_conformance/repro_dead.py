"""A reproducer's functions without their dead stores: :func:`without_dead_stores`.

Once a reproducer's code is folded on its case (``repro_prune``), some of a function's
locals are read by nothing left (``final = mb == case.microbatches - 1`` where only the
branches that read it went). An assignment to such a name goes when what it assigns is
a pure expression: names, constants, attribute reads, subscripts, operators, displays,
comprehensions, and calls of :data:`PURE_CALLS` and of the methods :data:`PURE_METHODS`
(reads of a dict or a module's tensors). An assignment that is the only statement of its
block, or shares a line with another, stays.
"""
from __future__ import annotations

import ast
import functools

#: Builtins whose call computes a value and changes nothing.
PURE_CALLS = frozenset({"all", "any", "bool", "dict", "enumerate", "float", "frozenset",
                        "int", "isinstance", "len", "list", "max", "min", "range", "set",
                        "sorted", "str", "tuple"})
#: Methods whose call reads its object and changes nothing (a dict's, a module's).
PURE_METHODS = frozenset({"get", "items", "keys", "values", "modules", "named_buffers",
                          "named_parameters", "parameters"})


@functools.lru_cache(maxsize=4096)
def without_dead_stores(text: str) -> str:
    """``text`` (one top-level statement) without the assignments of pure expressions to
    locals of its functions that nothing reads, repeated until none is left."""
    while True:
        dead = _dead_stores(ast.parse(text))
        if not dead:
            return text
        lines = text.splitlines()
        for first, end in sorted(dead, reverse=True):
            del lines[first - 1:end]
        text = "\n".join(lines)


def _dead_stores(tree: ast.Module) -> list[tuple[int, int]]:
    """The line spans (first, last; 1-based) of the dead stores of ``tree``'s functions."""
    spans: list[tuple[int, int]] = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        nodes = list(ast.walk(function))
        read = {n.id for n in nodes if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
        read |= {name for n in nodes if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
        for block in _blocks(function):
            spans += [(s.lineno, s.end_lineno or s.lineno) for s in block
                      if len(block) > 1 and _alone(s, block) and _dead(s, read)]
    return spans


def _blocks(function: ast.AST) -> list[list[ast.stmt]]:
    """The statement lists of ``function``'s own body (not of the functions and classes
    it defines)."""
    out: list[list[ast.stmt]] = []
    todo = [function]
    while todo:
        node = todo.pop()
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                out.append(block)
            for child in block if isinstance(block, list) else ():
                if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                          ast.Lambda)):
                    todo.append(child)
    return out


def _alone(statement: ast.stmt, block: list[ast.stmt]) -> bool:
    """Whether ``statement``'s lines hold no other statement of ``block``."""
    end = statement.end_lineno or statement.lineno
    return not any(other is not statement and other.lineno <= end
                   and (other.end_lineno or other.lineno) >= statement.lineno for other in block)


def _dead(statement: ast.stmt, read: set[str]) -> bool:
    if isinstance(statement, ast.Assign):
        targets, value = statement.targets, statement.value
    elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
        targets, value = [statement.target], statement.value
    else:
        return False
    names = [t for target in targets for t in ast.walk(target)]
    return all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Store)) for n in names) \
        and not any(isinstance(n, ast.Name) and n.id in read for n in names) and _pure(value)


def _pure(value: ast.expr) -> bool:
    for node in ast.walk(value):
        if isinstance(node, (ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Lambda)):
            return False
        if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Name) and node.func.id in PURE_CALLS
                or isinstance(node.func, ast.Attribute) and node.func.attr in PURE_METHODS):
            return False
    return True
