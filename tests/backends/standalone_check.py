"""Check a c10d backend by hand, outside the harness: two processes, every collective, then DDP.

Run from the repository root::

    python -m tests.backends.standalone_check [--keep-going] [module:backend_name]

(default ``tests.backends.example:example_backend``). Importing ``module`` must register
``backend_name``. Prints one line per check; a wrong value stops the run with exit status 1,
an operation that raises ``NotImplementedError`` is reported ``not implemented`` and skipped.
``--keep-going`` runs every check even after a failure (exit status 1 if any failed).
The ranks agree on each verdict through the rendezvous store, not through the backend.
"""

from __future__ import annotations

import importlib
import socket
import sys
import warnings
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed import ReduceOp
from torch.nn.parallel import DistributedDataParallel

WORLD = 2
TIMEOUT = timedelta(seconds=60)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64]
N = 1030  # above 1024 elements, with small integers exact in every dtype above


class Checker:
    """Runs one check on every rank and has rank 0 print the verdict they agree on."""

    def __init__(self, store: dist.Store, rank: int, keep_going: bool) -> None:
        self.store = store
        self.rank = rank
        self.keep_going = keep_going
        self.count = 0
        self.failures = 0

    def __call__(self, name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
            status = "ok"
        except NotImplementedError as e:
            status = f"not implemented ({e})"
        except Exception as e:
            status = f"FAIL: {type(e).__name__}: {e}".replace("\n", " ")[:300]
        self.count += 1
        key = f"check/{self.count}"
        self.store.set(f"{key}/{self.rank}", status)
        statuses = [self.store.get(f"{key}/{r}").decode() for r in range(WORLD)]
        failures = {
            s: [r for r, t in enumerate(statuses) if t == s] for s in statuses if s.startswith("FAIL")
        }
        failed = [f"rank {', '.join(map(str, ranks))}: {s[6:]}" for s, ranks in failures.items()]
        if self.rank == 0:
            line = "; ".join(failed) if failed else statuses[0]
            mark = "FAIL" if failed else "n/a " if line.startswith("not implemented") else "ok  "
            print(f"{mark} {name}" + ("" if line == "ok" else f": {line}"), flush=True)
        if failed:
            self.failures += 1
            if not self.keep_going:
                sys.exit(1)


def equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    actual = actual.to_dense() if actual.is_sparse else actual
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        raise AssertionError(
            f"got {actual.dtype} {list(actual.shape)}, expected {expected.dtype} {list(expected.shape)}"
        )
    wrong = (actual != expected).nonzero()
    if len(wrong):
        at = tuple(wrong[0].tolist())
        raise AssertionError(
            f"{len(wrong)} of {expected.numel()} elements wrong, first at {list(at)}: "
            f"got {actual[at].item()}, expected {expected[at].item()}"
        )


def base(dtype: torch.dtype, rank: int) -> torch.Tensor:
    """1..5 repeating, shifted by the rank: every reduction of two ranks stays a small integer."""
    return ((torch.arange(N) % 5) + 1 + rank).to(dtype)


def collectives(check: Checker, rank: int) -> None:
    expect = {
        ReduceOp.SUM: lambda a, b: a + b,
        ReduceOp.PRODUCT: lambda a, b: a * b,
        ReduceOp.MIN: torch.minimum,
        ReduceOp.MAX: torch.maximum,
    }
    for dtype in DTYPES:
        for op, combine in expect.items():

            def reduce_all(
                op: ReduceOp = op, combine: Callable = combine, dtype: torch.dtype = dtype
            ) -> None:
                t = base(dtype, rank)
                dist.all_reduce(t, op=op)
                equal(t, combine(base(dtype, 0), base(dtype, 1)))

            check(f"all_reduce {op.name} {dtype}", reduce_all)

        def average(dtype: torch.dtype = dtype) -> None:
            t = base(dtype, 0) + 2 * rank  # the sum is even: the average is exact
            dist.all_reduce(t, op=ReduceOp.AVG)
            equal(t, base(dtype, 0) + 1)

        if dtype.is_floating_point:  # Gloo, like the harness, averages floating dtypes only
            check(f"all_reduce AVG {dtype}", average)

    def booleans() -> None:
        a = torch.tensor([True, True, False, False])
        b = torch.tensor([True, False, True, False])
        for op, want in [
            (ReduceOp.SUM, a | b),
            (ReduceOp.MAX, a | b),
            (ReduceOp.MIN, a & b),
            (ReduceOp.PRODUCT, a & b),
        ]:
            t = (a if rank == 0 else b).clone()
            dist.all_reduce(t, op=op)
            equal(t, want)

    check("all_reduce bool SUM/MAX/MIN/PRODUCT", booleans)

    def non_contiguous() -> None:
        t = (torch.arange(12.0).reshape(3, 4) * (rank + 1)).t()
        assert not t.is_contiguous()
        dist.all_reduce(t)
        equal(t, (torch.arange(12.0).reshape(3, 4) * 3).t())

    check("all_reduce non-contiguous", non_contiguous)

    def empty() -> None:
        t = torch.empty(0)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        equal(t, torch.empty(0))

    check("all_reduce/broadcast 0 elements", empty)

    def sparse() -> None:
        t = torch.sparse_coo_tensor([[rank, 2], [0, 1]], [1.0 + rank, 10.0], (3, 2), check_invariants=True)
        dist.all_reduce(t)
        equal(t, torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 20.0]]))

    check("all_reduce sparse COO", sparse)

    for src in range(WORLD):

        def broadcast(src: int = src) -> None:
            t = torch.full((N,), 10.0 + rank)
            dist.broadcast(t, src=src)
            equal(t, torch.full((N,), 10.0 + src))

        check(f"broadcast from {src}", broadcast)

    def all_gather() -> None:
        out = [torch.zeros(3, dtype=torch.int64) for _ in range(WORLD)]
        dist.all_gather(out, torch.arange(3) + 10 * rank)
        for r in range(WORLD):
            equal(out[r], torch.arange(3) + 10 * r)

    check("all_gather", all_gather)

    def all_gather_into_tensor() -> None:
        out = torch.zeros(WORLD * 3, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.arange(3) + 10 * rank)
        equal(out, torch.tensor([0, 1, 2, 10, 11, 12]))

    check("all_gather_into_tensor", all_gather_into_tensor)

    def coalesced() -> None:
        a, b = torch.tensor([1.0, 2.0]) * (rank + 1), torch.tensor([3.0]) * (rank + 1)
        dist.all_reduce_coalesced([a, b])
        equal(a, torch.tensor([3.0, 6.0]))
        equal(b, torch.tensor([9.0]))
        gathered, scattered = torch.zeros(4), torch.zeros(1)
        with dist._coalescing_manager():
            dist.all_gather_into_tensor(gathered, torch.tensor([1.0, 2.0]) + 10 * rank)
        with dist._coalescing_manager():
            dist.reduce_scatter_tensor(scattered, torch.tensor([1.0, 2.0]) * (rank + 1))
        equal(gathered, torch.tensor([1.0, 2.0, 11.0, 12.0]))
        equal(scattered, torch.tensor([[3.0], [6.0]])[rank])

    check("all_reduce_coalesced, coalesced all_gather/reduce_scatter_tensor", coalesced)

    def reduce_scatter() -> None:
        out = torch.zeros(2)
        dist.reduce_scatter(
            out, [torch.tensor([1.0, 2.0]) * (rank + 1), torch.tensor([3.0, 4.0]) * (rank + 1)]
        )
        equal(out, torch.tensor([[3.0, 6.0], [9.0, 12.0]])[rank])

    check("reduce_scatter", reduce_scatter)

    def reduce_scatter_tensor() -> None:
        out = torch.zeros(2)
        dist.reduce_scatter_tensor(out, torch.tensor([1.0, 2.0, 3.0, 4.0]) * (rank + 1))
        equal(out, torch.tensor([[3.0, 6.0], [9.0, 12.0]])[rank])

    check("reduce_scatter_tensor", reduce_scatter_tensor)

    def all_to_all() -> None:
        out = [torch.zeros(2, dtype=torch.int64) for _ in range(WORLD)]
        dist.all_to_all(out, [torch.tensor([10 * rank + j, 100]) for j in range(WORLD)])
        for j in range(WORLD):
            equal(out[j], torch.tensor([10 * j + rank, 100]))

    check("all_to_all", all_to_all)

    def all_to_all_single() -> None:
        out = torch.zeros(4, dtype=torch.int64)
        dist.all_to_all_single(out, torch.arange(4) + 10 * rank)
        equal(out, torch.tensor([[0, 1, 10, 11], [2, 3, 12, 13]])[rank])

    check("all_to_all_single", all_to_all_single)

    def all_to_all_single_uneven() -> None:
        # rank 0 sends 1 element to rank 0 and 2 to rank 1; rank 1 sends 3 to rank 0, 1 to rank 1.
        send_splits = [[1, 2], [3, 1]][rank]
        recv_splits = [send_splits_of[rank] for send_splits_of in ([1, 2], [3, 1])]
        inp = torch.arange(sum(send_splits)) + 10 * rank
        out = torch.zeros(sum(recv_splits), dtype=torch.int64)
        dist.all_to_all_single(out, inp, recv_splits, send_splits)
        equal(out, [torch.tensor([0, 10, 11, 12]), torch.tensor([1, 2, 13])][rank])

    check("all_to_all_single uneven splits", all_to_all_single_uneven)

    def reduce() -> None:
        t = torch.tensor([1.0, 2.0]) * (rank + 1)
        dist.reduce(t, dst=0)
        if rank == 0:
            equal(t, torch.tensor([3.0, 6.0]))

    check("reduce to 0", reduce)

    def gather() -> None:
        out = [torch.zeros(2) for _ in range(WORLD)] if rank == 0 else None
        dist.gather(torch.tensor([1.0, 2.0]) + rank, out, dst=0)
        if out is not None:
            equal(torch.stack(out), torch.tensor([[1.0, 2.0], [2.0, 3.0]]))

    check("gather to 0", gather)

    def scatter() -> None:
        out = torch.zeros(2)
        parts = [torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])] if rank == 0 else None
        dist.scatter(out, parts, src=0)
        equal(out, torch.tensor([[1.0, 2.0], [3.0, 4.0]])[rank])

    check("scatter from 0", scatter)

    check("barrier", lambda: dist.barrier())

    def point_to_point() -> None:
        if rank == 0:
            works = [
                dist.isend(torch.tensor([1.0]), dst=1, tag=1),
                dist.isend(torch.tensor([2.0]), dst=1, tag=2),
            ]
            for w in works:
                w.wait()
            back = torch.zeros(1)
            dist.recv(back, src=1, tag=3)
            equal(back, torch.tensor([3.0]))
            anywhere = torch.zeros(1)
            assert dist.recv(anywhere) == 1, "recv from any source did not report rank 1"
            equal(anywhere, torch.tensor([4.0]))
        else:
            two, one = torch.zeros(1), torch.zeros(1)
            works = [dist.irecv(two, src=0, tag=2), dist.irecv(one, src=0, tag=1)]
            for w in works:
                w.wait()
            equal(one, torch.tensor([1.0]))
            equal(two, torch.tensor([2.0]))
            dist.send(torch.tensor([3.0]), dst=0, tag=3)
            dist.send(torch.tensor([4.0]), dst=0)

    check("send/recv/isend/irecv with tags, recv from any source", point_to_point)

    def asynchronous() -> None:
        t = base(torch.float32, rank)
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        want = base(torch.float32, 0) + base(torch.float32, 1)
        equal(t, want)
        t = base(torch.float32, rank)
        fut = dist.all_reduce(t, async_op=True).get_future()
        value = fut.wait()
        equal(t, want)
        equal(value[0], want)
        t = base(torch.float32, rank)
        doubled = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
        equal(doubled.wait(), want * 2)

    check("async all_reduce: wait(), get_future().wait(), then()", asynchronous)

    def subgroups() -> None:
        both = dist.new_group([0, 1])
        t = torch.tensor([1.0, 2.0]) * (rank + 1)
        dist.all_reduce(t, group=both)
        equal(t, torch.tensor([3.0, 6.0]))
        alone = dist.new_group([1])
        if rank == 1:
            t = torch.tensor([5.0])
            dist.all_reduce(t, group=alone)
            equal(t, torch.tensor([5.0]))
        other_group = dist.new_group([0, 1])
        t = torch.full((3,), 1.0 + rank)
        dist.broadcast(t, src=1, group=other_group)
        equal(t, torch.full((3,), 2.0))

    check("new_group subgroups", subgroups)


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4)).double()


def data_parallel(check: Checker, rank: int) -> None:
    torch.manual_seed(100)
    batches = [
        (torch.randn(8, 32, dtype=torch.float64), torch.randn(8, 4, dtype=torch.float64)) for _ in range(3)
    ]
    reference = model(seed=0)
    ddp = DistributedDataParallel(model(seed=rank))  # rank 1 starts elsewhere: DDP must broadcast rank 0's
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

    def initial() -> None:
        for p, q in zip(ddp.module.parameters(), reference.parameters(), strict=True):
            equal(p.detach(), q.detach())

    check("DDP initial parameters broadcast from rank 0", initial)
    for step, (x, y) in enumerate(batches):

        def train(x: torch.Tensor = x, y: torch.Tensor = y) -> None:
            half = slice(4 * rank, 4 * rank + 4)
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x[half]), y[half]).backward()
            ref_opt.zero_grad()
            nn.functional.mse_loss(reference(x), y).backward()
            for (name, p), q in zip(ddp.module.named_parameters(), reference.parameters(), strict=True):
                if not torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-8):
                    worst = (p.grad - q.grad).abs().max().item()
                    raise AssertionError(
                        f"gradient of {name} differs from one-process training by {worst:.3g}"
                    )
            opt.step()
            ref_opt.step()

        check(f"DDP step {step + 1} gradients match one-process training", train)


def worker(rank: int, port: int, spec: str, keep_going: bool) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's renamed collectives
    module, _, name = spec.partition(":")
    importlib.import_module(module)
    store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=rank == 0, timeout=TIMEOUT)
    dist.init_process_group(name, store=store, rank=rank, world_size=WORLD, timeout=TIMEOUT)
    check = Checker(dist.PrefixStore("standalone_check", store), rank, keep_going)
    if rank == 0:
        print(f"backend {name!r} from {module}: {type(dist.group.WORLD).__name__}", flush=True)
    collectives(check, rank)
    data_parallel(check, rank)
    dist.destroy_process_group()
    if check.failures:
        if rank == 0:
            print(f"{check.failures} of {check.count} checks failed", flush=True)
        sys.exit(1)


def main(argv: list[str]) -> int:
    keep_going = "--keep-going" in argv
    args = [a for a in argv if a != "--keep-going"]
    spec = args[0] if args else "tests.backends.example:example_backend"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(worker, args=(port, spec, keep_going), nprocs=WORLD)
    except mp.ProcessExitedException as e:
        print(f"stopped: rank {e.error_index} exited with status {e.exit_code}", flush=True)
        return 1
    except mp.ProcessRaisedException as e:
        print(f"stopped: {e}", flush=True)
        return 1
    print("all checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
