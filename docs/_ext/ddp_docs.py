"""Sphinx extension of the ddp-conformance docs.

- A page whose source holds ``<!-- generated: NAME -->`` gets :data:`generate.PAGES`'s
  ``NAME`` text in its place, read from the code at build time (so the reference cannot
  drift; a build with ``-E`` never reuses an old one).
- A link to a Markdown file of the repository outside ``docs/`` (``../README.md``) is a link
  to the file, as MyST already makes of a link to any other file that exists
  (``../tests/defective.py``). A link to something that exists neither as a page nor as a
  file stays a warning, which ``-W`` turns into a failed build: no broken link ships.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import generate

MARKER = re.compile(r"<!-- generated: ([a-z-]+) -->")
#: A Markdown link's target that is a relative path to a ``.md`` file.
MD_LINK = re.compile(r"\]\((?!path:|[a-z]+://|#)([^)\s#]+\.md)(#[^)\s]*)?\)")


def _outside_docs(app: Any, docname: str, target: str) -> bool:
    srcdir = Path(app.srcdir).resolve()
    path = (srcdir / docname).parent.joinpath(target).resolve()
    return path.is_file() and srcdir not in path.parents


def _fill(app: Any, docname: str, source: list[str]) -> None:
    def page(match: re.Match[str]) -> str:
        return generate.PAGES[match.group(1)]()

    def file_link(match: re.Match[str]) -> str:
        target = match.group(1)
        return f"](path:{target})" if _outside_docs(app, docname, target) else match.group(0)

    source[0] = MD_LINK.sub(file_link, MARKER.sub(page, source[0]))


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _fill)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
