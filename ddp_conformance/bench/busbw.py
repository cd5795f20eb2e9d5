"""Bandwidth arithmetic as nccl-tests report it, and a tracing process group.

``algbw = bytes / time``; for allreduce ``busbw = algbw * 2 (n - 1) / n``: each rank sends
and receives 2 (n - 1) / n of the buffer in a ring, so busbw is comparable with the link
speed whatever the world size.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


def algbw(nbytes: float, seconds: float) -> float:
    """Bytes per second moved from the user's point of view."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return nbytes / seconds


def busbw(nbytes: float, seconds: float, world_size: int) -> float:
    """Allreduce bus bandwidth in bytes per second (nccl-tests' definition)."""
    if world_size < 1:
        raise ValueError(f"world size must be positive, got {world_size}")
    return algbw(nbytes, seconds) * 2 * (world_size - 1) / world_size


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end]`` intervals (overlapping ones count once)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


@dataclass
class Event:
    kind: str
    nbytes: int
    launched: float
    done: float | None = None


class TracingPG(dist.ProcessGroup):
    """Forwards to a real group; logs every collective (kind, bytes, launch time) and,
    with ``completions`` on, its completion time. Torch's C++ reducer calls it too."""

    def __init__(self, inner: dist.ProcessGroup) -> None:
        super().__init__(inner.rank(), inner.size())  # type: ignore[call-arg]
        self.inner = inner
        self.events: list[Event] = []
        self.completions = False

    def getBackendName(self) -> str:
        return "tracing"

    def _record(self, kind: str, tensors: Any, launched: float, work: Any) -> Any:
        event = Event(kind, sum(t.numel() * t.element_size() for t in tensors), launched)
        self.events.append(event)
        if self.completions:
            def done(_: Any, event: Event = event) -> None:
                event.done = time.perf_counter()

            work.get_future().add_done_callback(done)
        return work

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        t = time.perf_counter()
        work = self.inner.allreduce(tensors) if opts is None else self.inner.allreduce(tensors, opts)
        return self._record("allreduce", tensors, t, work)

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:  # type: ignore[override]
        t = time.perf_counter()
        work = self.inner.broadcast(tensors) if opts is None else self.inner.broadcast(tensors, opts)
        return self._record("broadcast", tensors, t, work)

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:  # type: ignore[override]
        t = time.perf_counter()
        work = self.inner.allgather(outputs, inputs) if opts is None else \
            self.inner.allgather(outputs, inputs, opts)
        return self._record("allgather", inputs, t, work)

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events
