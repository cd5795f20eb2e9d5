"""One job on the ranks, from its dispatch to its status: the bookkeeping both pools share.

A transport (the rank pool's sockets, torchrun's store) moves the messages; a
:class:`JobRun` keeps what they mean and decides how the job ends. Its transitions, in
the order a job meets them:

- :meth:`JobRun.dispatch`: the job is numbered, named for the store and given its
  communicator generation (traced jobs only); the deadline starts;
- :meth:`JobRun.answer`: a rank answered (:class:`Done` or :class:`Raised`), or
  :meth:`JobRun.died`: its process ended (the others then get :data:`CRASH_GRACE_S`);
- :meth:`JobRun.release`: ranks that raised and stayed are to let the job's groups go,
  because peers wait on them (the trace says so, or :data:`RAISE_GRACE_S` passed); the
  others get :data:`RAISE_GRACE_S` more. :meth:`JobRun.expire_grace`: the grace after a
  raise passed with no rank to release: the deadline shrinks to one more grace;
- :meth:`JobRun.desync`: the watch found the ranks' streams can never match again: the
  job ends now;
- :meth:`JobRun.conclude`: the status, decided once from what happened: ``crash`` if a
  rank died, else ``raised`` if one raised, else ``timeout`` if some rank never answered,
  else ``done``.

:class:`CallsFunctions` is ``call`` for any pool with a ``run``: the same job (untraced)
and the same error on either transport.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ddp_conformance.ranks.communicator import Generations
from ddp_conformance.ranks.desync import Desync
from ddp_conformance.ranks.messages import Answer, Done, Job, Raised
from ddp_conformance.ranks.outcome import Outcome, describe_exit, describe_outcome

#: After a rank raised, how long peers that the trace cannot show waiting on it get to
#: answer before that rank is told to leave (which releases any peer blocked on it).
RAISE_GRACE_S = 2.0
#: After a rank died (or left), how long the others get: they are usually released at once.
CRASH_GRACE_S = 2.0


class JobRun:
    """The state of one job (see the module docstring); ``out`` is filled as it goes."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.out = Outcome("done")
        #: Ranks that have not answered yet.
        self.pending: set[int] = set(range(world_size))
        #: Ranks that answered or died, with what they did (for the desync diagnosis).
        self.gone: dict[int, str] = {}
        #: Ranks that raised and stayed: peers may wait on them until they let go.
        self.raised_here: set[int] = set()
        #: Ranks told to let go (:meth:`release`), whose answer is still to come.
        self.releasing: set[int] = set()
        self.release_at: float | None = None
        self.started = time.monotonic()
        self.deadline = self.started
        self.desynced = False
        #: The communicator generation the job names ('' for none).
        self.communicator = ""

    # -- transitions ------------------------------------------------------------------

    def dispatch(self, job: Job, number: int, communicators: Generations,
                 timeout_s: float) -> None:
        """The job is about to reach the ranks: it is job ``number`` of its pool (its store
        keys), names the communicator generation it may reuse (traced jobs only), and its
        deadline starts now."""
        job.store_prefix = f"job{number}"
        job.communicator = communicators.name() if job.trace else ""
        self.communicator = job.communicator
        self.started = time.monotonic()
        self.deadline = self.started + timeout_s

    def answer(self, rank: int, answer: Answer) -> bool:
        """Rank ``rank`` answered; True when it leaves the pool after answering (the
        transport then waits for its process to end)."""
        self.pending.discard(rank)
        failed_here = self.out.record(answer)
        if isinstance(answer, Done):
            self.gone[rank] = finished(answer.result)
            return answer.hygiene.retire
        assert isinstance(answer, Raised), answer
        self.gone[rank] = "raised" if answer.stays else "raised and left"
        if answer.stays and failed_here:
            self.raised_here.add(rank)
        if failed_here and self.release_at is None:
            self.release_at = time.monotonic() + RAISE_GRACE_S
        return not answer.stays

    def died(self, rank: int, exit_code: int, log: str, grace: bool = True) -> None:
        """Rank ``rank``'s process ended (``exit_code``; ``log``: the end of its log); the
        others get :data:`CRASH_GRACE_S` more unless ``grace`` is False (it died between
        jobs: the job never reached it)."""
        self.pending.discard(rank)
        self.out.exit_codes[rank] = exit_code
        self.out.logs[rank] = log
        self.gone[rank] = f"died ({describe_exit(exit_code)})"
        if grace:
            self.deadline = min(self.deadline, time.monotonic() + CRASH_GRACE_S)

    def release_due(self, now: float, peers_wait: Callable[[], bool]) -> bool:
        """Whether ranks that raised and stayed must let go now: the grace after the raise
        passed, or ``peers_wait()`` (asked only before that) says peers wait on them."""
        return bool(self.raised_here) and self.release_at is not None and (
            now >= self.release_at or peers_wait())

    def release(self, now: float) -> set[int]:
        """The ranks to tell to let go (they answer later); the others get one more grace."""
        ranks, self.raised_here = self.raised_here, set()
        self.releasing |= ranks
        self.deadline = min(self.deadline, now + RAISE_GRACE_S)
        return ranks

    def expire_grace(self, now: float) -> bool:
        """If the grace after a raise is over (no rank to release): one more grace for the
        others, once. True when it was."""
        if self.release_at is None or now < self.release_at:
            return False
        self.deadline = min(self.deadline, now + RAISE_GRACE_S)
        self.release_at = None
        return True

    def desync(self, found: Desync) -> None:
        """The ranks can never match again: the job ends now (as a timeout)."""
        self.out.desync = found
        self.desynced = True

    def conclude(self, communicators: Generations) -> Outcome:
        """The job is over: its status and time, and whether its communicators may be
        reused (traced jobs that ended done)."""
        out = self.out
        out.elapsed_s = time.monotonic() - self.started
        if out.exit_codes:
            out.status = "crash"
        elif out.tracebacks:
            out.status = "raised"
        elif self.pending:
            out.status = "timeout"
        if self.communicator:
            communicators.settle(out.status == "done", out.communicators, self.world_size)
        return out

    # -- questions ----------------------------------------------------------------------

    def waiting(self, now: float) -> bool:
        """Whether to wait for more answers: some are missing, time is left, no desync."""
        return bool(self.pending) and now < self.deadline and not self.desynced

    def wake(self, now: float, poll_s: float | None) -> float:
        """How long the transport may wait for answers before the next look: the deadline,
        the end of the grace after a raise, and ``poll_s`` (a watch to poll) if given."""
        wake = self.deadline - now
        if poll_s is not None:
            wake = min(wake, poll_s)
        if self.release_at is not None:
            wake = min(wake, max(0.0, self.release_at - now))
        return wake

    def watching(self) -> bool:
        """Whether a desync may still be diagnosed: no rank raised or died (then the
        streams say why, not that they hang)."""
        return not self.out.tracebacks and not self.out.exit_codes


def finished(result: Any) -> str:
    """What a rank that answered :class:`Done` did, for the desync diagnosis: "finished the
    job", and what it raised first where the scenario allows a refusal (its record's
    ``raised``): a peer left waiting then hangs on a rank that refused, and the line says so."""
    raised = getattr(result, "raised", "")
    if not isinstance(raised, str) or not raised.strip():
        return "finished the job"
    first = raised.strip().splitlines()[0]
    first = first if len(first) <= 120 else first[:117] + "..."
    return f"finished the job after raising {first} (a refusal the scenario allows)"


def call_job(function: str, args: tuple[Any, ...], timeout_s: float) -> Job:
    """The job of ``call``: ``function(rank, world_size, *args)`` on every rank, untraced
    (what the backend itself does; it names no communicator generation)."""
    return Job("call", "", timeout_s, function=function, args=args, trace=False)


class CallsFunctions:
    """``call`` for a pool that has ``run`` and ``world_size`` (both pools)."""

    world_size: int

    def run(self, job: Job, timeout_s: float) -> Outcome:
        raise NotImplementedError

    def call(self, function: str, *args: Any, timeout_s: float = 120.0) -> list[Any]:
        """Run ``function(rank, world_size, *args)`` on every rank; return the results in
        rank order. A job that does not end done raises :class:`RuntimeError` with its
        account (:func:`~ddp_conformance.ranks.outcome.describe_outcome`)."""
        out = self.run(call_job(function, args, timeout_s), timeout_s)
        if out.status != "done":
            raise RuntimeError(describe_outcome(out))
        return [out.results[r] for r in range(self.world_size)]
