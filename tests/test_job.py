"""The job's transitions (ranks/job.py), on their own: no process, the answers made by hand.

The pools' tests (test_pool.py, test_desync.py, test_torchrun.py) run the same transitions
on real ranks; these pin the rules the status and the deadlines follow."""
from __future__ import annotations

import time

import pytest

from ddp_conformance.ranks.communicator import CommState, Generations
from ddp_conformance.ranks.desync import Desync
from ddp_conformance.ranks.job import (
    CRASH_GRACE_S,
    RAISE_GRACE_S,
    CallsFunctions,
    JobRun,
    call_job,
    finished,
)
from ddp_conformance.ranks.leaks import Hygiene
from ddp_conformance.ranks.messages import Done, Job, Raised
from ddp_conformance.ranks.outcome import Outcome

PEER_FAILED = "RuntimeError: Connection closed by peer"


def _dispatched(world_size: int = 2, timeout_s: float = 60.0, trace: bool = True,
                generations: Generations | None = None) -> tuple[JobRun, Job]:
    job = Job("scenario", "", timeout_s, trace=trace)
    state = JobRun(world_size)
    state.dispatch(job, 7, generations or Generations(), timeout_s)
    return state, job


def test_dispatch_names_the_job_and_starts_its_deadline() -> None:
    before = time.monotonic()
    state, job = _dispatched(timeout_s=30.0)
    assert job.store_prefix == "job7"
    assert job.communicator == Generations().name()
    assert before + 30.0 <= state.deadline <= time.monotonic() + 30.0
    _, untraced = _dispatched(trace=False)
    assert untraced.communicator == ""  # untraced jobs name no generation


def test_every_rank_done_is_done() -> None:
    state, _ = _dispatched()
    assert state.answer(0, Done(0, "a")) is False
    assert state.waiting(time.monotonic())
    assert state.answer(1, Done(1, "b")) is False
    assert not state.waiting(time.monotonic())
    out = state.conclude(Generations())
    assert (out.status, out.results) == ("done", {0: "a", 1: "b"})


def test_a_rank_that_retires_leaves_after_answering() -> None:
    state, _ = _dispatched()
    assert state.answer(0, Done(0, None, hygiene=Hygiene(retired=("patched",)))) is True


def test_a_rank_that_finished_after_a_refusal_says_what_it_raised() -> None:
    """Where the scenario allows a refusal, a rank that raised answers Done with its record's
    ``raised``: a peer left waiting on it is told that rank refused, not only that it
    finished (the desync line names the rank and its error)."""
    from ddp_conformance.ranks.records import RankRecord

    state, _ = _dispatched()
    state.answer(1, Done(1, RankRecord(1, raised="RuntimeError: rank 1 fails\nmore")))
    assert state.gone[1] == ("finished the job after raising RuntimeError: rank 1 fails "
                             "(a refusal the scenario allows)")
    state.answer(0, Done(0, RankRecord(0)))
    assert state.gone[0] == "finished the job"
    assert finished("a call's return value") == "finished the job"
    assert finished(RankRecord(0, raised="E: " + "x" * 200)).count("x") == 114


def test_a_raise_starts_the_release_grace_and_marks_the_rank() -> None:
    state, _ = _dispatched()
    assert state.answer(0, Raised(0, "ValueError: x", stays=True)) is False
    assert state.raised_here == {0} and state.gone[0] == "raised"
    assert state.release_at is not None
    now = time.monotonic()
    assert not state.release_due(now, lambda: False)  # within the grace, nobody waits
    assert state.release_due(now, lambda: True)  # the trace shows a peer waiting
    assert state.release_due(state.release_at, lambda: False)  # the grace is over
    assert state.release(now) == {0}
    assert state.releasing == {0} and not state.raised_here
    assert state.deadline <= now + RAISE_GRACE_S
    state.answer(1, Raised(1, PEER_FAILED, stays=True))
    assert state.conclude(Generations()).status == "raised"


def test_a_raise_that_leaves_is_not_released() -> None:
    state, _ = _dispatched()
    assert state.answer(0, Raised(0, "ValueError: x", stays=False)) is True
    assert state.gone[0] == "raised and left" and not state.raised_here
    assert not state.release_due(float("inf"), lambda: True)


def test_an_echo_of_a_peer_failure_starts_no_grace() -> None:
    state, _ = _dispatched()
    state.answer(1, Raised(1, PEER_FAILED, stays=True))
    assert state.release_at is None and not state.raised_here


def test_the_grace_ends_once_and_shortens_the_deadline() -> None:
    state, _ = _dispatched(timeout_s=600.0)
    state.answer(0, Raised(0, "ValueError: x", stays=False))
    assert state.release_at is not None
    assert not state.expire_grace(state.release_at - 0.5)
    at = state.release_at
    assert state.expire_grace(at)
    assert state.deadline == pytest.approx(at + RAISE_GRACE_S)
    assert state.release_at is None and not state.expire_grace(at + 1)


def test_a_death_is_a_crash_and_shortens_the_deadline_unless_between_jobs() -> None:
    state, _ = _dispatched(timeout_s=600.0)
    state.died(1, -11, "log tail", grace=False)
    assert state.deadline > time.monotonic() + 500
    state.died(0, 3, "")
    assert state.deadline <= time.monotonic() + CRASH_GRACE_S
    assert state.gone == {1: "died (signal SIGSEGV (11))", 0: "died (exit code 3)"}
    out = state.conclude(Generations())
    assert out.status == "crash" and out.exit_codes == {1: -11, 0: 3}
    assert out.logs[1] == "log tail"


def test_a_crash_outranks_a_raise_and_a_raise_a_timeout() -> None:
    state, _ = _dispatched(world_size=3)
    state.answer(0, Raised(0, "ValueError: x", stays=True))
    assert state.conclude(Generations()).status == "raised"  # rank 1 and 2 never answered
    state.died(1, 1, "")
    assert state.conclude(Generations()).status == "crash"


def test_a_missing_answer_is_a_timeout() -> None:
    state, _ = _dispatched(timeout_s=0.0)
    state.answer(0, Done(0, None))
    assert not state.waiting(time.monotonic())
    assert state.conclude(Generations()).status == "timeout"


def test_a_desync_ends_the_wait_as_a_timeout() -> None:
    state, _ = _dispatched()
    assert state.watching()
    found = Desync("rank 0 waits in allreduce, rank 1 in broadcast", "")
    state.desync(found)
    assert not state.waiting(time.monotonic())
    out = state.conclude(Generations())
    assert out.status == "timeout" and out.desync is found


def test_no_desync_is_looked_for_once_a_rank_raised() -> None:
    state, _ = _dispatched()
    state.answer(0, Raised(0, "ValueError: x", stays=True))
    assert not state.watching()


def test_the_wake_is_the_nearest_of_deadline_poll_and_grace() -> None:
    state, _ = _dispatched(timeout_s=60.0)
    now = time.monotonic()
    assert state.wake(now, None) == pytest.approx(state.deadline - now)
    assert state.wake(now, 0.1) == 0.1
    state.answer(0, Raised(0, "ValueError: x", stays=True))
    assert state.release_at is not None
    assert state.wake(now, None) <= state.release_at - now + 1e-9


def test_a_traced_job_settles_its_communicator_generation() -> None:
    generations = Generations()
    state, job = _dispatched(generations=generations)
    first = job.communicator
    state.answer(0, Raised(0, "ValueError: x", stays=True))
    state.answer(1, Done(1, None))
    state.conclude(generations)
    assert generations.name() != first  # not done: the generation is not reused
    generations_done = Generations()
    state, job = _dispatched(generations=generations_done)
    name = job.communicator
    for rank in (0, 1):
        state.answer(rank, Done(rank, None, communicator=CommState(issued=1, quiet=True)))
    state.conclude(generations_done)
    assert generations_done.name() == name  # a sound generation is kept


class _Transport(CallsFunctions):
    """A pool whose ``run`` answers with a prepared outcome (``call`` is under test)."""

    def __init__(self, out: Outcome) -> None:
        self.world_size = 2
        self.out = out
        self.jobs: list[Job] = []

    def run(self, job: Job, timeout_s: float) -> Outcome:
        self.jobs.append(job)
        return self.out


def test_call_is_untraced_and_returns_results_in_rank_order() -> None:
    pool = _Transport(Outcome("done", results={1: "b", 0: "a"}))
    assert pool.call("m:f", 1, 2, timeout_s=5.0) == ["a", "b"]
    (job,) = pool.jobs
    assert (job.kind, job.function, job.args, job.trace) == ("call", "m:f", (1, 2), False)
    assert call_job("m:f", (), 1.0).trace is False


def test_call_raises_the_account_of_a_failed_job() -> None:
    pool = _Transport(Outcome("raised", tracebacks={0: "ValueError: nope"}))
    with pytest.raises(RuntimeError, match="rank 0 raised:\nValueError: nope"):
        pool.call("m:f")

