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
- docstrings, comments and blank lines go, and so do the assignments of pure values to
  locals nothing reads (:func:`~ddp_conformance.repro_dead.without_dead_stores`); a block
  of one simple statement goes onto its header's line
  (:func:`~ddp_conformance.repro_oneline.one_line_blocks`), a class's fields onto few
  lines (:func:`~ddp_conformance.repro_oneline.packed_fields`); the script's own header,
  its module docstring, stays.

Every kept line is the source's own line, so the script reads as the harness's code.
"""
from __future__ import annotations

import ast
import copy
import functools
import io
import tokenize
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ddp_conformance.repro_dead import without_dead_stores
from ddp_conformance.repro_oneline import one_line_blocks, packed_fields

#: Name -> (field -> value): the values a script's tests read, by the name they are read
#: through (``case.exact``: {"case": {"exact": True}}).
Known = Mapping[str, Mapping[str, Any]]
#: The entry of :data:`Known` for bare names (a local the script's code computes from the
#: model, ``model_has_buffers``): {"": {"model_has_buffers": False}}.
BARE = ""


def pruned(script: str | Sequence[str], known: Known,
           literal: Callable[[Collection[str]], str] | None = None) -> str:
    """``script`` (its text, or its parts: each a run of whole top-level statements) with
    what the case whose values are ``known`` does not run left out; ``literal(fields)``:
    the ``Case(...)`` literal of those fields only (else the literal's unread keywords are
    left out line by line).

    One pass over the top-level statements, each read once per text (cached: the
    script's modules are the same for every case) and folded once per outcome of its
    tests on ``known`` values."""
    parts = [script] if isinstance(script, str) else list(script)
    chunks = [_folded_chunk(text, known) for part in parts for text in _statements(part)]
    header = chunks[0] if chunks and _info(chunks[0]).docstring else None
    chunks = _unread_fields([c for c in chunks if c is not header], literal)
    kept, used = _reachable(chunks)
    imports = [text for text in (_used_import(c, used) for c in chunks if _info(c).imported)
               if text]
    body = [c if CASE_LITERAL in _info(c).defines  # the literal: packed already
            else one_line_blocks(packed_fields(_packed(without_dead_stores(c)), WIDTH), WIDTH)
            for c in chunks if not _info(c).imported and c in kept]
    return _joined(header, imports, body)


def defined_names(script: str | Sequence[str]) -> list[str]:
    """The names the top-level statements of ``script`` (its text, or its parts) define,
    one entry per definition."""
    parts = [script] if isinstance(script, str) else script
    return [name for part in parts for text in _statements(part)
            for name in sorted(_info(text).defines)]


@functools.lru_cache(maxsize=256)
def _statements(part: str) -> tuple[str, ...]:
    """The top-level statements of ``part``, each its source lines (decorators included,
    comments between statements left out)."""
    lines = part.splitlines()
    return tuple(_source(lines, node) for node in ast.parse(part).body)


@dataclass(frozen=True)
class _Info:
    """What the pruner reads of one top-level statement."""

    tree: ast.stmt
    defines: frozenset[str]
    #: Every name it reads or binds (``x`` of ``x.attr`` too), but in annotations (the
    #: script's ``from __future__ import annotations`` leaves them unevaluated).
    names: frozenset[str]
    #: Every attribute it reads, or sets otherwise than alone (``x.attr``, ``x.a, x.b = ...``;
    #: not ``x.attr = ...``).
    attrs: frozenset[str]
    #: Every attribute it assigns alone (``x.attr = ...``).
    stored: frozenset[str]
    #: The attributes read in the keyword arguments of its calls of a name, apart from
    #: :attr:`attrs`: (name called, keyword, attributes); read only where the keyword
    #: stays (a field of a dataclass left out takes its keywords along).
    keyword_reads: tuple[tuple[str, str, frozenset[str]], ...]
    imported: bool
    docstring: bool
    #: The tests on settings (``x.f``, ``x.f is None``, ...) its ``if`` statements and
    #: conditional expressions make, whose outcomes decide its folding.
    atoms: tuple[ast.expr, ...]


@functools.lru_cache(maxsize=4096)
def _info(text: str) -> _Info:
    tree = ast.parse(text).body[0]
    nodes = list(ast.walk(tree))
    tests = [n.test for n in nodes if isinstance(n, (ast.If, ast.IfExp))]
    stores = [n.targets[0] for n in nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
              and isinstance(n.targets[0], ast.Attribute)]
    annotations = {id(n) for a in nodes if isinstance(a, ast.AnnAssign)
                   for n in ast.walk(a.annotation)}
    keywords = [(c.func.id, k.arg, [n for n in ast.walk(k.value) if isinstance(n, ast.Attribute)])
                for c in nodes if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                for k in c.keywords if k.arg]
    in_keywords = {id(n) for _, _, attrs in keywords for n in attrs}
    case_names = {"case", CASE_LITERAL} | ({"self"} if _defines(tree) == {CASE_CLASS} else set())
    return _Info(tree, frozenset(_defines(tree)),
                 frozenset(n.id for n in nodes if isinstance(n, ast.Name)
                           and id(n) not in annotations),
                 frozenset(_read_as(n, case_names) for n in nodes if isinstance(n, ast.Attribute)
                           and id(n) not in in_keywords and not any(n is s for s in stores)),
                 frozenset(n.attr for n in stores),  # type: ignore[attr-defined]
                 tuple((name, arg, frozenset(_read_as(n, case_names) for n in attrs))
                       for name, arg, attrs in keywords),
                 isinstance(tree, (ast.Import, ast.ImportFrom)), _is_docstring(tree),
                 tuple(a for t in tests for a in _atoms(t)))


#: How a read of a field of the case is told apart from a read of another class's field of
#: the same name (``case.steps``, ``record.steps``): ``case:steps``.
CASE_READ = "case:"


def _read_as(node: ast.Attribute, case_names: set[str]) -> str:
    """The attribute ``node`` reads: its name, or :data:`CASE_READ` and its name when it
    reads it of the case (``case.f``, ``CASE.f``, ``x.case.f``; ``self.f`` in the class of
    the case): the script's code names the case ``case`` wherever it holds one."""
    receiver = node.value
    of_case = isinstance(receiver, ast.Name) and receiver.id in case_names \
        or isinstance(receiver, ast.Attribute) and receiver.attr == "case"
    return CASE_READ + node.attr if of_case else node.attr


def _atoms(test: ast.expr) -> Iterator[ast.expr]:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        yield from _atoms(test.operand)
    elif isinstance(test, ast.BoolOp):
        for operand in test.values:
            yield from _atoms(operand)
    else:
        yield test


_FOLDED: dict[tuple[str, tuple[bool | None, ...]], str] = {}


def _folded_chunk(text: str, known: Known) -> str:
    """One top-level statement folded on ``known`` (to the end: an ``if`` inside a taken
    branch too), without docstrings, comments and blank lines; cached by the outcomes of
    its tests."""
    info = _info(text)
    if info.docstring:
        return text
    key = (text, tuple(_decided(atom, known) for atom in info.atoms))
    if key not in _FOLDED:
        if len(_FOLDED) > 4096:
            _FOLDED.clear()
        unfolded, result = "", text
        while unfolded != result:  # an ``if`` inside a folded one: the next round
            unfolded, result = result, _chosen(folded(result, known), known)
        _FOLDED[key] = _packed(_unannotated(_stripped(without_dead_stores(result))))
    return _FOLDED[key]


#: The class of the script's case and its literal, whose unread fields are left out.
CASE_CLASS, CASE_LITERAL = "Case", "CASE"


def _unread_fields(chunks: list[str], literal: Callable[[Collection[str]], str] | None
                   ) -> list[str]:
    """``chunks`` without the fields of class ``Case`` that nothing reached reads (as
    ``x.field``): their lines in the class, and in the ``CASE = Case(...)`` literal
    (``literal`` of the read fields; else the keywords' lines, one keyword a line); and
    without the unread methods of the other classes kept, and the unread fields of their
    dataclasses that no call sets by position (with the keywords that set them). Until
    nothing changes: a keyword left out may leave a field of another class unread."""
    while True:
        kept, _ = _reachable(chunks)
        owners = [c for c in chunks if _info(c).defines & {CASE_CLASS, CASE_LITERAL}]
        read = _read(chunks, kept, owners)
        of_case = {a.removeprefix(CASE_READ) for a in read if a.startswith(CASE_READ)}
        calls = _calls(c for c in chunks if not _info(c).imported)
        out, dropped = [], {}
        for chunk in chunks:
            node = _info(chunk).tree
            if chunk in kept and isinstance(node, ast.ClassDef) and not node.bases:
                spans = _unread_methods(node, of_case if node.name == CASE_CLASS else read)
                if node.name == CASE_CLASS:
                    spans += [(f.lineno, _end(f), []) for f in _fields(node)
                              if f.target.id not in of_case]  # type: ignore[union-attr]
                else:
                    fields = _unread_dataclass_fields(node, read, calls.get(node.name, []))
                    spans += [(f.lineno, _end(f), []) for f in fields]
                    dropped[node.name] = {f.target.id for f in fields}  # type: ignore[union-attr]
                chunk = _edited(chunk, spans)
                chunk += "\n    pass" if chunk.rstrip().endswith(":") else ""  # no field left
            elif chunk in owners and isinstance(node, ast.Assign) \
                    and isinstance(node.value, ast.Call):
                chunk = _edited(chunk, [
                    (k.value.lineno, _end(k.value), []) for k in node.value.keywords
                    if k.arg not in of_case]) if literal is None else \
                    f"{CASE_LITERAL} = {literal(of_case)}"
            out.append(chunk)
        out = [_without_keywords(chunk, dropped) for chunk in out]
        if out == chunks:
            return out
        chunks = out


def _read(chunks: list[str], kept: set[str], owners: list[str]) -> set[str]:
    """The attributes the kept statements (but the case's class and literal) read: those
    outside keyword arguments, and those in the keyword arguments that stay (of a call of
    something other than a kept dataclass, or setting a field read)."""
    live = [c for c in chunks if c in kept and c not in owners]
    read: set[str] = set().union(*(_info(c).attrs for c in live))
    classes = {_info(c).tree.name for c in live  # type: ignore[attr-defined]
               if isinstance(_info(c).tree, ast.ClassDef) and _is_dataclass(_info(c).tree)}
    pending = [k for c in live for k in _info(c).keyword_reads]
    while True:
        staying = [k for k in pending if k[0] not in classes or k[1] in read
                   or k[0] == CASE_CLASS and CASE_READ + k[1] in read]
        if not staying:
            return read
        pending = [k for k in pending if k not in staying]
        read.update(*(attrs for _, _, attrs in staying))


def _is_dataclass(node: ast.stmt) -> bool:
    return isinstance(node, ast.ClassDef) and not node.bases \
        and any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def _fields(node: ast.ClassDef) -> list[ast.AnnAssign]:
    return [f for f in node.body if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)]


def _unread_dataclass_fields(node: ast.ClassDef, read: set[str],
                             calls: list[tuple[int, frozenset[str]]]) -> list[ast.AnnAssign]:
    """The fields of dataclass ``node`` that nothing kept reads (``x.field``) and no call
    of the class sets by position."""
    if not _is_dataclass(node):
        return []
    by_position = max((n for n, _ in calls), default=0)
    return [f for f in _fields(node)[by_position:]
            if f.target.id not in read]  # type: ignore[union-attr]


def _without_keywords(text: str, dropped: Mapping[str, set[str]]) -> str:
    """``text`` without the keyword arguments ``dropped[name]`` of its calls of ``name``
    (lines left empty removed), and without its assignments to those fields
    (``x.field = ...``)."""
    fields = set().union(*dropped.values())
    if not text.isascii() or not (_info(text).stored & fields or any(
            name in _info(text).names and f for name, f in dropped.items())):
        return text
    spans: list[tuple[int, int, str]] = []
    for call in ast.walk(_info(text).tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and dropped.get(call.func.id)):
            continue
        items: list[ast.AST] = sorted([*call.args, *call.keywords],
                                      key=lambda n: (n.lineno, n.col_offset))  # type: ignore[attr-defined]
        gone = [isinstance(item, ast.keyword) and item.arg in dropped[call.func.id]
                for item in items]
        i = 0
        while i < len(items):  # a run of keywords left out: i to j - 1
            j = i
            while j < len(items) and gone[j]:
                j += 1
            if j > i and j < len(items):  # up to the next item, on its line if it had one
                next_line = items[j].lineno != items[i].lineno  # type: ignore[attr-defined]
                spans.append((_at(text, items[i]), _at(text, items[j]),
                              "\n" + " " * items[j].col_offset if next_line else ""))  # type: ignore[attr-defined]
            elif j > i:
                spans.append((_at(text, items[i - 1], end=True) if i else _at(text, items[i]),
                              _at(text, items[j - 1], end=True), ""))
            i = j + 1
    for start, end, replacement in sorted(spans, reverse=True):  # disjoint runs
        text = text[:start] + replacement + text[end:]
    text = "\n".join(line.rstrip() for line in text.splitlines() if line.strip())
    return _edited(text, [(n.lineno, _end(n), []) for n in ast.walk(ast.parse(text))
                          if isinstance(n, ast.Assign) and len(n.targets) == 1
                          and isinstance(n.targets[0], ast.Attribute)
                          and n.targets[0].attr in fields])


def _edited(text: str, spans: list[tuple[int, int, list[str]]]) -> str:
    lines = text.splitlines()
    for first, end, replacement in sorted(spans, reverse=True):
        lines[first - 1:end] = replacement
    return "\n".join(lines)


def _calls(chunks: Iterable[str]) -> dict[str, list[tuple[int, frozenset[str]]]]:
    """Per name called, its calls' (positional count, keyword names)."""
    found: dict[str, list[tuple[int, frozenset[str]]]] = {}
    for chunk in chunks:
        for name, call in _calls_in(chunk):
            found.setdefault(name, []).append(call)
    return found


@functools.lru_cache(maxsize=4096)
def _calls_in(text: str) -> tuple[tuple[str, tuple[int, frozenset[str]]], ...]:
    return tuple((c.func.id, (len(c.args), frozenset(k.arg for k in c.keywords if k.arg)))
                 for c in ast.walk(_info(text).tree)
                 if isinstance(c, ast.Call) and isinstance(c.func, ast.Name))


def _unread_methods(node: ast.ClassDef, read: set[str]) -> list[tuple[int, int, list[str]]]:
    """The line spans of the methods (not ``__dunder__``) of a class without a base class
    that nothing kept reads as ``x.method``."""
    return [(min([m.lineno] + [d.lineno for d in m.decorator_list]), _end(m), [])
            for m in node.body if isinstance(m, ast.FunctionDef)
            and not m.name.startswith("__") and m.name not in read]


def _end(node: ast.AST) -> int:
    return getattr(node, "end_lineno", None) or node.lineno  # type: ignore[attr-defined]


def _joined(header: str | None, imports: list[str], body: list[str]) -> str:
    """The header, the imports (the plain ones as one statement), the code, the case
    (``CANDIDATE``, ``CASE``): no blank line between them."""
    plain = [text.removeprefix("import ") for text in imports if text.startswith("import ")]
    imports = [text for text in imports if not text.startswith("import ")]
    if plain:
        imports.insert(1 if imports and "__future__" in imports[0] else 0,
                       "import " + ", ".join(plain))
    out = [header] if header else []
    out += ["\n".join(imports)] if imports else []
    code: list[str] = []
    for text in body:
        if _defines_case(text) and code:
            out.append("\n".join(code))
            code = []
        code.append(text)
    out += ["\n".join(code)] if code else []
    return "\n".join(out) + "\n"


def _defines_case(text: str) -> bool:
    return "CANDIDATE" in _info(text).defines


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


def _reachable(chunks: list[str]) -> tuple[set[str], set[str]]:
    """The statements that run, and the names they use: the statements that define
    nothing are roots (and ``CASE``, ``SPEC``, ``CANDIDATE``), a definition is kept once a
    kept statement names it."""
    by_name = {name: chunk for chunk in chunks for name in _info(chunk).defines}
    kept: set[str] = set()
    pending = [c for c in chunks if not _info(c).defines and not _info(c).imported]
    pending += [by_name[n] for n in ("CASE", "SPEC", "CANDIDATE") if n in by_name]
    while pending:
        chunk = pending.pop()
        if chunk in kept:
            continue
        kept.add(chunk)
        pending += [by_name[n] for n in _info(chunk).names if n in by_name]
    used: set[str] = set().union(*(_info(chunk).names for chunk in kept))
    return kept, used


def _bound(alias: ast.alias) -> str:
    return alias.asname or alias.name.split(".")[0]


def _used_import(text: str, used: set[str]) -> str:
    """The import with only the names something kept uses ('' if none)."""
    node = _info(text).tree
    assert isinstance(node, (ast.Import, ast.ImportFrom))
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


#: The longest line :func:`_packed` makes (the project's line length).
WIDTH = 110


@functools.lru_cache(maxsize=4096)
def _packed(text: str) -> str:
    """``text`` with each statement's continuation lines (inside brackets) joined onto as
    few lines as fit in :data:`WIDTH` characters; a statement with a string over several
    lines or a backslash continuation is left as it is. Every token stays as written."""
    lines = text.splitlines()
    spans: list[tuple[int, int]] = []  # (first row, last row) of a statement, 0-based
    first, skip = 0, False
    for token in _tokens(text):
        if token.type == tokenize.STRING and token.end[0] > token.start[0]:
            skip = True
        if token.type in (tokenize.NEWLINE, tokenize.ENDMARKER) or (
                token.type == tokenize.OP and token.string == ":" and _opens_block(token)):
            last = token.start[0] - 1
            if last > first and not skip and last < len(lines) \
                    and not any(lines[r].endswith("\\") for r in range(first, last)):
                spans.append((first, last))
            first, skip = token.end[0], False
        elif token.type in (tokenize.NL, tokenize.COMMENT) and token.start[0] - 1 == first \
                and not lines[first].strip():
            first = token.end[0]
    for start, end in reversed(spans):
        lines[start:end + 1] = _joined_lines(lines[start:end + 1])
    return "\n".join(lines)


def _opens_block(token: tokenize.TokenInfo) -> bool:
    """Whether ``token`` (a ``:``) ends a block's header line (``if x:`` before its body on
    the next line)."""
    return token.line.rstrip().endswith(":") and token.end[1] == len(token.line.rstrip())


def _joined_lines(lines: list[str]) -> list[str]:
    out = [lines[0].rstrip()]
    for line in lines[1:]:
        piece = line.strip()
        glue = "" if out[-1].endswith(("(", "[", "{")) or piece.startswith((")", "]", "}")) else " "
        if len(out[-1]) + len(glue) + len(piece) <= WIDTH:
            out[-1] += glue + piece
        else:
            out.append(line.rstrip())
    return out


def _unannotated(text: str) -> str:
    """``text`` with its functions' signatures without annotations (each on one line):
    the script's ``from __future__ import annotations`` leaves them unevaluated."""
    lines = text.splitlines()
    edits = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body[0].lineno > node.lineno:
            args = copy.deepcopy(node.args)
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None:
                    arg.annotation = None
            head = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
            edits.append((node.lineno, node.body[0].lineno - 1,
                          [f"{' ' * node.col_offset}{head} {node.name}({ast.unparse(args)}):"]))
    for first, end, replacement in sorted(edits, reverse=True):
        lines[first - 1:end] = replacement
    return "\n".join(lines)


def _chosen(text: str, known: Known) -> str:
    """``text`` with the conditional expressions on ``known`` values (``a if x.f else b``)
    replaced by the operand chosen (the outermost ones: those inside, the next round)."""
    if not text.isascii():  # column offsets are bytes
        return text
    tree = ast.parse(text)
    spans: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.IfExp) and not any(a <= _at(text, node) < b for a, b, _ in spans):
            taken = _decided(node.test, known)
            if taken is not None:
                chosen = node.body if taken else node.orelse
                spans.append((_at(text, node), _at(text, node, end=True),
                              text[_at(text, chosen):_at(text, chosen, end=True)]))
    for start, end, replacement in sorted(spans, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _at(text: str, node: ast.AST, end: bool = False) -> int:
    """The offset in ``text`` of ``node``'s start (or end)."""
    line = getattr(node, "end_lineno" if end else "lineno")
    col = getattr(node, "end_col_offset" if end else "col_offset")
    return _line_starts(text)[line - 1] + col


@functools.lru_cache(maxsize=64)
def _line_starts(text: str) -> list[int]:
    starts, at = [], 0
    for line in text.splitlines(keepends=True):
        starts.append(at)
        at += len(line)
    return starts + [at]


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
    if isinstance(node, ast.Name) and node.id in known.get(BARE, {}):
        return known[BARE][node.id]
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
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(
            test.ops[0], (ast.In, ast.NotIn)) and isinstance(test.comparators[0], ast.Tuple) \
            and all(isinstance(e, ast.Constant) for e in test.comparators[0].elts):
        value = _setting(test.left, known)
        if value is _UNKNOWN:
            return None
        inside = any(value is e.value or value == e.value  # type: ignore[attr-defined]
                     for e in test.comparators[0].elts)
        return inside == isinstance(test.ops[0], ast.In)
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
