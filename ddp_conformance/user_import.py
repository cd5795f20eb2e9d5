"""Importing a user's module named on the command line (``--candidate``, ``--backend``).

The current directory is importable, as with ``python -m``; a module that cannot be
found, raises while importing, or calls ``sys.exit()`` as it is imported (a script), is a
usage error (exit 2, one line), never a traceback or a silent exit.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType

from ddp_conformance.errors import UsageError


@contextlib.contextmanager
def cwd_importable() -> Iterator[None]:
    """Make the current directory importable, as ``python -m`` does."""
    cwd = os.getcwd()
    added = cwd not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _path_hint(module_name: str, exc: ImportError) -> str:
    """How to make ``module_name`` importable, where its top-level package was not found."""
    top = module_name.split(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or exc.name != top:
        return ""
    return (f"; {top!r} is not in {os.getcwd()}: run from the directory that holds it, "
            f"or add that directory to PYTHONPATH")


def import_user_module(module_name: str, what: str) -> ModuleType:
    """Import ``module_name`` for ``what`` (e.g. "candidate 'pkg.mod:DDP'"), or raise
    :class:`UsageError` saying why it could not be imported."""
    if not module_name:
        raise UsageError(f"{what}: no module named before ':'")
    try:
        with cwd_importable():
            return importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"unknown {what}: cannot import {module_name!r} ({exc})"
                         f"{_path_hint(module_name, exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the user's own import-time error
        raise UsageError(f"{what}: importing {module_name!r} raised "
                         f"{type(exc).__name__}: {exc}") from None
    except SystemExit as exc:  # a script's sys.exit() run on import: not ours to exit with
        raise UsageError(f"{what}: importing {module_name!r} called sys.exit({exc.code!r}) "
                         f"(is it a script? guard its main code with "
                         f"if __name__ == '__main__')") from None
