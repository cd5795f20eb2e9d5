"""A reproducer's code cut to what its case runs: :func:`pruned`.

The script ``repro`` assembles is the harness's code (``ddp_conformance/script/``, the
model's, the comm hook's). :func:`pruned` keeps of it what the case reaches:

- ``if`` branches on values the script's case fixes that the case does not take are
  dropped (:func:`folded`): a test on ``<name>.<field>`` for a name the caller knows
  (``case``, the ``CASE`` literal's fields; ``proc``, the single-process procedure's;
  ``spec``, the model's; ``TRACE``, the tracer's settings): ``x.f``, ``not x.f``,
  ``x.f is None``, ``x.f is not None``, ``x.f == c``, and ``and``/``or`` of them; then the
  statements after a ``return``/``raise``/``continue``/``break`` and the ``pass`` beside
  other statements;
- then only the top-level definitions reachable by name from the statements that run
  (the imports' users, the ``__main__`` block, ``CASE``) stay, and only the imports that
  something kept uses; of the ``Case`` class and the ``CASE`` literal, only the fields
  something kept reads (:func:`_unread_fields`);
- docstrings, comments and blank lines inside definitions go (one blank line between
  top-level statements); the script's own header, its module docstring, stays.

Every kept line is the source's own line, so the script reads as the harness's code.
"""
from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

#: Name -> (field -> value): the values a script's tests read, by the name they are read
#: through (``case.exact``: {"case": {"exact": True}}).
Known = Mapping[str, Mapping[str, Any]]


def pruned(script: str, known: Known,
           literal: Callable[[Collection[str]], str] | None = None) -> str:
    """``script`` with what the case whose values are ``known`` does not run left out;
    ``literal(fields)``: the ``Case(...)`` literal of those fields only (else the literal's
    unread keywords are left out line by line)."""
    unfolded = ""
    while unfolded != script:  # an ``if`` inside a folded one: the next round
        unfolded, script = script, folded(script, known)
    script = _unread_fields(script, literal)
    tree = ast.parse(script)
    lines = script.splitlines()
    kept, used = _reachable(tree.body)
    parts = []
    for i, node in enumerate(tree.body):
        if i == 0 and _is_docstring(node):
            parts.append(_source(lines, node))  # the header
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            text = _used_import(node, used)
            if text:
                parts.append(text)
        elif id(node) in kept:
            parts.append(_stripped(_source(lines, node)))
    return _joined(parts)


#: The class of the script's case and its literal, whose unread fields are left out.
CASE_CLASS, CASE_LITERAL = "Case", "CASE"


def _unread_fields(script: str, literal: Callable[[Collection[str]], str] | None) -> str:
    """``script`` without the fields of class ``Case`` that nothing reached reads (as
    ``x.field``): their lines in the class, and in the ``CASE = Case(...)`` literal
    (``literal`` of the read fields; else the keywords' lines, one keyword a line)."""
    tree = ast.parse(script)
    kept, _ = _reachable(tree.body)
    owners = [n for n in tree.body if _defines(n) & {CASE_CLASS, CASE_LITERAL}]
    read = {n.attr for node in tree.body if id(node) in kept and node not in owners
            for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    spans = _unread_methods(tree, kept, read) + _unset_defaults(tree, kept, read)
    for node in owners:
        if isinstance(node, ast.ClassDef):
            spans += [(f.lineno, _end(f), []) for f in node.body if isinstance(f, ast.AnnAssign)
                      and isinstance(f.target, ast.Name) and f.target.id not in read]
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            spans += [(k.value.lineno, _end(k.value), []) for k in node.value.keywords
                      if k.arg not in read] if literal is None else \
                [(node.lineno, _end(node), f"{CASE_LITERAL} = {literal(read)}".splitlines())]
    lines = script.splitlines()
    for first, end, replacement in sorted(spans, reverse=True):
        lines[first - 1:end] = replacement
    return "\n".join(lines)


def _unread_methods(tree: ast.Module, kept: set[int], read: set[str]
                    ) -> list[tuple[int, int, list[str]]]:
    """The line spans of the methods (not ``__dunder__``) of the kept classes without a base
    class that nothing kept reads as ``x.method``."""
    return [(min([m.lineno] + [d.lineno for d in m.decorator_list]), _end(m), [])
            for node in tree.body
            if id(node) in kept and isinstance(node, ast.ClassDef) and not node.bases
            for m in node.body if isinstance(m, ast.FunctionDef)
            and not m.name.startswith("__") and m.name not in read]


def _unset_defaults(tree: ast.Module, kept: set[int], read: set[str]
                    ) -> list[tuple[int, int, list[str]]]:
    """The line spans of the fields with a default of the kept dataclasses (but ``Case``,
    whose literal sets fields by name) that nothing kept reads (``x.field``) and no call
    of the class sets (by name, or by position)."""
    spans: list[tuple[int, int, list[str]]] = []
    calls_of: dict[str, list[ast.Call]] = {}
    for c in ast.walk(tree):
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name):
            calls_of.setdefault(c.func.id, []).append(c)
    for node in tree.body:
        if id(node) not in kept or not isinstance(node, ast.ClassDef) or node.bases \
                or node.name == CASE_CLASS or not any("dataclass" in ast.unparse(d)
                                                      for d in node.decorator_list):
            continue
        calls = calls_of.get(node.name, [])
        named = {k.arg for c in calls for k in c.keywords}
        fields = [f for f in node.body if isinstance(f, ast.AnnAssign)]
        by_position = max((len(c.args) for c in calls), default=0)
        spans += [(f.lineno, _end(f), []) for f in fields[by_position:]
                  if f.value is not None and isinstance(f.target, ast.Name)
                  and f.target.id not in read | named]
    return spans


def _end(node: ast.AST) -> int:
    return getattr(node, "end_lineno", None) or node.lineno  # type: ignore[attr-defined]


def _joined(parts: list[str]) -> str:
    """Side by side, the imports, and the one-line statements (constants, aliases); a
    blank line before and after every other statement."""
    out: list[str] = []
    for part in parts:
        if not (out and _kind(part) and _kind(part) == _kind(out[-1])):
            out.append("")
        out.append(part)
    return "\n".join(out[1:]) + "\n"


def _kind(part: str) -> str:
    """'import', 'line' (another one-line statement) or '' (a longer one, a definition)."""
    if "\n" in part or part.startswith(("def ", "class ", "@")):
        return ""
    return "import" if part.startswith(("import ", "from ")) else "line"


def _source(lines: list[str], node: ast.stmt) -> str:
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[first - 1:node.end_lineno])


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
        and isinstance(node.value.value, str)


def _defines(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}  # x of x.attr too


def _reachable(body: list[ast.stmt]) -> tuple[set[int], set[str]]:
    """The ids of the statements that run, and the names they use: the statements that
    define nothing are roots, a definition is kept once a kept statement names it."""
    by_name = {name: node for node in body for name in _defines(node)}
    kept: set[int] = set()
    pending = [node for node in body
               if not _defines(node) and not isinstance(node, (ast.Import, ast.ImportFrom))]
    pending += [by_name[n] for n in ("CASE", "SPEC", "CANDIDATE") if n in by_name]
    while pending:
        node = pending.pop()
        if id(node) in kept:
            continue
        kept.add(id(node))
        pending += [by_name[n] for n in _names(node) if n in by_name]
    used: set[str] = set().union(*(_names(node) for node in body if id(node) in kept))
    return kept, used


def _bound(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def _used_import(node: ast.Import | ast.ImportFrom, used: set[str]) -> str:
    """The import with only the names something kept uses ('' if none)."""
    if isinstance(node, ast.ImportFrom) and node.module == "__future__":
        return ast.unparse(node)
    names = [alias for alias in node.names if _bound(alias) in used]
    if not names:
        return ""
    if isinstance(node, ast.Import):
        return ast.unparse(ast.Import(names))
    return ast.unparse(ast.ImportFrom(node.module, names, node.level))


def _stripped(text: str) -> str:
    """``text`` without its docstrings, comments and blank lines (a body that was only a
    docstring becomes ``...``)."""
    lines = text.splitlines()
    drop: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and body and _is_docstring(body[0]):
            doc = body[0]
            span = range(doc.lineno - 1, doc.end_lineno or doc.lineno)
            if len(body) == 1:
                indent = lines[doc.lineno - 1][:doc.col_offset]
                lines[doc.lineno - 1] = indent + "..."
                span = range(doc.lineno, doc.end_lineno or doc.lineno)
            drop.update(span)
    in_string: set[int] = set()
    for token in _tokens(text):
        if token.type == tokenize.COMMENT:
            row, col = token.start[0] - 1, token.start[1]
            lines[row] = lines[row][:col].rstrip()
        elif token.type == tokenize.STRING and token.end[0] > token.start[0]:
            in_string.update(range(token.start[0], token.end[0]))  # lines after the first
    return "\n".join(line for i, line in enumerate(lines)
                     if i not in drop and (line.strip() or i in in_string))


def _tokens(text: str) -> Iterator[tokenize.TokenInfo]:
    return tokenize.generate_tokens(io.StringIO(text + "\n").readline)


def folded(script: str, known: Known) -> str:
    """``script`` with the ``if`` statements on ``known`` values replaced by the branch
    taken; where there is none, what follows a jump in its block, and a ``pass`` beside
    other statements, left out (one round: an ``if`` inside a replaced one waits for the
    next)."""
    tree = ast.parse(script)
    lines = script.splitlines()
    edits: list[tuple[int, int, list[str]]] = []  # (first line, end line, replacement)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and not _inside_edit(node, edits):
            taken = _decided(node.test, known)
            if taken is not None:
                branch = node.body if taken else node.orelse
                edits.append((node.lineno, _end(node), _branch_lines(lines, node, branch)))
    for node in ast.walk(tree) if not edits else ():
        for block in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                edits += [(s.lineno, _end(s), []) for s in _dead(block)
                          if not _inside_edit(s, edits)]
    for first, end, replacement in sorted(edits, reverse=True):
        lines[first - 1:end] = replacement
    return "\n".join(lines)


def _dead(block: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of ``block`` that never run or do nothing: those after a jump, and
    ``pass`` where the block has other statements."""
    jumps = [i for i, s in enumerate(block)
             if isinstance(s, (ast.Return, ast.Raise, ast.Continue, ast.Break))]
    live = block[:jumps[0] + 1] if jumps else block
    passes = [s for s in live if isinstance(s, ast.Pass)] if len(live) > 1 else []
    return block[len(live):] + passes[:len(live) - 1]


def _inside_edit(node: ast.stmt, edits: list[tuple[int, int, list[str]]]) -> bool:
    return any(first <= node.lineno and _end(node) <= end for first, end, _ in edits)


def _branch_lines(lines: list[str], node: ast.If, branch: list[ast.stmt]) -> list[str]:
    """The lines of ``branch``, dedented to the ``if``'s column; ``pass`` for none."""
    indent = " " * node.col_offset
    if not branch:
        return [indent + "pass"]
    if branch is node.orelse and isinstance(branch[0], ast.If) and len(branch) == 1 \
            and lines[branch[0].lineno - 1].lstrip().startswith("elif "):
        elif_line = lines[branch[0].lineno - 1]
        body = [elif_line.replace("elif ", "if ", 1)] + \
            lines[branch[0].lineno:_end(branch[0])]
        shift = branch[0].col_offset - node.col_offset
        return [line[shift:] if i else indent + line.lstrip() for i, line in enumerate(body)]
    first, end = branch[0].lineno, branch[-1].end_lineno or branch[-1].lineno
    shift = branch[0].col_offset - node.col_offset
    return [line[shift:] if line.strip() else line for line in lines[first - 1:end]]


_UNKNOWN = object()


def _setting(node: ast.expr, known: Known) -> Any:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.attr in known.get(node.value.id, {}):
        return known[node.value.id][node.attr]
    return _UNKNOWN


def _decided(test: ast.expr, known: Known) -> bool | None:
    """The value of ``test`` if it is a test on ``known`` values, else None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _decided(test.operand, known)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):  # decided by the operands before any unknown one
        deciding = isinstance(test.op, ast.Or)
        for operand in test.values:
            value = _decided(operand, known)
            if value is None or value is deciding:
                return value
        return not deciding
    value = _setting(test, known)
    if value is not _UNKNOWN:
        return bool(value)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 \
            and isinstance(test.comparators[0], ast.Constant):
        value, other = _setting(test.left, known), test.comparators[0].value
        if value is _UNKNOWN:
            return None
        op = test.ops[0]
        if isinstance(op, (ast.Is, ast.IsNot)):
            return (value is other) == isinstance(op, ast.Is)
        if isinstance(op, (ast.Eq, ast.NotEq)):
            return (value == other) == isinstance(op, ast.Eq)
    return None
