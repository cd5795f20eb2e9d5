"""A hang diagnosed from the ranks' stacks, where there is no collective trace (``--no-trace``).

Under ``--no-trace`` the ranks run on plain process groups: no flight recorder says which
collective each rank waits in, so the desync diagnosis of :mod:`.watch` cannot run, and a
hang would cost the whole deadline. :class:`StackWatch` decides it from what remains:

- every live rank's process has used no more than :data:`~.watch.IDLE_CPU_S` of CPU for
  :data:`QUIET_S` (a rank blocked in Gloo's or NCCL's wait sleeps in the kernel; a
  computing one, or one starved by a loaded machine, shows CPU time within that);
- each live rank's main thread is inside torch's communication or autograd
  (:func:`blocked_in`): a torch.distributed collective, DDP, or the autograd engine that
  torch's C++ reducer waits under, never the candidate's or the user's own code (a
  ``time.sleep`` in a candidate keeps its deadline) nor a compiler waiting for its workers;
- two looks :data:`LOOK_S` apart find every such rank at the same frames, and no rank
  answered in between.

Then no rank can make the others progress: they wait for one another (or for a peer that
already answered, raised or died), and the job ends as TIMEOUT with each rank's stack,
seconds after the hang began rather than at the deadline. What is not known without the
trace (which collective, its size, its sequence number) is said to be unknown.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

from ddp_conformance.ranks.desync import Desync
from ddp_conformance.ranks.stacks import in_collective, innermost_frame, main_frames
from ddp_conformance.ranks.watch import IDLE_CPU_S, cpu_seconds

#: How long every live rank must be idle before its stack is looked at.
QUIET_S = 2.0
#: How far apart the two looks at the stacks are.
LOOK_S = 1.0
#: The parts of torch a rank waits for its peers in: torch.distributed, DDP, and the
#: autograd engine (the C++ reducer waits below ``backward``). Not the compilers (inductor
#: waits for its compile workers, other processes, without CPU time of its own).
_WAITS_IN = tuple(os.sep.join(("", "torch", *part)) for part in (
    ("distributed", ""), ("nn", "parallel", ""), ("autograd", ""), ("_tensor.py",)))


def blocked_in(stack: str) -> str | None:
    """Where a rank whose main thread waits in torch's communication or autograd waits
    (None: in other code, or the stack is unreadable): a torch.distributed collective, or
    DDP's or autograd's frames (the C++ reducer waits below Python, inside ``backward``)."""
    where = in_collective(stack)
    if where is not None:
        return where
    frames = main_frames(stack)
    if frames and any(part in frames[0]["path"] for part in _WAITS_IN):
        return innermost_frame(stack)
    return None


class StackWatch:
    """The no-trace counterpart of :class:`~.watch.JobWatch`: :meth:`poll` says when the
    live ranks hang for good, from CPU time and stacks (see the module docstring)."""

    def __init__(self, pids: dict[int, int],
                 stacks: Callable[[list[int]], dict[int, str]]) -> None:
        self.pids = pids
        self.stacks = stacks
        #: The stacks that decided the hang (the job's evidence: not taken again).
        self.taken: dict[int, str] = {}
        self._live: set[int] | None = None
        self._quiet_since = time.monotonic()
        self._cpu_mark: dict[int, float | None] = {}
        self._seen: dict[int, str] | None = None
        self._next_look = 0.0

    def structural(self, live: set[int], gone: dict[int, str]) -> Desync | None:
        return None  # no collective history: nothing is structural without time

    def poll(self, live: set[int], gone: dict[int, str], now: float) -> Desync | None:
        if live != self._live:
            self._restart(live, now)
            return None
        if now - self._quiet_since < QUIET_S or now < self._next_look:
            return None
        cpu = {r: cpu_seconds(self.pids[r]) for r in live}
        if any(v is None for v in cpu.values()) or any(
                (mark := self._cpu_mark.get(r)) is None or v - mark > IDLE_CPU_S  # type: ignore[operator]
                for r, v in cpu.items()):
            self._restart(live, now)  # a rank computes (or CPU time is unknown)
            return None
        self._next_look = now + LOOK_S
        stacks = self.stacks(sorted(live))
        where = {r: blocked_in(s) for r, s in stacks.items()}
        if not where or any(w is None for w in where.values()):
            self._restart(live, now)
            return None
        seen = {r: "\n".join(f"{f['path']}:{f['line']}" for f in main_frames(s))
                for r, s in stacks.items()}
        if seen != self._seen:
            self._seen = seen
            return None
        self.taken = stacks
        waits = "; ".join(f"rank {r} in {w}" for r, w in sorted(where.items()))
        peers = "; ".join(f"rank {r} {what}" for r, what in sorted(gone.items()))
        idle = now - self._quiet_since
        return Desync(f"every live rank has waited inside torch for {idle:.1f} s without CPU "
                      f"time (--no-trace: which collective, and its size, are unknown): "
                      f"{waits}" + (f"; {peers}" if peers else ""), "")

    def _restart(self, live: set[int], now: float) -> None:
        self._live = set(live)
        self._quiet_since = now
        self._cpu_mark = {r: cpu_seconds(self.pids[r]) for r in live}
        self._seen = None
        self._next_look = 0.0
