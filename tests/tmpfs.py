"""A small tmpfs mounted for a test: a report directory that is read-only, or that fills.

Being root does not stop a write to a ``chmod``-ed directory, so the tests mount a real
file system: ``mount -t tmpfs -o size=...`` (full once ``size`` is written) or ``-o ro``.
Where mounting is impossible (not root, no ``CAP_SYS_ADMIN``, no ``mount``), the test is
skipped, saying why. Every mount is undone when the test ends.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

#: How long ``mount`` and ``umount`` may take.
MOUNT_DEADLINE_S = 30.0


@contextmanager
def tmpfs(where: Path, size_kib: int, read_only: bool = False) -> Iterator[Path]:
    """Mount a ``size_kib`` KiB tmpfs on ``where`` (created), read-only if asked; yield
    ``where``; unmount it at the end (lazily, should a process still hold a file)."""
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size_kib}k" + (",ro" if read_only else "")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True, text=True, timeout=MOUNT_DEADLINE_S)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True,
                       timeout=MOUNT_DEADLINE_S, check=False)


def fill(directory: Path) -> None:
    """Write ``directory`` full (until the file system says no space is left)."""
    with open(directory / "filler", "wb", buffering=0) as f:
        chunk = b"\0" * 4096
        try:
            while True:
                f.write(chunk)
        except OSError:
            return
