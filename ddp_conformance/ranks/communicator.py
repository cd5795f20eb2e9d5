"""One communicator for many jobs: the default group's backend, kept while it is sound.

A job used to create its default process group, and so its communicator, afresh. That is
what NCCL charges most for (``ncclCommInitRank`` per job: a case on NCCL with one rank
cost about twice one on Gloo/CPU, seen on an H100); Gloo connects a full mesh (about 2 ms
for 2 ranks here) and its destructor waits about 16 ms (measured, torch 2.13). A training
job creates one communicator and keeps it. So does the harness now, resetting state, not
the communicator: each job still gets a fresh default group (a new
:class:`~ddp_conformance.ranks.tracing.TracingProcessGroup`: Python state, sequence numbers
and flight-recorder keys start at zero) over the backend object of the previous job.

The rules, which keep every rank in agreement (creating a communicator is collective: a
rank that reused one while a peer created one would wait for it in the store):

- The parent names a *generation* in every traced job (``Job.communicator``); every rank
  gets the same name. A rank reuses the backend created under that name, backend and
  collective timeout; otherwise it lets its old one go (to the reaper) and creates one.
- After a job, each rank reports its default group's :class:`CommState`: how many
  collectives it issued there and whether every one completed.
- The parent (:class:`Generations`) keeps the name only when every rank answered ``Done``
  with the same count and nothing in flight, so that no collective of the finished job can
  pair with one of the next (Gloo pairs collectives by a per-group tag counter, NCCL by
  their order). Anything else (a rank raised, crashed, timed out or was replaced: a
  process that starts has no communicator) starts a new generation.
- Subgroups a scenario creates (``new_group``) are created per job; so are the groups of
  untraced jobs (``RankPool.call``), which name no generation.

A rank's state is process-wide (:data:`COMMUNICATORS`), as the trace is (``TRACER``):
c10d calls the registered creator, which has no other way to reach the rank.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CommState:
    """A rank's default group after a job: collectives ``issued`` on it, and whether all of
    them completed (``quiet``)."""

    issued: int
    quiet: bool


def sound(states: dict[int, CommState], world_size: int) -> bool:
    """Whether the communicator that every rank reported on (``states``, by rank) may serve
    the next job: every rank reported, all quiet, all issued the same number."""
    return (len(states) == world_size and all(s.quiet for s in states.values())
            and len({s.issued for s in states.values()}) == 1)


class Generations:
    """The parent's side: the generation name to put in each job (see the module docstring)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._number = 0

    @property
    def started(self) -> int:
        """Generations started so far (communicators each rank created, at most)."""
        return self._number + 1

    def name(self) -> str:
        """The name for the next job ('' when reuse is off: every job creates its own)."""
        return f"comm{self._number}" if self.enabled else ""

    def renew(self) -> None:
        """Start a new generation: the next job's ranks create a communicator."""
        self._number += 1

    def settle(self, done: bool, states: dict[int, CommState], world_size: int) -> None:
        """After a job: keep the generation only if the job was ``done`` on every rank and
        its communicator is :func:`sound`."""
        if not (done and sound(states, world_size)):
            self.renew()


class CommunicatorCache:
    """A rank's side: at most one kept backend object, under (name, backend, timeout)."""

    def __init__(self) -> None:
        self._armed: tuple[str, str, float] | None = None
        self._key: tuple[str, str, float] | None = None
        self._backend: Any = None
        #: Communicators this rank created for default groups (kept or not).
        self.created = 0

    def arm(self, name: str, backend: str, timeout_s: float) -> Any:
        """Before a job creates its default group: the generation the parent named ('' for
        none), the backend and the job's collective timeout. Returns the kept backend
        object if it no longer serves (None otherwise), for the caller to let go."""
        self._armed = (name, backend, timeout_s) if name else None
        return self.drop() if self._key is not None and self._key != self._armed else None

    def default_backend(self, create: Callable[[], Any]) -> Any:
        """The backend object for the job's default group: the kept one, or ``create()``'s,
        kept when a generation is armed. Called by the tracing backend's creator, once per
        job, after :meth:`arm`."""
        if self._armed is not None and self._key == self._armed:
            return self._backend
        backend = create()
        self.created += 1
        if self._armed is not None:
            self._backend, self._key = backend, self._armed
        return backend

    def keeps(self, backend: Any) -> bool:
        """Whether ``backend`` is the kept one (it outlives the job's group)."""
        return backend is not None and backend is self._backend

    def drop(self) -> Any:
        """Forget the kept backend; return it (None if none) for the caller to let go."""
        backend, self._backend, self._key = self._backend, None, None
        return backend


#: The rank's kept communicator (see the module docstring).
COMMUNICATORS = CommunicatorCache()
