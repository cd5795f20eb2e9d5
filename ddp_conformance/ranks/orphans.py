"""No process a candidate starts outlives its job (Linux; elsewhere these do nothing).

A rank makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``) before its
first job: whatever a candidate starts inside it — a fork, a ``subprocess``, a double fork,
a ``setsid`` child — stays in its tree, orphans reparenting to the rank instead of init.
After every job the rank ends its whole tree (:func:`end_descendants`): a forked copy of a
rank holds the rank's sockets, and a sleeper holds the machine. The rank starts no process
of its own, so every descendant is the job's.

Ranks the pool kills (a timeout, a crash) cannot clean up; their descendants carry the
marker the pool puts in every rank's environment (:func:`marker_env`), and the pool ends
them by that marker (:func:`end_marked`) when it ends the rank, and once more at close.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Collection

#: The environment variable naming a rank process (pool token and serial), inherited by
#: everything the rank starts.
MARKER = "DDP_CONFORMANCE_RANK"
#: How long :func:`end_descendants` keeps ending a tree that keeps forking.
END_DEADLINE_S = 2.0
_PR_SET_CHILD_SUBREAPER = 36
_LINUX = sys.platform.startswith("linux")


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; True when it is."""
    if not _LINUX:
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _has_children() -> bool:
    """Whether this process has any child, live or zombie (microseconds: no /proc scan).
    A subreaper with no child has no descendant at all."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _stat(pid: str) -> tuple[int, str] | None:
    """(parent pid, state letter) of ``pid``, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), fields[0].decode()


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:60] or '?'})"


def descendants(root: int, skip: Collection[int] = ()) -> dict[int, str]:
    """Every process below ``root`` (pid to state letter), from one scan of /proc; the
    processes in ``skip`` and their own descendants left out."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(entry)
            if st is not None:
                children.setdefault(st[0], []).append((int(entry), st[1]))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for pid, state in children.get(todo.pop(), []):
            if pid not in found and pid not in skip:
                found[pid] = state
                todo.append(pid)
    return found


def end_descendants(skip: Collection[int] = ()) -> list[str]:
    """End every descendant of this process (but the processes in ``skip`` and theirs), reap
    them; describe those that were running.

    Repeats (within :data:`END_DEADLINE_S`) while the tree changes: a process may fork
    between the scan and its end, and the children of an ended process reparent here."""
    if not _LINUX or not _has_children():
        return []
    me = os.getpid()
    ended: dict[int, str] = {}
    deadline = time.monotonic() + END_DEADLINE_S
    while time.monotonic() < deadline:
        tree = descendants(me, skip)
        live = [pid for pid, state in tree.items() if state != "Z" and pid not in ended]
        for pid in live:
            ended[pid] = _describe(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap_children(tree if skip else None)  # the skipped are their caller's to wait for
        if not tree:
            break
        if not live:
            time.sleep(0.005)  # ended processes still being torn down
    return list(ended.values())


def _reap_children(only: Collection[int] | None = None) -> None:
    """Reap every child that ended (of ``only``, when given)."""
    for pid in only or ():
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    while only is None:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def marker_env(token: str) -> dict[str, str]:
    """The environment entry that marks a rank process and everything it starts; ``token``
    ends with ``:`` so that no token is the prefix of another (see :func:`end_marked`)."""
    return {MARKER: token}


def end_marked(prefix: str) -> list[str]:
    """End every process (of this user, not this one) whose environment carries the marker
    with a value starting with ``prefix``, and wait (within :data:`END_DEADLINE_S`) until
    they are gone; describe them. One scan of /proc: for the pool, after it ended a rank
    that could not clean up after itself."""
    if not _LINUX:
        return []
    needle = f"\0{MARKER}={prefix}".encode()
    me, uid = os.getpid(), os.getuid()
    ended: list[str] = []
    killed: list[str] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = b"\0" + f.read()
        except OSError:
            continue
        st = _stat(entry)
        if needle in env and st is not None and st[1] != "Z":
            ended.append(_describe(int(entry)))
            killed.append(entry)
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + END_DEADLINE_S  # SIGKILL is delivered, not awaited
    while killed and time.monotonic() < deadline:
        killed = [p for p in killed if (st := _stat(p)) is not None and st[1] != "Z"]
        if killed:
            time.sleep(0.005)
    return ended
