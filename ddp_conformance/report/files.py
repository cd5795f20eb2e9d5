"""Report files whole or not at all, and a report directory's problems as one line.

Every report file (``summary.md``, ``junit.xml``, ``report.html``, the coverage summary)
is written to a temporary name in its own directory and renamed over its final name
(:func:`os.replace`, atomic within one file system): a reader, or a run that dies
meanwhile, sees the previous file or the new one, never an empty or truncated one.

:class:`ReportFiles` keeps, under a lock, which files of one report set are in place
and which temporary files are being written, so that a watchdog thread ending the
process early (``ddp-conformance run`` after SIGTERM) can :meth:`~ReportFiles.abandon`
the set: the temporary files are removed, no rename happens after that, and it learns
exactly which files were written.

A directory that cannot be written (read-only, full, missing permissions) is a
:class:`~ddp_conformance.errors.ReportDirError`: exit 2 and one line naming the path and
the error (:func:`check_writable` before the first case; :func:`write_failed` mid-run).
"""
from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ddp_conformance.errors import ReportDirError

#: Temporary report files start with this (and are hidden): ``.summary.md.<random>.tmp``.
TEMP_PREFIX = "."
TEMP_SUFFIX = ".tmp"


def write_failed(path: str, exc: OSError) -> ReportDirError:
    """The one-line error for ``exc`` raised while writing ``path``."""
    reason = exc.strerror or str(exc)
    errno = f"[Errno {exc.errno}] " if exc.errno is not None else ""
    return ReportDirError(f"cannot write {path}: {errno}{reason}")


def make_dir(directory: str) -> None:
    """``os.makedirs(directory, exist_ok=True)``, its failure a :class:`ReportDirError`."""
    try:
        os.makedirs(directory, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ReportDirError(f"cannot write {directory}: {_file_in_the_way(directory)} is a "
                             f"file, not a directory") from None
    except OSError as exc:
        raise write_failed(directory, exc) from None


def _file_in_the_way(directory: str) -> str:
    """The nearest of ``directory`` and its parents that exists: a file, where
    :func:`os.makedirs` failed with EEXIST or ENOTDIR."""
    head = os.path.normpath(directory)
    while head and not os.path.lexists(head):
        head = os.path.dirname(head)
    return head or directory


def check_writable(directory: str) -> None:
    """Create ``directory`` if needed, write a probe file there (synced: a full disk may
    only say so then) and remove it; raise :class:`ReportDirError` naming the path and
    the error when any of it fails (a read-only or full file system, a file in the way,
    no permission)."""
    make_dir(directory)
    probe = os.path.join(directory, f"{TEMP_PREFIX}write-probe-{os.getpid()}{TEMP_SUFFIX}")
    try:
        with open(probe, "wb", buffering=0) as f:
            f.write(b"ddp-conformance write probe\n")
            os.fsync(f.fileno())
    except OSError as exc:
        raise write_failed(directory, exc) from None
    finally:
        try:
            os.remove(probe)
        except OSError:
            pass  # never created (the error above says why)


class ReportFiles:
    """The files of one report set as they are written (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The final paths in place, in the order they were written.
        self.written: list[str] = []
        #: The final paths being written now (their temporary files exist).
        self._temps: dict[str, str] = {}
        self._abandoned = False

    @contextmanager
    def writing(self, path: str) -> Iterator[str]:
        """Yield a temporary path next to ``path`` to write; on a normal exit it is
        renamed to ``path``. An exception (or :meth:`abandon`) removes it, leaving any
        earlier ``path`` as it was; an :class:`OSError` becomes :class:`ReportDirError`."""
        directory, name = os.path.split(os.path.abspath(path))
        temp = os.path.join(directory, f"{TEMP_PREFIX}{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
        try:  # created as open() creates files (mode 0o666 less the umask), not mkstemp's 0o600
            os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except OSError as exc:
            raise write_failed(path, exc) from None
        with self._lock:
            if self._abandoned:
                _remove(temp)
                raise ReportDirError(f"{path}: not written (the run is exiting)")
            self._temps[path] = temp
        try:
            yield temp
            with self._lock:
                if not self._abandoned:
                    os.replace(temp, path)
                    self.written.append(path)
        except OSError as exc:
            raise write_failed(path, exc) from None
        finally:
            with self._lock:
                self._temps.pop(path, None)
                if os.path.exists(temp):
                    _remove(temp)

    def write_text(self, path: str, render: Callable[[], str]) -> None:
        """Write ``render()`` to ``path``, whole or not at all (rendered before the
        temporary file is opened, so that nothing is open while it renders)."""
        text = render()
        with self.writing(path) as temp, open(temp, "w", encoding="utf-8") as f:
            f.write(text)

    def abandon(self) -> list[str]:
        """From now on nothing is renamed into place: remove the temporary files being
        written and return the paths written (for the exit message)."""
        with self._lock:
            self._abandoned = True
            for temp in self._temps.values():
                _remove(temp)
            return list(self.written)

    def pending(self) -> list[str]:
        """The final paths being written now."""
        with self._lock:
            return list(self._temps)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass  # already gone, or the file system refuses: nothing more to do
