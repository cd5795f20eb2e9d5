"""The flight recorder without processes: the rank-side writer, the line format, the
parent-side incremental reader (ddp_conformance.ranks.flight)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ddp_conformance.ranks.desync import diagnose
from ddp_conformance.ranks.flight import FlightLog, FlightRecorder, Launch, RankFlight

LAUNCH_0 = "L 0 g 1 allreduce float32 10 backward 1 0"


def fed(*lines: str) -> RankFlight:
    flight = RankFlight()
    for line in lines:
        flight.feed(line)
    return flight


class FakeWork:
    """A c10d work whose completion the test decides (``done``; ``failed``: its
    ``is_completed`` raises). Asking for its future is counted, and an error: the recorder
    must observe completion without it."""

    def __init__(self, done: bool = False) -> None:
        self.done = done
        self.failed = False
        self.asked_future = 0

    def is_completed(self) -> bool:
        if self.failed:
            raise RuntimeError("peer closed the connection")
        return self.done

    def get_future(self) -> Any:
        self.asked_future += 1
        raise RuntimeError("ProcessGroup::Work::getFuture not implemented")


# -- RankFlight: the line format ----------------------------------------------------------


def test_feed_parses_group_and_launch_lines() -> None:
    flight = fed("G g 0,1,3", LAUNCH_0, "L 1 g 2 broadcast int64 7 forward 2 -1")
    assert flight.members == {"g": (0, 1, 3)}
    assert flight.at("g", 1) == Launch(0, "g", 1, "allreduce", "float32", 10, "backward", 1, 0)
    assert flight.at("g", 2) == Launch(1, "g", 2, "broadcast", "int64", 7, "forward", 2, -1)
    assert flight.at("g", 3) is None and flight.at("h", 1) is None
    assert flight.last_seq("g") == 2 and flight.last_seq("h") == 0
    assert [c.ident for c in flight.pending()] == [0, 1]


def test_completion_line_marks_done_and_error() -> None:
    flight = fed("G g 0,1", LAUNCH_0, "L 1 g 2 allreduce float32 10 backward 1 0")
    flight.feed("D 0 0")
    assert [c.ident for c in flight.pending()] == [1]
    assert flight.launches[0].done and not flight.launches[0].error
    flight.feed("D 1 1")
    assert flight.pending() == []
    assert flight.launches[1].done and flight.launches[1].error


def test_completion_of_unknown_id_is_ignored() -> None:
    """A late completion of the previous job's collective (its id was never read)."""
    flight = fed("G g 0,1", LAUNCH_0, "D 7 0")
    assert list(flight.launches) == [0]
    assert [c.ident for c in flight.pending()] == [0]


def test_blank_and_short_lines_are_ignored() -> None:
    flight = fed("", "   ", "L 0 g 1 allreduce", "D 0", "G g", "X 1 2 3")
    assert flight.launches == {} and flight.members == {} and flight.groups == {}


def test_launch_describe_and_where() -> None:
    launch = Launch(0, "g", 1, "allreduce", "float32", 310, "backward", 1, 0)
    assert launch.describe() == "allreduce(310 x float32)"
    assert launch.where() == "step 1, microbatch 0, backward"
    assert Launch(0, "g", 1, "broadcast", "float32", 3, "forward", 2, -1).where() \
        == "step 2, forward"
    assert Launch(0, "g", 1, "broadcast", "float32", 3, "wrap", -1, -1).where() == "wrap"


def test_launch_matches() -> None:
    base = Launch(0, "g", 1, "allreduce", "float32", 10, "backward", 1, 0)
    assert base.matches(Launch(5, "g", 1, "allreduce", "float32", 10, "forward", 3, 2))
    assert not base.matches(Launch(5, "g", 1, "broadcast", "float32", 10, "backward", 1, 0))
    assert not base.matches(Launch(5, "g", 1, "allreduce", "float16", 10, "backward", 1, 0))
    assert not base.matches(Launch(5, "g", 1, "allreduce", "float32", 11, "backward", 1, 0))
    a2a = Launch(0, "g", 1, "alltoall_base", "float32", 4, "backward", 1, 0)
    assert a2a.matches(Launch(1, "g", 1, "alltoall_base", "float32", 6, "backward", 1, 0))
    assert not a2a.matches(Launch(1, "g", 1, "alltoall_base", "int64", 4, "backward", 1, 0))


# -- FlightLog: the parent's incremental reader -------------------------------------------


def test_flight_log_reads_incrementally(tmp_path: Path) -> None:
    path = tmp_path / "rank0.flight"
    log = FlightLog(str(path))
    assert log.read() is False  # no file yet
    with open(path, "a") as f:
        f.write(f"G g 0,1\n{LAUNCH_0}\n")
    assert log.read() is True
    assert [c.ident for c in log.flight.pending()] == [0]
    assert log.read() is False  # nothing new
    with open(path, "a") as f:
        f.write("D 0 0\n")
    assert log.read() is True
    assert log.flight.pending() == [] and log.flight.launches[0].done


def test_flight_log_line_split_across_reads(tmp_path: Path) -> None:
    path = tmp_path / "rank0.flight"
    log = FlightLog(str(path))
    with open(path, "a") as f:
        f.write("G g 0,1\nL 0 g 1 allre")
    assert log.read() is True  # the G line is whole
    assert log.flight.members == {"g": (0, 1)} and log.flight.launches == {}
    with open(path, "a") as f:
        f.write("duce float32 ")
    assert log.read() is False  # still no whole line
    assert log.flight.launches == {}
    with open(path, "a") as f:
        f.write("10 backward 1 0\n")
    assert log.read() is True
    assert log.flight.launches == {
        0: Launch(0, "g", 1, "allreduce", "float32", 10, "backward", 1, 0)}
    assert log.read() is False


def test_flight_log_begin_forgets_previous_job(tmp_path: Path) -> None:
    path = tmp_path / "rank0.flight"
    log = FlightLog(str(path))
    with open(path, "a") as f:
        f.write(f"G g 0,1\n{LAUNCH_0}\n")
    log.read()
    with open(path, "a") as f:  # the previous job's, half read
        f.write("L 1 g 2 broad")
    assert log.read() is False
    with open(path, "a") as f:  # the previous job's, never read
        f.write("cast float32 10 backward 1 0\nL 2 g 3 broadcast float32 10 backward 1 0\n")
    log.begin()
    assert log.flight.launches == {} and log.flight.members == {}
    assert log.read() is False  # what was there before begin() is not this job's
    with open(path, "a") as f:
        f.write("G h 0,1\nD 0 0\nL 3 h 1 allgather float32 4 forward 0 0\n")
    assert log.read() is True
    assert list(log.flight.launches) == [3]  # the late D of id 0 is ignored
    assert log.flight.members == {"h": (0, 1)}
    assert [c.ident for c in log.flight.pending()] == [3]


# -- FlightRecorder: the rank side, end to end --------------------------------------------


def test_recorder_lines_and_completions(tmp_path: Path) -> None:
    path = tmp_path / "rank0.flight"
    rec = FlightRecorder(str(path))
    rec.group("g", (0, 1))
    ok = FakeWork()
    rec.launched("g", 1, "allreduce", "float32", 10, "backward", 1, 0, ok)
    assert rec.pending() == 1
    assert not rec.settle(0.05)  # polled, still running
    assert path.read_text() == f"G g 0,1\n{LAUNCH_0}\n"
    ok.done = True
    assert rec.settle(5.0) and rec.pending() == 0
    assert path.read_text().endswith(f"{LAUNCH_0}\nD 0 0\n")

    failed = FakeWork()
    rec.launched("g", 2, "broadcast", "int64", 3, "forward", 2, -1, failed)
    assert rec.pending() == 1
    failed.failed = True
    assert rec.settle(5.0) and rec.pending() == 0
    assert path.read_text().endswith("L 1 g 2 broadcast int64 3 forward 2 -1\nD 1 1\n")
    assert ok.asked_future == failed.asked_future == 0  # never asked for a future


def test_recorder_work_that_cannot_say_completes_at_once(tmp_path: Path) -> None:
    path = tmp_path / "rank0.flight"
    rec = FlightRecorder(str(path))
    rec.launched("g", 1, "barrier", "-", 0, "wrap", -1, -1, object())  # no is_completed
    assert rec.pending() == 0
    rec.launched("g", 2, "barrier", "-", 0, "wrap", -1, -1, None)  # no work at all
    assert rec.pending() == 0
    assert path.read_text() == ("L 0 g 1 barrier - 0 wrap -1 -1\nD 0 0\n"
                                "L 1 g 2 barrier - 0 wrap -1 -1\nD 1 0\n")
    flight = fed(*path.read_text().splitlines())
    assert flight.pending() == [] and flight.at("g", 2).kind == "barrier"


def test_recorder_already_completed_work(tmp_path: Path) -> None:
    path = tmp_path / "rank0.flight"
    rec = FlightRecorder(str(path))
    work = FakeWork(done=True)
    rec.launched("g", 1, "allreduce", "float32", 10, "backward", 1, 0, work)
    assert rec.pending() == 0  # seen at launch, on the caller's thread
    assert path.read_text() == f"{LAUNCH_0}\nD 0 0\n"
    assert work.asked_future == 0


def test_recorder_to_flight_log_to_diagnosis(tmp_path: Path) -> None:
    """Two ranks' recorders, read by the parent: rank 0 waits in an allreduce at #2 where
    rank 1 issued a broadcast; once both complete, nothing is stuck."""
    recorders = {r: FlightRecorder(str(tmp_path / f"rank{r}.flight")) for r in (0, 1)}
    logs = {r: FlightLog(str(tmp_path / f"rank{r}.flight")) for r in (0, 1)}
    for log in logs.values():
        log.begin()
    works = {}
    for rank, rec in recorders.items():
        rec.group("g", (0, 1))
        rec.launched("g", 1, "allreduce", "float32", 10, "backward", 1, 0, FakeWork(done=True))
        works[rank] = FakeWork()
        kind = "allreduce" if rank == 0 else "broadcast"
        rec.launched("g", 2, kind, "float32", 10, "backward", 1, 1, works[rank])
    assert all(log.read() for log in logs.values())
    flights = {r: log.flight for r, log in logs.items()}
    assert [c.seq for c in flights[0].pending()] == [2]
    found = diagnose(flights, {0, 1}, {})
    assert found is not None
    assert found.summary == (
        "desync: rank 0 waits in allreduce(10 x float32) #2 of group g "
        "(step 1, microbatch 1, backward); rank 1 waits in broadcast(10 x float32) #2 of "
        "group g (step 1, microbatch 1, backward); the streams differ first at #2 of group g")
    for work in works.values():
        work.done = True
    assert all(rec.settle(5.0) for rec in recorders.values())
    assert all(log.read() for log in logs.values())
    assert all(f.pending() == [] for f in flights.values())
    assert diagnose(flights, {0, 1}, {}) is None


def test_settle_waits_for_work_in_flight_and_has_a_deadline(tmp_path: Path) -> None:
    import threading

    recorder = FlightRecorder(str(tmp_path / "flight"))
    work = FakeWork()
    recorder.launched("0", 1, "allreduce", "float32", 4, "backward", 0, 0, work)
    assert recorder.pending() == 1
    assert not recorder.settle(0.05), "settled with a collective in flight"
    threading.Timer(0.05, lambda: setattr(work, "done", True)).start()
    assert recorder.settle(5.0)
    assert recorder.pending() == 0


def test_poller_backs_off_and_stamps_completion() -> None:
    """A long-running work is asked less and less often (a quarter of its age, within the
    floor and cap); its completion time is when the poll saw it, after it completed."""
    import time

    from ddp_conformance.ranks.flight import CompletionPoller

    class Counted(FakeWork):
        asked = 0

        def is_completed(self) -> bool:
            Counted.asked += 1
            return super().is_completed()

    poller = CompletionPoller()
    work = Counted()
    seen: list[tuple[float, bool]] = []
    assert poller.watch(work, lambda when, error: seen.append((when, error)), 0.001, 0.02)
    time.sleep(0.3)
    assert seen == [] and poller.watching() == 1
    # 0.3 s at most every 1 ms would be 300 queries; a quarter of the age, ~ 20
    assert 3 <= Counted.asked < 60, Counted.asked
    finished = time.perf_counter()
    work.done = True
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(seen) == 1 and seen[0][1] is False
    assert finished <= seen[0][0] <= finished + 0.05
    assert poller.watching() == 0 and work.asked_future == 0
    assert not poller.watch(None, lambda when, error: None)  # cannot say: not watched


def test_a_work_that_cannot_say_is_not_polled() -> None:
    """A Python ``Work`` that only overrides ``wait`` answers ``is_completed()`` False
    forever: polling it would show its rank waiting there for good."""
    import torch.distributed as dist

    from ddp_conformance.ranks.flight import can_say

    class WaitOnly(dist.Work):
        def wait(self, timeout: Any = None) -> bool:
            return True

    class Answers(WaitOnly):
        def is_completed(self) -> bool:
            return True

    assert not can_say(WaitOnly()) and not can_say(None) and not can_say(object())
    assert can_say(Answers()) and can_say(FakeWork()) and can_say(dist.Work())
