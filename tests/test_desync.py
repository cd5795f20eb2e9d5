"""The hang diagnosis without processes: desync (the structural condition), watch (the time
and CPU condition) and stacks (reading a faulthandler dump).

Ranks' collective streams are built from compact specs (see :func:`job`) and fed to
``RankFlight`` as the flight recorder's lines."""
from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ddp_conformance.ranks import watch as watch_module
from ddp_conformance.ranks.desync import (
    creation_hang,
    diagnose,
    first_difference,
    mismatch,
    streams,
)
from ddp_conformance.ranks.flight import FlightLog, RankFlight
from ddp_conformance.ranks.stacks import in_collective, in_group_creation, innermost_frame
from ddp_conformance.ranks.watch import (
    DESYNC_QUIET_S,
    FINAL_LOOKS,
    IDLE_CPU_S,
    JobWatch,
    cpu_seconds,
)

_ITEM = re.compile(r"(?:(?P<group>\w+):)?(?P<kind>[a-z_]+?)(?:x(?P<numel>\d+))?"
                   r"(?:/(?P<dtype>\w+))?(?P<pending>\?)?")
#: Where every collective of a spec is launched (as ``Launch.where`` says it).
WHERE = "step 1, microbatch 0, backward"


def lines(spec: str, groups: dict[str, tuple[int, ...]], first_id: int = 0) -> list[str]:
    """One rank's flight lines from a spec: items ``[group:]kind[x<numel>][/<dtype>][?]``
    separated by spaces, in launch order (group ``g``, 10 x float32 by default; ``?``: still
    pending, else completed). Every group in ``groups`` gets its ``G`` line first."""
    out = [f"G {g} {','.join(map(str, members))}" for g, members in groups.items()]
    seqs: dict[str, int] = {}
    done = []
    for ident, item in enumerate(spec.split(), start=first_id):
        m = _ITEM.fullmatch(item)
        assert m is not None, item
        group = m["group"] or "g"
        seqs[group] = seqs.get(group, 0) + 1
        out.append(f"L {ident} {group} {seqs[group]} {m['kind']} {m['dtype'] or 'float32'} "
                   f"{m['numel'] or 10} backward 1 0")
        if not m["pending"]:
            done.append(f"D {ident} 0")
    return out + done


def job(specs: dict[int, str],
        groups: dict[str, tuple[int, ...]] | None = None) -> dict[int, RankFlight]:
    """Every rank's RankFlight from its spec; ``groups`` default: ``g`` of all the ranks."""
    groups = {"g": tuple(sorted(specs))} if groups is None else groups
    flights = {}
    for rank, spec in specs.items():
        flights[rank] = RankFlight()
        for line in lines(spec, {g: m for g, m in groups.items() if rank in m}):
            flights[rank].feed(line)
    return flights


def test_spec_helper() -> None:
    assert lines("allreduce b:broadcastx3/int64? allreduce?", {"g": (0, 1)}) == [
        "G g 0,1",
        "L 0 g 1 allreduce float32 10 backward 1 0",
        "L 1 b 1 broadcast int64 3 backward 1 0",
        "L 2 g 2 allreduce float32 10 backward 1 0",
        "D 0 0"]
    flight = job({0: "alltoall_basex4?"})[0]
    assert flight.at("g", 1).kind == "alltoall_base" and flight.at("g", 1).numel == 4


# -- diagnose: desyncs ---------------------------------------------------------------------


def test_different_kinds_at_same_seq() -> None:
    flights = job({0: "allreduce allreduce?", 1: "allreduce broadcast?"})
    found = diagnose(flights, {0, 1}, {})
    assert found is not None
    assert found.summary == (
        f"desync: rank 0 waits in allreduce(10 x float32) #2 of group g ({WHERE}); "
        f"rank 1 waits in broadcast(10 x float32) #2 of group g ({WHERE}); "
        "the streams differ first at #2 of group g")
    rows = found.detail.splitlines()
    assert rows[0] == "group g (ranks 0, 1), collectives #1-#2 of 2:"
    assert rows[1].split() == ["rank", "0", "|", "rank", "1"]
    assert rows[2].startswith("     1  allreduce(10 x float32)")
    assert "[waits]" not in rows[2]
    assert rows[3].startswith(">>   2  allreduce(10 x float32) step 1, microbatch 0, "
                              "backward [waits] | broadcast(10 x float32)")
    assert rows[3].count("[waits]") == 2
    assert len(rows) == 4


@pytest.mark.parametrize("theirs, said", [
    ("allreducex20?", "allreduce(20 x float32)"),
    ("allreduce/float16?", "allreduce(10 x float16)"),
    ("alltoallx6/int64?", "alltoall(6 x int64)"),
])
def test_same_kind_different_numel_or_dtype(theirs: str, said: str) -> None:
    ours = "alltoallx4?" if theirs.startswith("alltoall") else "allreduce?"
    flights = job({0: ours, 1: theirs})
    found = diagnose(flights, {0, 1}, {})
    assert found is not None
    assert f"; rank 1 waits in {said} #1 of group g ({WHERE});" in found.summary
    assert found.summary.endswith("the streams differ first at #1 of group g")
    evidence = mismatch(flights)
    assert evidence is not None and f"rank 1 issued {said}" in evidence.summary


@pytest.mark.parametrize("kind", ["alltoall", "alltoall_base"])
def test_uneven_splits_are_no_mismatch(kind: str) -> None:
    flights = job({0: f"{kind}x4?", 1: f"{kind}x6?"})
    assert diagnose(flights, {0, 1}, {}) is None
    assert mismatch(flights) is None
    assert first_difference("g", flights) == 0


def test_peer_finished_without_issuing() -> None:
    flights = job({0: "allreduce allreduce broadcast?", 1: "allreduce allreduce"})
    gone = {1: "finished the job"}
    found = diagnose(flights, {0}, gone)
    assert found is not None
    assert found.summary == (
        f"desync: rank 0 waits in broadcast(10 x float32) #3 of group g ({WHERE}); "
        "rank 1 never issued #3: it finished the job; the streams differ first at #3 of group g")
    assert "rank 1 (finished the job)" in found.detail.splitlines()[1]
    assert re.search(r"^>>   3  broadcast.*\[waits\] \| \(nothing\)$", found.detail, re.M)
    assert found.detail.endswith("\n\nrank 1 finished the job (issues nothing more)")
    # While rank 1 is live, it may yet issue #3: no diagnosis.
    assert diagnose(flights, {0, 1}, {}) is None


def test_peer_that_raised_or_died() -> None:
    flights = job({0: "allreduce?", 1: ""})
    found = diagnose(flights, {0}, {1: "died (SIGSEGV)"})
    assert found is not None and "rank 1 never issued #1: it died (SIGSEGV)" in found.summary


def test_only_a_wait_on_a_gone_peer_is_final() -> None:
    """Final: every stuck collective waits on a peer that answered or died without issuing
    it (it issues nothing more). Not final: a live peer's different collective, a live
    peer stuck itself, a peer waiting outside the trace."""
    found = diagnose(job({0: "allreduce allreduce?", 1: "allreduce"}), {0},
                     {1: "finished the job"})
    assert found is not None and found.final
    three = job({0: "allreduce?", 1: "allreduce?", 2: ""})
    found = diagnose(three, {0, 1}, {2: "raised"})
    assert found is not None and found.final
    found = diagnose(job({0: "allreduce?", 1: "broadcast?"}), {0, 1}, {})
    assert found is not None and not found.final
    found = diagnose(job({0: "a:allreduce?", 1: "b:allreduce?"}, {"a": (0, 1), "b": (0, 1)}),
                     {0, 1}, {})
    assert found is not None and not found.final
    untraced = diagnose(job({0: "allreduce?", 1: "", 2: ""}), {0, 1}, {2: "finished the job"},
                        {1: "all_reduce (distributed_c10d.py:3252)"})
    assert untraced is not None and not untraced.final
    # Rank 0 waits on the gone rank 2, rank 1 on its different collective: not all final.
    mixed = job({0: "a:allreduce?", 1: "b:allreduce?", 2: "b:broadcast"},
                {"a": (0, 2), "b": (1, 2)})
    found = diagnose(mixed, {0, 1}, {2: "finished the job"})
    assert found is not None and not found.final


# -- diagnose: no diagnosis ----------------------------------------------------------------


def test_pending_collective_every_peer_issued_is_only_slow() -> None:
    assert diagnose(job({0: "allreduce allreduce?", 1: "allreduce allreduce?"}), {0, 1}, {}) is None
    # The peer's is done already, ours is not stamped yet.
    assert diagnose(job({0: "allreduce allreduce?", 1: "allreduce allreduce"}), {0}, {}) is None
    # The same with a peer that finished after matching it.
    assert diagnose(job({0: "allreduce?", 1: "allreduce"}), {0},
                    {1: "finished the job"}) is None


def test_live_rank_with_nothing_pending_computes() -> None:
    flights = job({0: "allreduce allreduce?", 1: "allreduce"})
    assert diagnose(flights, {0, 1}, {}) is None
    # Even next to a pair that is desynced for sure.
    flights = job({0: "allreduce?", 1: "broadcast?", 2: "allreduce"})
    assert diagnose(flights, {0, 1, 2}, {}) is None
    assert diagnose(flights, {0, 1}, {2: "finished the job"}) is not None


def test_point_to_point_is_never_judged() -> None:
    assert diagnose(job({0: "send?", 1: "recv?"}), {0, 1}, {}) is None
    assert diagnose(job({0: "send?", 1: "broadcast?"}), {0, 1}, {}) is None
    assert diagnose(job({0: "recv?", 1: ""}), {0}, {1: "finished the job"}) is None


def test_unknown_group_members() -> None:
    specs = {0: "allreduce?", 1: "broadcast?"}
    assert diagnose(job(specs), {0, 1}, {}) is not None
    assert diagnose(job(specs, groups={}), {0, 1}, {}) is None  # no G line
    # A member that has no flight log at all (rank 0 and 1 agree: only rank 2 may be late).
    flights = job({0: "allreduce?", 1: "allreduce?"}, groups={"g": (0, 1, 2)})
    assert diagnose(flights, {0, 1}, {}) is None


def test_no_live_rank() -> None:
    assert diagnose(job({0: "allreduce?"}), set(), {0: "raised"}) is None


# -- diagnose: across groups and untraced waits --------------------------------------------


def test_cross_group_cyclic_wait() -> None:
    groups = {"a": (0, 1), "b": (0, 1)}
    flights = job({0: "a:allreduce?", 1: "b:allreduce?"}, groups)
    found = diagnose(flights, {0, 1}, {})
    assert found is not None
    assert found.summary == (
        f"desync: rank 0 waits in allreduce(10 x float32) #1 of group a ({WHERE}); "
        f"rank 1 waits in allreduce(10 x float32) #1 of group b ({WHERE}); "
        "the streams differ first at #1 of group a, #1 of group b")
    tables = found.detail.split("\n\n")
    assert [t.splitlines()[0] for t in tables] == [
        "group a (ranks 0, 1), collectives #1-#1 of 1:",
        "group b (ranks 0, 1), collectives #1-#1 of 1:"]
    # Once rank 1 issues a#1 too, rank 0's may complete: no diagnosis.
    flights = job({0: "a:allreduce?", 1: "b:allreduce? a:allreduce?"}, groups)
    assert diagnose(flights, {0, 1}, {}) is None


UNTRACED_AT = "all_reduce (distributed_c10d.py:3252) called from sync (user.py:9)"


def test_untraced_collective_of_a_peer() -> None:
    flights = job({0: "allreduce allreduce?", 1: "allreduce"})
    found = diagnose(flights, {0, 1}, {}, untraced={1: UNTRACED_AT})
    assert found is not None
    assert found.summary == (
        f"desync: rank 0 waits in allreduce(10 x float32) #2 of group g ({WHERE}); "
        f"rank 1 waits in an untraced collective at {UNTRACED_AT}; "
        "the streams differ first at #2 of group g")
    assert diagnose(flights, {0, 1}, {}, untraced={}) is None
    assert diagnose(flights, {0, 1}, {}, untraced={0: UNTRACED_AT}) is None


def test_untraced_only_is_no_evidence() -> None:
    flights = job({0: "allreduce", 1: "allreduce"})
    untraced = {0: UNTRACED_AT, 1: UNTRACED_AT}
    assert diagnose(flights, {0, 1}, {}, untraced) is None


# -- mismatch, first_difference, streams ---------------------------------------------------


def test_mismatch_with_ranks_that_stopped_earlier() -> None:
    groups = {"g": (0, 1, 2)}
    flights = job({0: "allreduce", 1: "allreduce broadcastx5", 2: "allreduce allgatherx5"},
                  groups)
    found = mismatch(flights)
    assert found is not None
    assert found.summary == (
        "the collective streams differ at #2 of group g: "
        f"rank 1 issued broadcast(5 x float32) ({WHERE}), "
        f"rank 2 issued allgather(5 x float32) ({WHERE})")
    assert re.search(r"^>>   2  \(nothing\) +\| broadcast", found.detail, re.M)
    # The first difference wins over later ones.
    flights = job({0: "allreduce barrier allreduce", 1: "allreduce barrierx1 broadcast"})
    found = mismatch(flights)
    assert found is not None and found.summary.startswith(
        "the collective streams differ at #2 of group g: rank 0 issued barrier(10 x float32)")


def test_mismatch_ignores_streams_of_different_length() -> None:
    flights = job({0: "allreduce allreduce broadcast", 1: "allreduce", 2: "allreduce allreduce"})
    assert mismatch(flights) is None
    assert first_difference("g", flights) == 2  # some issued #2, some not


def test_first_difference() -> None:
    assert first_difference("g", job({0: "allreduce allreduce", 1: "allreduce allreduce?"})) == 0
    flights = job({0: "allreduce barrier allgather", 1: "allreduce broadcast allgather"})
    assert first_difference("g", flights) == 2
    assert first_difference("nowhere", job({0: "allreduce"})) == 0


def test_streams_window_around_start() -> None:
    flights = job({0: " ".join(["allreduce"] * 20), 1: " ".join(["allreduce"] * 20)})
    table = streams("g", flights, 10, {1: "raised"}).splitlines()
    assert table[0] == "group g (ranks 0, 1), collectives #7-#16 of 20:"
    assert "rank 1 (raised)" in table[1]
    assert [row[:6] for row in table[2:]] == [
        "     7", "     8", "     9", ">>  10", "    11", "    12", "    13", "    14",
        "    15", "    16"]


# -- JobWatch: the time and CPU conditions -------------------------------------------------


class Ranks:
    """Two ranks' flight files, a JobWatch over them, and the CPU each rank used."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stacks=None,
                 n: int = 2) -> None:
        self.paths = {r: tmp_path / f"rank{r}.flight" for r in range(n)}
        for path in self.paths.values():
            path.write_text("L 99 g 1 allreduce float32 1 wrap -1 -1\n")  # a previous job
        self.cpu: dict[int, float | None] = {1000 + r: 1.0 for r in range(n)}
        monkeypatch.setattr(watch_module, "cpu_seconds", lambda pid: self.cpu[pid])
        self.logs = {r: FlightLog(str(p)) for r, p in self.paths.items()}
        self.watch = JobWatch(self.logs, {r: 1000 + r for r in range(n)}, stacks)
        self.next_id = {r: 0 for r in range(n)}

    def write(self, rank: int, spec: str, groups: dict[str, tuple[int, ...]] | None = None
              ) -> None:
        groups = {"g": tuple(self.paths)} if groups is None else groups
        new = lines(spec, groups, first_id=self.next_id[rank])
        self.next_id[rank] += len(spec.split())
        with open(self.paths[rank], "a") as f:
            f.write("".join(line + "\n" for line in new))


T = 1000.0


def test_watch_waits_out_the_quiet_period(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = Ranks(tmp_path, monkeypatch)
    ranks.write(0, "allreduce?")
    ranks.write(1, "broadcast?")
    assert ranks.watch.poll({0, 1}, {}, T) is None
    assert ranks.watch.poll({0, 1}, {}, T + 0.5) is None
    assert ranks.watch.poll({0, 1}, {}, T + DESYNC_QUIET_S - 0.01) is None
    found = ranks.watch.poll({0, 1}, {}, T + 1.2)
    assert found is not None
    assert found.summary.startswith("desync: rank 0 waits in allreduce(10 x float32) #1 of "
                                    "group g")
    assert "rank 1 waits in broadcast(10 x float32) #1" in found.summary
    assert ranks.logs[0].flight.at("g", 1).ident == 0  # the previous job's line is not read


def test_watch_new_line_restarts_quiet_period(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = Ranks(tmp_path, monkeypatch)
    ranks.write(0, "allreduce?")
    ranks.write(1, "broadcast?")
    assert ranks.watch.poll({0, 1}, {}, T) is None
    with open(ranks.paths[1], "a") as f:
        f.write("G h 0,1\n")  # something moved
    assert ranks.watch.poll({0, 1}, {}, T + 0.9) is None
    assert ranks.watch.poll({0, 1}, {}, T + 1.2) is None
    assert ranks.watch.poll({0, 1}, {}, T + 1.95) is not None


def test_watch_live_set_change_restarts_quiet_period(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = Ranks(tmp_path, monkeypatch)
    ranks.write(0, "allreduce?")
    assert ranks.watch.poll({0, 1}, {}, T) is None
    gone = {1: "finished the job"}
    assert ranks.watch.poll({0}, gone, T + 0.9) is None
    assert ranks.watch.poll({0}, gone, T + 1.2) is None
    found = ranks.watch.poll({0}, gone, T + 2.0)
    assert found is not None and "rank 1 never issued #1: it finished the job" in found.summary


def test_watch_cpu_use_restarts_quiet_period(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = Ranks(tmp_path, monkeypatch)
    ranks.write(0, "allreduce?")
    ranks.write(1, "broadcast?")
    assert ranks.watch.poll({0, 1}, {}, T) is None
    ranks.cpu[1001] = 1.0 + IDLE_CPU_S + 0.01  # rank 1 computed meanwhile
    assert ranks.watch.poll({0, 1}, {}, T + 1.2) is None
    assert ranks.watch.poll({0, 1}, {}, T + 2.1) is None  # 0.9 s since the restart
    ranks.cpu[1000] = 1.0 + IDLE_CPU_S - 0.01  # a blocked rank's few ms: still waiting
    assert ranks.watch.poll({0, 1}, {}, T + 2.3) is not None


def test_watch_without_cpu_figures_triples_the_quiet_period(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = Ranks(tmp_path, monkeypatch)
    ranks.cpu[1001] = None  # no /proc
    ranks.write(0, "allreduce?")
    ranks.write(1, "broadcast?")
    assert ranks.watch.poll({0, 1}, {}, T) is None
    assert ranks.watch.poll({0, 1}, {}, T + 1.2) is None
    assert ranks.watch.poll({0, 1}, {}, T + 2.9) is None
    assert ranks.watch.poll({0, 1}, {}, T + 3.1) is not None


DUMP_IN_ALL_REDUCE = """\
Thread 0x00007f3a2b7fe640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Current thread 0x00007f3a3c1b2740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81 in wrapper
  File "/home/me/mine/ddp.py", line 57 in sync_buffers
  File "/venv/lib/python3.11/site-packages/ddp_conformance/ranks/worker.py", line 210 in main
"""

DUMP_IN_BACKWARD = """\
Current thread 0x00007f3a3c1b2740 (most recent call first):
  File "/venv/lib/python3.11/site-packages/torch/autograd/graph.py", line 825 in _engine_run_backward
  File "/venv/lib/python3.11/site-packages/torch/autograd/__init__.py", line 347 in backward
  File "/home/me/suite/case.py", line 12 in step
"""


def test_watch_asks_stacks_of_ranks_outside_the_trace(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[int]] = []

    def stacks(which: list[int]) -> dict[int, str]:
        asked.append(list(which))
        return {r: DUMP_IN_ALL_REDUCE for r in which}

    ranks = Ranks(tmp_path, monkeypatch, stacks)
    ranks.write(0, "allreduce allreduce?")
    ranks.write(1, "allreduce")
    assert ranks.watch.poll({0, 1}, {}, T) is None
    assert ranks.watch.poll({0, 1}, {}, T + 0.5) is None
    assert asked == []  # not before the quiet period
    found = ranks.watch.poll({0, 1}, {}, T + 1.2)
    assert asked == [[1]]  # only the rank with nothing pending
    assert found is not None
    assert ("rank 1 waits in an untraced collective at all_reduce (distributed_c10d.py:3252) "
            "called from sync_buffers (ddp.py:57)") in found.summary
    assert ranks.watch.poll({0, 1}, {}, T + 1.3) is not None
    assert asked == [[1]]  # once per quiet period


def test_watch_stacks_once_per_quiet_period(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[int]] = []

    def stacks(which: list[int]) -> dict[int, str]:
        asked.append(list(which))
        return {r: DUMP_IN_BACKWARD for r in which}

    ranks = Ranks(tmp_path, monkeypatch, stacks)
    ranks.write(0, "allreduce allreduce?")
    ranks.write(1, "allreduce")
    assert ranks.watch.poll({0, 1}, {}, T) is None
    assert ranks.watch.poll({0, 1}, {}, T + 1.2) is None  # rank 1 computes
    assert ranks.watch.poll({0, 1}, {}, T + 1.3) is None
    assert ranks.watch.poll({0, 1}, {}, T + 5.0) is None
    assert asked == [[1]]
    with open(ranks.paths[1], "a") as f:
        f.write("G h 0,1\n")
    assert ranks.watch.poll({0, 1}, {}, T + 5.1) is None  # a new quiet period
    assert ranks.watch.poll({0, 1}, {}, T + 5.5) is None
    assert asked == [[1]]
    assert ranks.watch.poll({0, 1}, {}, T + 6.2) is None
    assert asked == [[1], [1]]


def test_watch_no_stacks_for_a_structural_desync(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[int]] = []
    ranks = Ranks(tmp_path, monkeypatch, lambda which: asked.append(which) or {})
    ranks.write(0, "allreduce?")
    ranks.write(1, "broadcast?")
    ranks.watch.poll({0, 1}, {}, T)
    assert ranks.watch.poll({0, 1}, {}, T + 1.2) is not None
    assert asked == []


def test_watch_never_asks_stacks_of_ranks_with_pending(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Every live rank waits in a collective its peers issued too (slow): no rank is outside
    the trace, so no rank's stack is taken."""
    asked: list[list[int]] = []
    ranks = Ranks(tmp_path, monkeypatch, lambda which: asked.append(list(which)) or {})
    ranks.write(0, "allreduce?")
    ranks.write(1, "allreduce?")
    ranks.watch.poll({0, 1}, {}, T)
    assert ranks.watch.poll({0, 1}, {}, T + 1.2) is None
    assert all(which == [] for which in asked)


def _recording(dump: str) -> tuple[list[list[int]], Callable[[list[int]], dict[int, str]]]:
    """A stacks function that answers ``dump`` for every rank asked, and the list of asks."""
    asked: list[list[int]] = []

    def stacks(which: list[int]) -> dict[int, str]:
        asked.append(list(which))
        return {r: dump for r in which}

    return asked, stacks


def test_watch_ends_at_once_when_ranks_sit_in_collectives_on_a_gone_peer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 finished without issuing the allreduce rank 0 waits in, and rank 0's stack is
    inside torch.distributed's all_reduce: the job ends at the first poll, with no quiet
    period, and the stacks that showed it are kept as the evidence."""
    asked, stacks = _recording(DUMP_IN_ALL_REDUCE)
    ranks = Ranks(tmp_path, monkeypatch, stacks)
    ranks.write(0, "allreduce allreduce?")
    ranks.write(1, "allreduce")
    gone = {1: "finished the job"}
    assert ranks.watch.poll({0, 1}, {}, T) is None  # rank 1 live: it may yet issue #2
    assert asked == []
    found = ranks.watch.poll({0}, gone, T + 0.1)
    assert found is not None and found.final and asked == [[0]]
    assert "rank 1 never issued #2: it finished the job" in found.summary
    assert ranks.watch.taken == {0: DUMP_IN_ALL_REDUCE}


def test_watch_keeps_the_quiet_period_for_a_rank_outside_a_collective(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same streams, but rank 0's stack is in backward (it may still compute, or waits
    below Python): the stacks are asked a few times at most, and the desync comes only after
    the quiet period, as it did before."""
    asked, stacks = _recording(DUMP_IN_BACKWARD)
    ranks = Ranks(tmp_path, monkeypatch, stacks)
    ranks.write(0, "allreduce?")
    gone = {1: "finished the job"}
    for i in range(FINAL_LOOKS + 3):
        assert ranks.watch.poll({0}, gone, T + 0.1 * i) is None
    assert asked == [[0]] * FINAL_LOOKS and ranks.watch.taken == {}
    found = ranks.watch.poll({0}, gone, T + DESYNC_QUIET_S + 0.1)
    assert found is not None and found.final and ranks.watch.taken == {}


def test_watch_looks_again_when_a_rank_moved_while_its_stack_was_taken(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A collective launched while the stacks were taken (the stack may be of the moment
    between two collectives): no decision from that look; the next poll looks again."""
    ranks: Ranks

    def stacks(which: list[int]) -> dict[int, str]:
        if len(asked) == 0:
            ranks.write(0, "h:broadcast?", groups={"h": (0, 1)})
        asked.append(list(which))
        return {r: DUMP_IN_ALL_REDUCE for r in which}

    asked: list[list[int]] = []
    ranks = Ranks(tmp_path, monkeypatch, stacks)
    ranks.write(0, "allreduce?")
    gone = {1: "finished the job"}
    assert ranks.watch.poll({0}, gone, T) is None and len(asked) == 1
    found = ranks.watch.poll({0}, gone, T + 0.1)
    assert found is not None and len(asked) == 2
    assert "rank 0 waits in allreduce(10 x float32) #1" in found.summary


def test_watch_with_a_real_idle_process(tmp_path: Path) -> None:
    """The real /proc CPU figures of a sleeping process: idle, so the desync comes after the
    quiet period (no monkeypatch)."""
    if cpu_seconds(os.getpid()) is None:
        pytest.skip("no /proc: CPU time unknown")
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == "ready\n"
        paths = {r: tmp_path / f"rank{r}.flight" for r in (0, 1)}
        for path in paths.values():
            path.touch()
        watch = JobWatch({r: FlightLog(str(p)) for r, p in paths.items()},
                         {0: sleeper.pid, 1: sleeper.pid})
        for rank, kind in ((0, "allreduce?"), (1, "broadcast?")):
            paths[rank].write_text("\n".join(lines(kind, {"g": (0, 1)})) + "\n")
        now = time.monotonic()
        assert watch.poll({0, 1}, {}, now) is None
        assert watch.poll({0, 1}, {}, now + 0.5) is None
        found = watch.poll({0, 1}, {}, now + 1.2)
        assert found is not None and "the streams differ first at #1 of group g" in found.summary
    finally:
        sleeper.kill()
        sleeper.wait()


def test_cpu_seconds() -> None:
    start = cpu_seconds(os.getpid())
    if start is None:
        pytest.skip("no /proc: CPU time unknown")
    give_up = time.monotonic() + 2.0
    now = start
    while now - start < 0.05 and time.monotonic() < give_up:
        sum(range(10_000))
        now = cpu_seconds(os.getpid()) or 0.0
    assert now - start >= 0.05
    assert cpu_seconds(2 ** 22 + 12345) is None  # above pid_max: no such process


def test_cpu_seconds_reads_user_plus_system_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """utime and stime, the 14th and 15th fields of /proc/<pid>/stat, after the command
    name (which may hold spaces and parentheses)."""
    stat = "4321 (py (x) y) S 1 2 3 0 -1 4194560 900 0 0 0 150 50 0 0 20 0 3 0 77 1 2 3"
    opened = []

    def fake_open(path: str, *args: object) -> io.StringIO:
        opened.append(path)
        return io.StringIO(stat)

    monkeypatch.setattr(watch_module, "open", fake_open, raising=False)
    assert cpu_seconds(4321) == pytest.approx(200 * watch_module._TICK_S)
    assert opened == ["/proc/4321/stat"]
    stat = "4321 (py"
    assert cpu_seconds(4321) is None


# -- stacks --------------------------------------------------------------------------------


def test_in_collective() -> None:
    where = in_collective(DUMP_IN_ALL_REDUCE)
    assert where is not None and where.startswith("all_reduce (distributed_c10d.py:3252)")
    assert where == "all_reduce (distributed_c10d.py:3252) called from sync_buffers (ddp.py:57)"
    assert in_collective(DUMP_IN_BACKWARD) is None
    assert in_collective("") is None


def test_in_collective_on_a_real_faulthandler_dump(tmp_path: Path) -> None:
    """faulthandler's own output, taken in this process inside a function ``all_reduce`` of
    a file ``torch/distributed/distributed_c10d.py``, with another thread alive."""
    c10d = tmp_path / "torch" / "distributed" / "distributed_c10d.py"
    c10d.parent.mkdir(parents=True)
    c10d.write_text("import faulthandler\n\n"
                    "def all_reduce(f):\n"
                    "    faulthandler.dump_traceback(file=f, all_threads=True)\n")
    spec = importlib.util.spec_from_file_location("fake_distributed_c10d", c10d)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    other = threading.Event()
    thread = threading.Thread(target=other.wait, args=(5.0,), daemon=True)
    thread.start()
    try:
        with open(tmp_path / "stack", "w") as f:
            module.all_reduce(f)
    finally:
        other.set()
        thread.join()
    dump = (tmp_path / "stack").read_text()
    assert dump.count("Thread 0x") >= 1 and dump.count("Current thread 0x") == 1  # (xdist: more)
    where = in_collective(dump)
    assert where is not None
    assert where.startswith("all_reduce (distributed_c10d.py:4) called from "
                            "test_in_collective_on_a_real_faulthandler_dump (test_desync.py:")


def test_in_collective_reads_the_current_thread() -> None:
    """Another thread in a collective does not count: the main thread is where the job runs."""
    other_in_c10d = DUMP_IN_ALL_REDUCE.split("\n\n")[1].replace("Current thread", "Thread")
    assert in_collective(other_in_c10d + "\n" + DUMP_IN_BACKWARD) is None
    assert in_collective(DUMP_IN_BACKWARD.replace("Current thread", "Thread") + "\n"
                         + DUMP_IN_ALL_REDUCE) is not None


def test_in_collective_needs_a_c10d_collective() -> None:
    dump = DUMP_IN_ALL_REDUCE.replace("line 3252 in all_reduce", "line 1200 in _get_default_group")
    assert in_collective(dump) is None
    dump = DUMP_IN_ALL_REDUCE.replace("distributed_c10d.py", "mine.py")
    assert in_collective(dump) is None


def test_innermost_frame() -> None:
    assert innermost_frame(DUMP_IN_BACKWARD) == (
        "_engine_run_backward (graph.py:825) called from step (case.py:12)")
    harness_only = ('Current thread 0x1 (most recent call first):\n'
                    '  File "/x/torch/nn/modules/module.py", line 1 in _call_impl\n')
    assert innermost_frame(harness_only) == "_call_impl (module.py:1)"
    collecting = ('Current thread 0x1 (most recent call first):\n  Garbage-collecting\n'
                  '  File "/home/me/case.py", line 3 in step\n')
    assert innermost_frame(collecting) == "garbage collection in step (case.py:3)"
    assert innermost_frame("Fatal Python error: Segmentation fault\n") == "(unknown)"


DUMP_CREATING_TRACED = """\
Current thread 0x00007f3a3c1b2740 (most recent call first):
  File "/src/ddp_conformance/ranks/tracing.py", line 356 in create_inner
  File "/src/ddp_conformance/ranks/tracing.py", line 120 in create
  File "/venv/torch/distributed/distributed_c10d.py", line 2169 in _new_process_group_helper
  File "/venv/torch/distributed/distributed_c10d.py", line 6060 in _new_group_with_tag
  File "/venv/torch/distributed/distributed_c10d.py", line 5830 in new_group
  File "/home/me/myddp.py", line 56 in __init__
"""
DUMP_CREATING = """\
Current thread 0x00007f3a3c1b2740 (most recent call first):
  File "/venv/torch/distributed/distributed_c10d.py", line 2169 in _new_process_group_helper
  File "/venv/torch/distributed/distributed_c10d.py", line 5830 in new_group
  File "/home/me/myddp.py", line 56 in __init__
"""


def test_group_creation_is_read_from_the_stack() -> None:
    assert in_group_creation(DUMP_CREATING_TRACED) == \
        "create_inner (tracing.py:356) called from __init__ (myddp.py:56)"
    assert in_group_creation(DUMP_CREATING) == \
        "_new_process_group_helper (distributed_c10d.py:2169) called from __init__ (myddp.py:56)"
    assert in_group_creation(DUMP_IN_ALL_REDUCE) is None
    assert in_group_creation(DUMP_IN_BACKWARD) is None


def test_creation_hang_needs_every_live_rank_creating_and_a_rank_gone() -> None:
    gone = {0: "finished the job"}
    found = creation_hang({1}, gone, {1: "create_inner (tracing.py:356)"})
    assert found is not None
    assert found.summary.startswith("desync: rank 1 waits in process-group creation at "
                                    "create_inner (tracing.py:356); rank 0 finished the job")
    assert creation_hang({1}, {}, {1: "x"}) is None  # nobody left: they may yet meet
    assert creation_hang({1, 2}, gone, {1: "x"}) is None  # rank 2 does something else


def test_watch_ends_a_rank_creating_a_group_its_finished_peer_never_creates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = Ranks(tmp_path, monkeypatch, lambda which: {r: DUMP_CREATING_TRACED for r in which})
    ranks.write(0, "allreduce")
    ranks.write(1, "allreduce")
    gone = {0: "finished the job"}
    assert ranks.watch.poll({1}, gone, T) is None
    assert ranks.watch.poll({1}, gone, T + DESYNC_QUIET_S - 0.01) is None  # the quiet period
    found = ranks.watch.poll({1}, gone, T + 1.2)
    assert found is not None and "rank 1 waits in process-group creation" in found.summary
    ranks.cpu[1001] = 5.0  # a rank that computes is not hung
    assert ranks.watch.poll({1}, gone, T + 1.3) is None
