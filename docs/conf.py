"""Sphinx configuration of the ddp-conformance documentation (docs/about-these-docs.md says why
Sphinx, MyST and Furo). Build: ``sphinx-build -W -E -b html docs docs/_build/html``."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "ddp-conformance"
author = "the ddp-conformance authors"
copyright = "the ddp-conformance authors"

extensions = ["myst_parser", "ddp_docs"]
source_suffix = {".md": "markdown"}
myst_enable_extensions = ["deflist", "colon_fence"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "_ext", "examples", "Thumbs.db", ".DS_Store"]
html_theme = "furo"
html_title = "ddp-conformance"
# Code blocks without a language are shown as text, never guessed.
highlight_language = "none"
# Text as written: no curly quotes, and "--" in option names stays two hyphens.
smartquotes = False
# Pages may start at any heading level (pages written as GitHub Markdown do), and a code
# block in a language Pygments does not know is shown plain.
suppress_warnings = ["myst.header", "misc.highlighting_failure"]
