"""Coverage of a run's targets in every process of the run (``--coverage TARGET``).

coverage.py measures; this module only decides *where*: which files (the targets, resolved
to paths without importing them), which data file each process writes, and when it starts
and saves. The parent hands the setup to its ranks through one environment variable
(:data:`ENV`), which every rank and spare inherits (``RankPool`` copies the parent's
environment); a rank starts measuring as its first act, before it imports torch, so the
module-level lines of a target (its ``def`` and ``class`` statements) are measured too.

When a process saves:
- a rank: at a normal exit (the pool's ``Exit``), and before it leaves the pool on its own
  (``os._exit`` after an error or a refused release): :func:`save`;
- the parent: at the end of the run (:class:`ParentCoverage`), after the ranks exited.
A rank killed outright (a TIMEOUT's stuck rank, a crash) loses what it measured since its
start; the report section says how many data files were combined.

This module imports nothing heavy, and coverage.py only when a run asks for it (it is the
optional extra ``ddp-conformance[coverage]``).
"""
from __future__ import annotations

import atexit
import importlib.util
import json
import os
from dataclasses import dataclass
from typing import Any

from ddp_conformance.errors import UsageError

#: The environment variable that carries a run's :class:`CoverageSetup` to its processes.
ENV = "DDP_CONFORMANCE_COVERAGE"
#: Where a run's coverage goes, relative to its report directory.
DATA_DIR = "coverage"
INSTALL_HINT = "pip install 'ddp-conformance[coverage]'"


@dataclass(frozen=True)
class CoverageSetup:
    """What to measure and where each process writes: ``targets`` as given, ``files`` the
    Python files they resolve to, ``data_file`` the base name of the data files (each
    process adds its own suffix)."""

    targets: tuple[str, ...]
    files: tuple[str, ...]
    data_file: str

    def to_env(self) -> str:
        return json.dumps({"targets": self.targets, "files": self.files,
                           "data_file": self.data_file})

    @classmethod
    def from_env(cls, text: str) -> CoverageSetup:
        data = json.loads(text)
        return cls(tuple(data["targets"]), tuple(data["files"]), str(data["data_file"]))


def require_coverage() -> None:
    """A clear usage error when coverage.py is not installed."""
    if importlib.util.find_spec("coverage") is None:
        raise UsageError(f"--coverage needs coverage.py: {INSTALL_HINT}")


def resolve_target(target: str) -> list[str]:
    """The Python files of ``target``: a path (a file, or a directory and everything
    below it) or an importable module or package name, found without importing it (its
    parent packages are imported, as ``importlib.util.find_spec`` does)."""
    if os.path.exists(target):
        return _python_files(os.path.abspath(target))
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise UsageError(f"--coverage {target!r}: neither a path nor an importable module or "
                         "package")
    if spec.submodule_search_locations:  # a package: every file below its directories
        files = [f for d in spec.submodule_search_locations for f in _python_files(d)]
    elif spec.origin and spec.origin.endswith(".py"):
        files = [spec.origin]
    else:
        raise UsageError(f"--coverage {target!r}: {spec.origin or 'no file'} is not Python "
                         "source")
    return sorted(os.path.realpath(f) for f in files)


def _python_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [os.path.realpath(path)]
    found = []
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        found += [os.path.realpath(os.path.join(root, n)) for n in sorted(names)
                  if n.endswith(".py")]
    if not found:
        raise UsageError(f"--coverage {path!r}: no Python file there")
    return found


def setup_for(targets: list[str], report_dir: str) -> CoverageSetup:
    """Check and resolve ``--coverage`` targets (usage errors, in one line each)."""
    require_coverage()
    files = sorted({f for t in targets for f in resolve_target(t)})
    data_dir = os.path.abspath(os.path.join(report_dir, DATA_DIR))
    return CoverageSetup(tuple(targets), tuple(files), os.path.join(data_dir, ".coverage"))


_ACTIVE: Any = None  # this process's coverage.Coverage, once started


def _start(setup: CoverageSetup) -> Any:
    global _ACTIVE
    import coverage

    os.makedirs(os.path.dirname(setup.data_file), exist_ok=True)
    cov = coverage.Coverage(data_file=setup.data_file, data_suffix=True, branch=True,
                            include=list(setup.files), config_file=False)
    cov.start()
    _ACTIVE = cov
    atexit.register(save)
    return cov


def start_from_env() -> None:
    """In a rank process, first thing: start measuring if the run asked for coverage."""
    text = os.environ.get(ENV)
    if text and _ACTIVE is None:
        _start(CoverageSetup.from_env(text))


def save() -> None:
    """Stop measuring and write this process's data file (once; a no-op without coverage).
    Called at exit, and by a rank right before ``os._exit``."""
    global _ACTIVE
    cov, _ACTIVE = _ACTIVE, None
    if cov is not None:
        cov.stop()
        cov.save()


def switch_context(label: str) -> None:
    """Attribute what this process executes from now on to ``label`` (coverage.py's
    dynamic context; a no-op without coverage). A rank names each job's case so, e.g.
    ``mlp-sgd[torch]``: the data then say which cases ran each line
    (``coverage.CoverageData.contexts_by_lineno``); lines run before the first job (module
    imports) keep the empty context."""
    if _ACTIVE is not None:
        _ACTIVE.switch_context(label)


def clear_data(setup: CoverageSetup) -> None:
    """Remove an earlier run's data files from the data directory: called once per run,
    before any of its processes measures (pytest-xdist: by the controller)."""
    data_dir = os.path.dirname(setup.data_file)
    if os.path.isdir(data_dir):
        for name in os.listdir(data_dir):
            if name.startswith(".coverage"):
                os.remove(os.path.join(data_dir, name))


class ParentCoverage:
    """The run's own process: measured from :meth:`start` (its ranks inherit the setup
    through :data:`ENV`) to :meth:`stop`, which saves and restores the environment."""

    def __init__(self, setup: CoverageSetup) -> None:
        self.setup = setup
        self._previous_env: str | None = None

    def start(self) -> None:
        """Hand the setup to the processes started from now on, and measure this one."""
        self._previous_env = os.environ.get(ENV)
        os.environ[ENV] = self.setup.to_env()
        if _ACTIVE is None:
            _start(self.setup)

    def stop(self) -> None:
        save()
        if self._previous_env is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = self._previous_env
