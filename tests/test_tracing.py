"""The tracing process group (:mod:`ddp_conformance.ranks.tracing`) in this process, on a
one-rank Gloo group built by hand from a ``HashStore``: no default process group, no
registered backend, nothing global left behind (the registered ``traced_gloo`` backend is
tried in a subprocess)."""
from __future__ import annotations

import datetime
import pickle
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from ddp_conformance.ranks.tracing import TRACER, Collective, Tracer, TracingProcessGroup
from tests.deadlines import deadline

GLOO = dist.ProcessGroup.BackendType.GLOO
#: The repository root: the subprocesses import ``tests.backends`` from there.
_ROOT = str(__import__("pathlib").Path(__file__).resolve().parents[1])


@pytest.fixture
def gloo() -> dist.ProcessGroupGloo:
    """A one-rank Gloo backend object (what ``traced_backend``'s factory wraps)."""
    return dist.ProcessGroupGloo(dist.HashStore(), 0, 1, datetime.timedelta(seconds=30))


@pytest.fixture
def group(gloo: dist.ProcessGroupGloo) -> dist.ProcessGroup:
    """A one-rank ProcessGroup over it (as ``dist.new_group(backend="gloo")`` returns)."""
    pg = dist.ProcessGroup(0, 1)  # type: ignore[call-arg]
    pg._register_backend(torch.device("cpu"), GLOO, gloo)
    pg._set_default_backend(GLOO)
    return pg


@pytest.fixture
def global_trace() -> Iterator[list[Collective]]:
    """What the process-wide TRACER logs during the test; its state is restored after."""
    saved = (TRACER.take(), TRACER.stage, TRACER.step, TRACER.microbatch)
    seen: list[Collective] = []
    yield seen
    seen += TRACER.take()
    TRACER.log, TRACER.stage, TRACER.step, TRACER.microbatch = saved


def settled(log: list[Collective], timeout: float = 5.0) -> list[Collective]:
    """``log`` once every completion callback has run (they may trail ``wait``)."""
    deadline = time.monotonic() + timeout
    while any(c.done is None for c in log) and time.monotonic() < deadline:
        time.sleep(0.001)
    return log


def test_wrapping_a_process_group_logs_kind_dtype_numel_bytes_and_completion(
        group: dist.ProcessGroup, global_trace: list[Collective]) -> None:
    tracer = Tracer(completions=True)
    pg = TracingProcessGroup(group, tracer=tracer)
    # the inner group's name, as the candidate would see it without the harness
    assert pg.getBackendName() == pg.name() == pg._get_backend_name() == "gloo"
    assert (pg.rank(), pg.size()) == (0, 1)
    assert torch.device("cpu") in pg._device_types  # the real backend, for C++ look-ups
    tracer.phase("backward", step=2, microbatch=1)
    before = time.perf_counter()
    t = torch.arange(10, dtype=torch.float32)
    dist.all_reduce(t, group=pg)
    dist.broadcast(torch.ones(3, dtype=torch.float64), group=pg, group_src=0)
    out = [torch.zeros(4, dtype=torch.int32)]
    dist.all_gather(out, torch.full((4,), 7, dtype=torch.int32), group=pg)
    dist.barrier(group=pg)
    log = settled(tracer.take())
    assert tracer.log == []  # take() empties the trace
    assert [(c.kind, c.dtype, c.numel, c.nbytes, c.group_size) for c in log] == [
        ("allreduce", "float32", 10, 40, 1), ("broadcast", "float64", 3, 24, 1),
        ("allgather", "int32", 4, 16, 1), ("barrier", "-", 0, 0, 1)]
    assert all((c.step, c.microbatch, c.stage) == (2, 1, "backward") for c in log)
    for c in log:  # launched in order, completed after launch
        assert c.done is not None and before <= c.launched <= c.done
    assert [c.launched for c in log] == sorted(c.launched for c in log)
    assert t.tolist() == [float(i) for i in range(10)] and out[0].tolist() == [7] * 4  # forwarded
    assert global_trace == [] and TRACER.log == []  # its own tracer only


def test_completions_only_when_the_tracer_asks(group: dist.ProcessGroup) -> None:
    tracer = Tracer()
    pg = TracingProcessGroup(group, tracer=tracer)
    dist.all_reduce(torch.ones(5), group=pg)
    tracer.completions = True
    dist.all_reduce(torch.ones(6), group=pg)
    first, second = tracer.take()
    settled([second])
    assert first.done is None and first.launched > 0
    assert second.done is not None and second.done >= second.launched


def test_wrapping_a_backend_object_logs_into_the_global_tracer(
        gloo: dist.ProcessGroupGloo, global_trace: list[Collective]) -> None:
    pg = TracingProcessGroup(gloo, real="gloo")  # as traced_backend's factory does
    assert pg.tracer is TRACER and pg.name() == "gloo"
    TRACER.phase("optimizer", 3)
    dist.all_reduce(torch.ones(5, dtype=torch.int64), group=pg)
    # not bound on ProcessGroupGloo: goes through the plain group over the same backend
    tensors = [torch.ones(2), torch.ones(3)]
    pg.allreduce_coalesced(tensors).wait()
    assert [t.tolist() for t in tensors] == [[1.0] * 2, [1.0] * 3]
    got = TRACER.take()
    assert [(c.kind, c.dtype, c.numel, c.nbytes, c.step, c.stage) for c in got] == [
        ("allreduce", "int64", 5, 40, 3, "optimizer"),
        ("allreduce_coalesced", "float32", 5, 20, 3, "optimizer")]
    assert all(c.done is None for c in got)  # TRACER does not ask for completions


def test_torch_ddp_reducer_collectives_are_traced(group: dist.ProcessGroup) -> None:
    """The C++ reducer (init broadcasts, the bucket's allreduce) calls the Python group."""
    tracer = Tracer(completions=True)
    pg = TracingProcessGroup(group, tracer=tracer)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2), process_group=pg)
    init = tracer.take()
    assert ("broadcast", "float32", 10) in [(c.kind, c.dtype, c.numel) for c in init]  # parameters
    ddp(torch.randn(3, 4)).sum().backward()
    step = settled(tracer.take())
    assert [(c.kind, c.dtype, c.numel, c.nbytes) for c in step] == [("allreduce", "float32", 10, 40)]
    assert step[0].done is not None


def test_collective_records_compare_pickle_and_describe() -> None:
    a = Collective(1, 0, "backward", "allreduce", "float32", 310, 4, 1240, launched=1.0)
    b = Collective(1, 0, "backward", "allreduce", "float32", 310, 4, 1240, launched=2.0, done=3.0)
    assert a == b  # the time stamps are not what a collective is
    assert a != Collective(1, 0, "backward", "allreduce", "float16", 310, 4, 620)
    assert a.signature() == ("allreduce", "float32", 310, 4)
    assert a.describe() == "allreduce(310 x float32, group of 4)"
    back = pickle.loads(pickle.dumps(b))
    assert (back, back.launched, back.done, back.nbytes) == (b, 2.0, 3.0, 1240)
    # a rank's trace travels to the parent: it stays small
    assert len(pickle.dumps([a] * 100)) < 4000


def test_registered_traced_backend_traces_every_group_into_the_global_tracer() -> None:
    code = textwrap.dedent("""
        import torch, torch.distributed as dist
        from ddp_conformance.ranks.tracing import TRACER, TracingProcessGroup, traced_backend
        name = traced_backend("gloo")
        assert traced_backend("gloo") == name == "traced_gloo"  # registered once
        dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1)
        try:
            assert isinstance(dist.group.WORLD, TracingProcessGroup)
            TRACER.phase("forward", 0, 0)
            dist.all_reduce(torch.ones(3))
            sub = dist.new_group([0])
            dist.broadcast(torch.ones(2, dtype=torch.float16), src=0, group=sub)
            got = [(c.kind, c.dtype, c.numel, c.nbytes, c.stage) for c in TRACER.take()]
            assert got == [("allreduce", "float32", 3, 12, "forward"),
                           ("broadcast", "float16", 2, 4, "forward")], got
        finally:
            dist.destroy_process_group()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=deadline(120),
                          check=False)
    assert proc.returncode == 0, proc.stderr


# What the candidate can ask of its groups: each answer must be the same traced and not.
_SEEN = textwrap.dedent("""
    import importlib, sys, torch, torch.distributed as dist
    from ddp_conformance.ranks.tracing import TRACER, TracingProcessGroup, traced_backend
    module, _, real = sys.argv[1].rpartition(":")
    if module:
        importlib.import_module(module)

    def named(group):
        try:
            return group.group_name, group.group_desc
        except RuntimeError as exc:  # a Python group that keeps no name: so it says
            return str(exc)

    def seen(group):
        cpu = torch.device("cpu")
        backend = (type(group._get_backend(cpu)).__name__ if cpu in group._device_types
                   else None)
        return (str(dist.get_backend(group)), group.name(), group._get_backend_name(),
                dist.get_backend_config(group), dist.get_rank(group), dist.get_world_size(group),
                dist.ProcessGroup.rank(group), dist.ProcessGroup.size(group),
                dist.get_process_group_ranks(group), sorted(map(str, group._device_types)),
                backend, named(group))

    def world(name):
        dist.init_process_group(name, store=dist.HashStore(), rank=0, world_size=1)
        try:
            groups = [dist.group.WORLD, dist.new_group([0]), dist.new_group([0], backend=real)]
            answers = [seen(g) for g in groups]
            traced = [isinstance(g, TracingProcessGroup) for g in groups]
            for g in groups:
                dist.all_reduce(torch.ones(2), group=g)
            return answers, traced, [(c.kind, c.numel) for c in TRACER.take()]
        finally:
            dist.destroy_process_group()

    made = getattr(sys.modules.get(module), "MADE", [0])  # a backend's own subgroups
    plain = world(real)
    traced = world(traced_backend(real))
    again = world(real)  # an untraced job after a traced one, in the same process
    assert made[0] in (0, 6), made  # its own new_group, 2 subgroups per world, every time
    assert plain[1:] == ([False] * 3, []), plain
    assert traced[1:] == ([True] * 3, [("allreduce", 2)] * 3), traced
    assert traced[0] == plain[0] == again[0], (plain[0], traced[0])
    assert again[1:] == plain[1:], again
    print(plain[0][0][:3])
""")


@pytest.mark.parametrize("backend", ["gloo", "tests.backends.example:example_backend",
                                     "tests.backends.own_subgroups:own_subgroups",
                                     "tests.backends.backend_object:backend_object"])
def test_the_trace_is_invisible_to_every_public_query(backend: str) -> None:
    """``dist.get_backend``, ``name()``, ``_get_backend_name()``, ``get_backend_config``,
    rank and size (Python and C++), the group's ranks, its device types and backend object:
    the same traced and untraced, on the default group and on subgroups created with and
    without ``backend=``; every traced group's collectives are traced all the same."""
    proc = subprocess.run([sys.executable, "-c", _SEEN, backend], capture_output=True, text=True,
                          timeout=deadline(120), check=False, cwd=_ROOT)
    assert proc.returncode == 0, proc.stderr
    name = backend.rpartition(":")[2]
    # c10d's own group over a registered backend's object calls itself "custom"
    said = "custom" if name == "backend_object" else name
    assert proc.stdout.split() == [f"('{name}',", f"'{said}',", f"'{said}')"]


class _LyingGroup(dist.ProcessGroup):
    """torchft 0.2.0's wrappers: built as ``ProcessGroup(0, 1)`` (C++ rank 0, size 1 on
    every process); only the Python ``size()`` says what the job is."""

    def size(self) -> int:
        return 2

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "lying"


def test_rank_and_size_are_the_inner_groups_in_cpp_and_in_python() -> None:
    inner = _LyingGroup(0, 1)  # type: ignore[call-arg]
    pg = TracingProcessGroup(inner, tracer=Tracer(), real="lying")
    assert (dist.ProcessGroup.rank(pg), dist.ProcessGroup.size(pg)) == (0, 1)  # what C++ reads
    assert (pg.rank(), pg.size()) == (0, 2)  # what Python reads, as of the inner group
    assert pg.name() == "lying"


class _NoFutureWork(dist.Work):
    """A work that completes at once and has no future: asking for one is an error."""

    def __init__(self) -> None:
        super().__init__()
        self.asked_future = 0

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        self.asked_future += 1
        raise RuntimeError("this backend's works have no future")


class _NoFutureGroup(dist.ProcessGroup):
    """A one-rank backend whose works have no future."""

    def __init__(self) -> None:
        super().__init__(0, 1)
        self.works: list[_NoFutureWork] = []

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "nofuture"

    def allreduce(self, tensors: list[torch.Tensor], opts: object = None) -> dist.Work:
        self.works.append(_NoFutureWork())
        return self.works[-1]


def test_completions_are_polled_never_asked_of_the_future(tmp_path: object) -> None:
    from ddp_conformance.ranks.flight import FlightRecorder

    inner = _NoFutureGroup()
    tracer = Tracer(completions=True)
    tracer.flight = FlightRecorder(f"{tmp_path}/flight")
    pg = TracingProcessGroup(inner, tracer=tracer, group_key="g", ranks=[0], real="nofuture")
    dist.all_reduce(torch.ones(3), group=pg)
    pg.allreduce([torch.ones(2)]).wait()
    log = settled(tracer.take())
    assert [c.kind for c in log] == ["allreduce", "allreduce"]
    assert all(c.done is not None for c in log)  # completion seen, by is_completed()
    assert tracer.flight.settle(5.0)
    assert [w.asked_future for w in inner.works] == [0, 0]
