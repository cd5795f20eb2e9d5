"""The git state (commit, dirty flag) of the project and of each candidate's package."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from typing import Any

#: Import names of the built-in candidates' code.
BUILTIN_MODULES = {"torch": "torch", "reference": "ddp_reference"}


def git_state(path: str) -> dict[str, Any] | None:
    """``{"commit", "dirty", "root"}`` of the git checkout holding ``path``, or None."""
    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", directory, *args], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        root = git("rev-parse", "--show-toplevel")
        if not os.path.isdir(path):  # the file must be tracked there (not an ignored install)
            git("ls-files", "--error-unmatch", os.path.abspath(path))
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty, "root": root}


def project_git_state() -> dict[str, Any] | None:
    return git_state(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def candidate_module_path(name: str) -> str | None:
    """Where a candidate's code lives: its module's file, found from its name or spec."""
    module_name = BUILTIN_MODULES.get(name, name.partition(":")[0])
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - any import failure means "unknown"
            return None
    return getattr(module, "__file__", None)


def candidate_git_state(name: str) -> dict[str, Any] | None:
    path = candidate_module_path(name)
    return git_state(path) if path else None
