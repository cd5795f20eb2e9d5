"""Running one collective case on a rank: the rank's half of a backend check.

Called by the rank runtime as a ``call`` job (``run_case(rank, world_size, case,
device)``) inside the job's default group, which is the backend under test (through the
tracing group when the run traces, so a hang is diagnosed from the flight recorder as for
any scenario). Each item (a size, and a root for rooted operations) builds every member's
exact data at the dtype's full precision (:mod:`.values`), runs the collective, and
compares what this rank holds with what it must hold, bit for bit: the results, the
inputs an out-of-place operation must leave alone, and the elements between a strided
tensor's elements.

A backend that raises is not judged here: the first item whose collective raises ends
the case, and the exception goes back whole. The parent decides whether it declares a gap
(N/A) or is an error (:mod:`.verdict`). Only what the backend's calls raise counts so
(:class:`BackendRaised`); an exception of the checking code itself fails the job, so that
a harness defect is never reported as a gap of the backend.
"""
from __future__ import annotations

import functools
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ddp_conformance.catalog.collective import (
    ROOTED,
    CollectiveCase,
    Completion,
    GroupKind,
    Layout,
    Op,
)
from ddp_conformance.collectives.values import SENTINEL, bits, data, dtype_of, reduce

#: In the barrier check, how long every rank but the group's first waits before it
#: arrives: a barrier that lets the first rank through early is seen every time.
BARRIER_DELAY_S = 0.2
#: Mismatches kept per rank (the first of each item is what a person needs).
MAX_MISMATCHES = 20


@dataclass
class Mismatch:
    """The first element of one tensor that differs from what it must be."""

    item: str
    what: str
    index: int
    expected: Any
    got: Any
    count: int
    numel: int

    def describe(self) -> str:
        return (f"{self.item}: {self.what}, element {self.index}: expected {self.expected!r}, "
                f"got {self.got!r} ({self.count} of {self.numel} element"
                f"{'' if self.numel == 1 else 's'} differ)")


@dataclass
class RankReport:
    """What one rank saw of one collective case."""

    rank: int
    #: Items whose every comparison was exact.
    exact: list[str] = field(default_factory=list)
    mismatches: list[Mismatch] = field(default_factory=list)
    #: The item at which the backend raised, with the exception (type, message, traceback).
    raised_at: str = ""
    error_type: str = ""
    error: str = ""
    traceback: str = ""


class BackendRaised(Exception):
    """A ``torch.distributed`` call of the backend under test raised ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error
        self.traceback = traceback.format_exc()


def backend_call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, its exception wrapped in :class:`BackendRaised`."""
    try:
        return function(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the backend's, judged by the parent
        raise BackendRaised(exc) from exc


@dataclass
class _Context:
    case: CollectiveCase
    device: torch.device
    group: Any
    members: list[int]
    me: int
    report: RankReport

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def index(self) -> int:
        """This rank's rank in the group."""
        return self.members.index(self.me)

    def data(self, rank: int, numel: int, salt: int = 0) -> Tensor:
        """Member ``rank``'s input (:func:`~ddp_conformance.collectives.values.data`)."""
        case = self.case
        return data(rank, numel, case.dtype, case.reduce_op, salt, self.size,
                    self.members.index(rank)).to(self.device)

    def empty(self, numel: int) -> Tensor:
        return torch.full((numel,), SENTINEL, dtype=dtype_of(self.case.dtype), device=self.device)

    def placed(self, values: Tensor) -> tuple[Tensor, Tensor | None]:
        """``values`` in the case's layout: (the tensor to hand over, its strided base)."""
        if self.case.layout != Layout.STRIDED:
            return values.clone(), None
        base = torch.full((values.numel(), 2), SENTINEL, dtype=values.dtype, device=self.device)
        view = base[:, 0]
        view.copy_(values)
        return view, base

    def check(self, item: str, what: str, got: Tensor, want: Tensor) -> bool:
        """Compare bitwise; keep the first differing element. True when equal."""
        got, want = got.detach().cpu().reshape(-1), want.detach().cpu().reshape(-1)
        if got.shape != want.shape:
            self.keep(Mismatch(item, f"{what} has {got.numel()} elements", 0, want.numel(),
                                got.numel(), 1, 1))
            return False
        differ = bits(got) != bits(want)
        if not bool(differ.any()):
            return True
        index = int(differ.nonzero()[0, 0])
        self.keep(Mismatch(item, what, index, want[index].item(), got[index].item(),
                            int(differ.sum()), got.numel()))
        return False

    def check_between(self, item: str, base: Tensor | None) -> bool:
        """A strided tensor's neighbours must still hold the sentinel."""
        if base is None:
            return True
        between = base[:, 1]
        return self.check(item, "an element between the strided ones (must be left alone)",
                          between, torch.full_like(between, SENTINEL))

    def keep(self, mismatch: Mismatch) -> None:
        if len(self.report.mismatches) < MAX_MISMATCHES:
            self.report.mismatches.append(mismatch)

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Tensor] | None:
        """Run ``function`` (a ``torch.distributed`` call) and complete it the case's way;
        return the future's value for FUTURE and THEN (for THEN: the tensors doubled by a
        callback chained with ``then``), else None."""
        completion = self.case.completion
        if completion == Completion.SYNC:
            backend_call(function, *args, group=self.group, **kwargs)
            return None
        work = backend_call(function, *args, group=self.group, async_op=True, **kwargs)
        if completion == Completion.WAIT:
            backend_call(work.wait)
            return None
        future = backend_call(work.get_future)
        if completion == Completion.THEN:
            future = backend_call(future.then, lambda f: [t * 2 for t in _tensors(f.value())])
        return _tensors(backend_call(future.wait))


def _tensors(value: Any) -> list[Tensor]:
    """The tensors of a future's value (a tensor, or a list, possibly nested)."""
    if isinstance(value, Tensor):
        return [value]
    out: list[Tensor] = []
    for v in value or []:
        out.extend(_tensors(v))
    return out


def run_case(rank: int, world_size: int, case: CollectiveCase, device_kind: str = "cpu") -> RankReport:
    """Run every item of ``case`` on this rank (in the job's default group)."""
    device = torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" \
        else torch.device("cpu")
    report = RankReport(rank)
    try:
        group, members = _group(case, rank, world_size)
    except BackendRaised as raised:
        _raised(report, "creating the subgroups (new_group)", raised)
        return report
    ctx = _Context(case, device, group, members, rank, report)
    for item, run in _items(ctx):
        before = len(report.mismatches)
        try:
            run()
        except BackendRaised as raised:
            _raised(report, item, raised)
            break
        if len(report.mismatches) == before:
            report.exact.append(item)
    return report


def _raised(report: RankReport, item: str, raised: BackendRaised) -> None:
    report.raised_at, report.error_type = item, type(raised.error).__name__
    report.error, report.traceback = str(raised.error), raised.traceback


def _group(case: CollectiveCase, rank: int, world_size: int) -> tuple[Any, list[int]]:
    if case.group == GroupKind.WORLD:
        return dist.group.WORLD, list(range(world_size))
    evens, odds = list(range(0, world_size, 2)), list(range(1, world_size, 2))
    # Every rank creates both, in the same order.
    groups = [backend_call(dist.new_group, evens), backend_call(dist.new_group, odds)]
    return (groups[0], evens) if rank % 2 == 0 else (groups[1], odds)


def _items(ctx: _Context) -> list[tuple[str, Callable[[], None]]]:
    """(item name, what to run) for every size, and every root of rooted operations."""
    case = ctx.case
    if case.op == Op.BARRIER:
        return [("barrier", lambda: _barrier(ctx))]
    if case.op == Op.SPARSE_ALLREDUCE:
        return [("8x3 sparse COO", lambda: _sparse_allreduce(ctx))]
    runner = _RUNNERS[Op(case.op)]
    items: list[tuple[str, Callable[[], None]]] = []
    for numel in case.sizes:
        roots = ctx.members if case.op in ROOTED else [None]
        for root in roots:
            name = f"{numel} element{'' if numel == 1 else 's'}" + \
                ("" if root is None else f", root {root}")
            items.append((name, functools.partial(runner, ctx, name, numel, root)))
    return items


def _expect_future(ctx: _Context, item: str, value: list[Tensor] | None, want: Tensor) -> None:
    """FUTURE: the future's value is the result; THEN: the callback saw the result."""
    if value is None:
        return
    if not value:
        ctx.check(item, "the future's value (empty)", torch.empty(0), want)
        return
    factor = 2 if ctx.case.completion == Completion.THEN else 1
    what = "the value of the future chained with then" if factor == 2 else "the future's value"
    ctx.check(item, what, value[0], want * factor)


def _allreduce(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    mine, base = ctx.placed(ctx.data(ctx.me, numel))
    op = getattr(dist.ReduceOp, ctx.case.reduce_op)
    value = ctx.call(dist.all_reduce, mine, op=op)
    want = reduce([ctx.data(m, numel) for m in ctx.members], ctx.case.reduce_op)
    ctx.check(item, "the result", mine, want)
    ctx.check_between(item, base)
    _expect_future(ctx, item, value, want)


def _broadcast(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    assert root is not None
    start = ctx.data(ctx.me, numel) if ctx.me == root else ctx.empty(numel)
    mine, base = ctx.placed(start)
    value = ctx.call(dist.broadcast, mine, src=root)
    want = ctx.data(root, numel)
    ctx.check(item, "the result", mine, want)
    ctx.check_between(item, base)
    _expect_future(ctx, item, value, want)


def _allgather(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    mine, base = ctx.placed(ctx.data(ctx.me, numel))
    outputs = [ctx.empty(numel) for _ in ctx.members]
    ctx.call(dist.all_gather, outputs, mine)
    for m, out in zip(ctx.members, outputs, strict=True):
        ctx.check(item, f"the output from rank {m}", out, ctx.data(m, numel))
    ctx.check(item, "the input (must be left alone)", mine, ctx.data(ctx.me, numel))
    ctx.check_between(item, base)


def _allgather_into_tensor(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    mine = ctx.data(ctx.me, numel)
    out = ctx.empty(numel * ctx.size)
    ctx.call(dist.all_gather_into_tensor, out, mine)
    ctx.check(item, "the output", out, torch.cat([ctx.data(m, numel) for m in ctx.members]))
    ctx.check(item, "the input (must be left alone)", mine, ctx.data(ctx.me, numel))


def _chunks(ctx: _Context, rank: int, numel: int) -> list[Tensor]:
    """Rank ``rank``'s input to a scatter-like operation: one chunk per member, distinct."""
    return [ctx.data(rank, numel, salt=1 + j) for j in range(ctx.size)]


def _reduce_scatter(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    inputs = _chunks(ctx, ctx.me, numel)
    out = ctx.empty(numel)
    op = getattr(dist.ReduceOp, ctx.case.reduce_op)
    ctx.call(dist.reduce_scatter, out, inputs, op=op)
    want = reduce([_chunks(ctx, m, numel)[ctx.index] for m in ctx.members], ctx.case.reduce_op)
    ctx.check(item, "the result", out, want)
    for j, chunk in enumerate(inputs):
        ctx.check(item, f"input {j} (must be left alone)", chunk, _chunks(ctx, ctx.me, numel)[j])


def _reduce_scatter_tensor(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    inputs = torch.cat(_chunks(ctx, ctx.me, numel))
    out = ctx.empty(numel)
    op = getattr(dist.ReduceOp, ctx.case.reduce_op)
    ctx.call(dist.reduce_scatter_tensor, out, inputs, op=op)
    want = reduce([_chunks(ctx, m, numel)[ctx.index] for m in ctx.members], ctx.case.reduce_op)
    ctx.check(item, "the result", out, want)
    ctx.check(item, "the input (must be left alone)", inputs,
              torch.cat(_chunks(ctx, ctx.me, numel)))


def _alltoall(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    inputs = _chunks(ctx, ctx.me, numel)
    outputs = [ctx.empty(numel) for _ in ctx.members]
    ctx.call(dist.all_to_all, outputs, inputs)
    for m, out in zip(ctx.members, outputs, strict=True):
        ctx.check(item, f"the output from rank {m}", out, _chunks(ctx, m, numel)[ctx.index])


def _alltoall_single(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    inputs = torch.cat(_chunks(ctx, ctx.me, numel))
    out = ctx.empty(numel * ctx.size)
    ctx.call(dist.all_to_all_single, out, inputs)
    ctx.check(item, "the output", out,
              torch.cat([_chunks(ctx, m, numel)[ctx.index] for m in ctx.members]))
    ctx.check(item, "the input (must be left alone)", inputs,
              torch.cat(_chunks(ctx, ctx.me, numel)))


def _reduce(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    mine, base = ctx.placed(ctx.data(ctx.me, numel))
    op = getattr(dist.ReduceOp, ctx.case.reduce_op)
    ctx.call(dist.reduce, mine, dst=root, op=op)
    if ctx.me == root:  # elsewhere the tensor's content is unspecified (torch's docs)
        want = reduce([ctx.data(m, numel) for m in ctx.members], ctx.case.reduce_op)
        ctx.check(item, "the result on the root", mine, want)
    ctx.check_between(item, base)


def _gather(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    mine = ctx.data(ctx.me, numel)
    outputs = [ctx.empty(numel) for _ in ctx.members] if ctx.me == root else None
    ctx.call(dist.gather, mine, outputs, dst=root)
    if outputs is not None:
        for m, out in zip(ctx.members, outputs, strict=True):
            ctx.check(item, f"the output from rank {m} on the root", out, ctx.data(m, numel))
    ctx.check(item, "the input (must be left alone)", mine, ctx.data(ctx.me, numel))


def _scatter(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    assert root is not None
    inputs = _chunks(ctx, ctx.me, numel) if ctx.me == root else None
    out, base = ctx.placed(ctx.empty(numel))
    ctx.call(dist.scatter, out, inputs, src=root)
    ctx.check(item, "the result", out, _chunks(ctx, root, numel)[ctx.index])
    ctx.check_between(item, base)
    if inputs is not None:
        for j, chunk in enumerate(inputs):
            ctx.check(item, f"input {j} on the root (must be left alone)", chunk,
                      _chunks(ctx, ctx.me, numel)[j])


def _send_recv(ctx: _Context, item: str, numel: int, root: int | None) -> None:
    """Around the ring: two messages to the next rank, tagged apart, both in flight at once."""
    size, index = ctx.size, ctx.index
    nxt, prev = ctx.members[(index + 1) % size], ctx.members[(index - 1) % size]
    tags = (2 * numel + 1, 2 * numel + 2)
    sent = [ctx.data(ctx.me, numel, salt=s) for s in (1, 2)]
    received = [ctx.placed(ctx.empty(numel)) for _ in tags]
    works = [backend_call(dist.isend, t, nxt, group=ctx.group, tag=tag)
             for t, tag in zip(sent, tags, strict=True)]
    works += [backend_call(dist.irecv, buf, prev, group=ctx.group, tag=tag)
              for (buf, _), tag in zip(received, tags, strict=True)]
    for work in works:
        backend_call(work.wait)
    for salt, tag, (buf, base) in zip((1, 2), tags, received, strict=True):
        ctx.check(item, f"the message tagged {tag} from rank {prev}", buf,
                  ctx.data(prev, numel, salt=salt))
        ctx.check_between(item, base)


def _barrier(ctx: _Context) -> None:
    """Every member but the first arrives late; the first must not leave before them."""
    store = dist.distributed_c10d._get_default_store()
    key = f"collective-barrier/{ctx.members[0]}/"
    first = ctx.me == ctx.members[0]
    if not first:
        time.sleep(BARRIER_DELAY_S)
    store.set(key + str(ctx.me), "arrived")
    ctx.call(dist.barrier)
    if first:
        late = [m for m in ctx.members if not store.check([key + str(m)])]
        if late:
            ctx.keep(Mismatch("barrier", f"ranks that had not arrived when rank {ctx.me} left "
                              "the barrier", 0, [], late, len(late), ctx.size))


def _sparse(ctx: _Context, rank: int) -> Tensor:
    rows = torch.tensor([[rank % 8, (rank + 3) % 8]])
    values = ctx.data(rank, 6).reshape(2, 3)
    return torch.sparse_coo_tensor(rows, values, (8, 3)).to(ctx.device)


def _sparse_allreduce(ctx: _Context) -> None:
    mine = _sparse(ctx, ctx.me)
    op = getattr(dist.ReduceOp, ctx.case.reduce_op)
    value = ctx.call(dist.all_reduce, mine, op=op)
    want = reduce([_sparse(ctx, m).to_dense() for m in ctx.members], ctx.case.reduce_op)
    got = mine if value is None else value[0]
    ctx.check("8x3 sparse COO", "the result (densified)", got.to_dense(), want)


#: The operations run once per size (and root): barrier and sparse allreduce run once.
_RUNNERS: dict[Op, Callable[[_Context, str, int, int | None], None]] = {
    Op.ALLREDUCE: _allreduce,
    Op.BROADCAST: _broadcast,
    Op.ALLGATHER: _allgather,
    Op.ALLGATHER_INTO_TENSOR: _allgather_into_tensor,
    Op.REDUCE_SCATTER: _reduce_scatter,
    Op.REDUCE_SCATTER_TENSOR: _reduce_scatter_tensor,
    Op.ALLTOALL: _alltoall,
    Op.ALLTOALL_SINGLE: _alltoall_single,
    Op.REDUCE: _reduce,
    Op.GATHER: _gather,
    Op.SCATTER: _scatter,
    Op.SEND_RECV: _send_recv,
}
