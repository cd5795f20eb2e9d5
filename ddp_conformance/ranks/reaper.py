"""Destroying a job's process groups off the job's critical path.

Dropping the last reference to a Gloo process group runs its C++ destructor, which joins
the group's worker threads and closes its connections: about 20 ms of waiting (not of
CPU; measured on torch 2.13, 2 ranks on this machine) per job, the largest single cost of
a small job. torch releases the GIL while it destroys a process group, so the wait can
overlap the next job when another thread drops the reference.

:class:`GroupReaper` is that thread. It only ever receives groups that
:meth:`RankRuntime.cleanup <ddp_conformance.ranks.runtime.RankRuntime.cleanup>` kept for a
whole job after destroying them, so no Gloo callback can still hold one (the reason those
groups are kept; see there): the last reference is dropped here, never on a backend
thread. Groups are destroyed one at a time, in the order they were retired.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any

#: How long :meth:`GroupReaper.drain` waits for groups still being destroyed.
DRAIN_TIMEOUT_S = 30.0


class GroupReaper:
    """A daemon thread that drops the groups handed to :meth:`retire`."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[list[Any], bool]] = queue.Queue()
        self._thread: threading.Thread | None = None

    @property
    def ident(self) -> int | None:
        """The thread's ident, None before the first :meth:`retire` starts it."""
        return self._thread.ident if self._thread is not None else None

    def retire(self, groups: list[Any], shut_down: bool = False) -> None:
        """Take ``groups`` (the caller keeps no reference; Nones are skipped) and destroy
        them in the background; ``shut_down``: call their ``shutdown()`` first, as
        ``destroy_process_group`` does (for a kept communicator, which no
        ``destroy_process_group`` shut down: NCCL's aborts its communicator there)."""
        groups = [g for g in groups if g is not None]
        if not groups:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ddp-conformance-reaper",
                                            daemon=True)
            self._thread.start()
        self._queue.put((groups, shut_down))

    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Wait until every retired group is destroyed: True, or False after ``timeout_s``.

        Called before a rank exits (a process that ends while a group's destructor runs
        on this thread aborts in C++) and before :meth:`RankRuntime.release
        <ddp_conformance.ranks.runtime.RankRuntime.release>` counts what is still alive.
        """
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
        return True

    def _loop(self) -> None:
        while True:
            groups, shut_down = self._queue.get()
            if shut_down:
                _shut_down(groups)
            del groups  # the last reference: the destructors run here
            self._queue.task_done()


def _shut_down(groups: list[Any]) -> None:
    for group in groups:
        try:
            group.shutdown()
        except Exception:  # noqa: BLE001 - it goes anyway, by its last reference
            pass
