"""A reproducer's one-statement blocks on their header's line (:func:`one_line_blocks`), its
classes' fields on few lines (:func:`packed_fields`).

``if x:`` / ``else:`` / ``for ...:`` / ``def f(...):`` / ``try:`` / ``except ...:`` ...
followed by a block of one simple statement on one line (``return y``, ``a = b``) are
written as one line (``if x: return y``) where that fits in the script's line length.
Every token stays as written; only the line break and the indentation go.
"""
from __future__ import annotations

import ast
import functools

#: Statements that open a block of their own (Python allows none after a header's colon).
COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
            ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Match, ast.TryStar)


@functools.lru_cache(maxsize=4096)
def one_line_blocks(text: str, width: int) -> str:
    """``text`` (whole statements, no comments) with each block of one simple statement
    on one line joined onto its header's line, where the result is at most ``width``
    characters."""
    lines = text.splitlines()
    joins = [line for line in _joinable(ast.parse(text))
             if len(lines[line - 2].rstrip()) + 1 + len(lines[line - 1].strip()) <= width
             and lines[line - 2].rstrip().endswith(":")]
    for line in sorted(joins, reverse=True):  # 1-based: the body's line
        lines[line - 2:line] = [lines[line - 2].rstrip() + " " + lines[line - 1].strip()]
    return "\n".join(lines)


def _joinable(tree: ast.AST) -> list[int]:
    """The lines of the one-line, one-statement blocks of ``tree`` whose header ends on
    the line before."""
    out = []
    for node in ast.walk(tree):
        blocks = [getattr(node, name, None) for name in ("body", "orelse", "finalbody")]
        for block in blocks:
            if isinstance(block, list) and len(block) == 1 and isinstance(block[0], ast.stmt) \
                    and not isinstance(block[0], COMPOUND) and not _is_elif(node, block) \
                    and block[0].lineno == block[0].end_lineno and not isinstance(node, ast.Module):
                out.append(block[0].lineno)
    return out


def _is_elif(node: ast.AST, block: list[ast.stmt]) -> bool:
    return isinstance(node, ast.If) and block is node.orelse and isinstance(block[0], ast.If)


@functools.lru_cache(maxsize=4096)
def packed_fields(text: str, width: int) -> str:
    """``text`` (whole statements, no comments) with the runs of one-line assignments in
    its classes' bodies (a dataclass's fields: ``step: int``, ``nbytes: int = 0``) joined
    by ``; `` onto as few lines as fit in ``width`` characters."""
    lines = text.splitlines()
    runs: list[list[ast.stmt]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            run: list[ast.stmt] = []
            for statement in [*node.body, None]:
                if isinstance(statement, (ast.AnnAssign, ast.Assign)) \
                        and statement.lineno == statement.end_lineno:
                    run.append(statement)
                    continue
                runs += [run] if len(run) > 1 else []
                run = []
    for run in sorted(runs, key=lambda r: -r[0].lineno):
        first, last = run[0].lineno - 1, run[-1].lineno - 1
        out = [lines[first].rstrip()]
        for line in lines[first + 1:last + 1]:
            if len(out[-1]) + 2 + len(line.strip()) <= width:
                out[-1] += "; " + line.strip()
            else:
                out.append(line.rstrip())
        lines[first:last + 1] = out
    return "\n".join(lines)
