"""The distribution ships every package of the layered core (pyproject lists them by hand,
because ``reference/`` and ``suites/`` install under other names)."""
from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for p in (ROOT / "ddp_conformance").rglob("__init__.py")}
    assert on_disk <= listed, sorted(on_disk - listed)
    assert {"ddp_reference", "ddp_conformance_suites"} <= listed
