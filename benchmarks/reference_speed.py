"""Step time of the reference DDP next to torch's DDP, measured side by side in one run.

Two ranks on Gloo (CPU), two models:

* ``mlp10m``: a ~10M-parameter MLP (communication-bound: ~40 MB of gradients per step);
* ``tiny250``: 250 small linear layers, 500 parameter tensors (hook-overhead-bound).

For each model both implementations wrap identical copies, warm up (which includes the
bucket rebuild), then run interleaved rounds ``torch, reference, torch, reference ...``
of ``--steps`` timed steps each (zero_grad, forward, backward, SGD step; each step ends
with a barrier-free ``backward()`` return, so the time includes waiting for the last
bucket). Rank 0 reports the median step time, the interquartile range and the ratio of
medians. A separate probed step counts the allreduces issued before backward reached
the first layer (overlap of communication with backward).

Run: ``python benchmarks/reference_speed.py [--rounds 6] [--steps 10]``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from datetime import timedelta
from typing import Any

import ddp_reference
import torch
import torch.distributed as dist
from torch import nn


def mlp10m() -> nn.Module:
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                         nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 512))


class Tiny(nn.Module):
    def __init__(self, n: int = 250, width: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


MODELS = {"mlp10m": (mlp10m, (32, 512)), "tiny250": (Tiny, (8, 16))}
IMPLS = {"torch": nn.parallel.DistributedDataParallel,
         "reference": ddp_reference.DistributedDataParallel}


class _Counter(dist.ProcessGroup):
    """Forwards to the real group and counts allreduces (overlap probe only)."""

    def __init__(self, inner: dist.ProcessGroup) -> None:
        super().__init__(inner.rank(), inner.size())
        self.inner, self.allreduces = inner, 0

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        self.allreduces += 1
        return self.inner.allreduce(tensors) if opts is None else self.inner.allreduce(tensors, opts)

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        return self.inner.broadcast(tensors) if opts is None else self.inner.broadcast(tensors, opts)

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        return self.inner.allgather(outputs, inputs) if opts is None else \
            self.inner.allgather(outputs, inputs, opts)


class _Probe(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, pg: _Counter, out: list[int]) -> torch.Tensor:  # type: ignore[override]
        ctx.pg, ctx.out = pg, out
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        ctx.out.append(ctx.pg.allreduces)
        return grad, None, None


def overlap_probe(impl: str, name: str) -> tuple[int, int]:
    """(allreduces issued before the first layer's backward, allreduces in the step)."""
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    model = factory()
    pg = _Counter(dist.distributed_c10d._get_default_group())
    ddp = IMPLS[impl](model, process_group=pg)
    first = model[0] if isinstance(model, nn.Sequential) else model.layers[0]  # type: ignore[index]
    seen: list[int] = []
    handle = first.register_forward_hook(lambda m, i, o: _Probe.apply(o, pg, seen))
    x = torch.randn(*shape)
    for _ in range(3):  # the first step is before the bucket rebuild
        seen.clear()
        pg.allreduces = 0
        ddp(x).sum().backward()
    handle.remove()
    return seen[0], pg.allreduces


def worker(rank: int, world: int, init_file: str, rounds: int, steps: int, queue: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=300))
    try:
        report: dict[str, Any] = {}
        for name, (factory, shape) in MODELS.items():
            runners = {}
            for impl, cls in IMPLS.items():
                torch.manual_seed(0)
                model = factory()
                ddp = cls(model)
                opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
                x = torch.randn(*shape)

                def step(ddp: nn.Module = ddp, opt: torch.optim.Optimizer = opt,
                         x: torch.Tensor = x) -> None:
                    opt.zero_grad(set_to_none=True)
                    ddp(x).square().mean().backward()
                    opt.step()

                for _ in range(5):  # warm-up, includes the bucket rebuild
                    step()
                runners[impl] = step
            times: dict[str, list[float]] = {impl: [] for impl in IMPLS}
            for _ in range(rounds):
                for impl, step in runners.items():
                    for _ in range(steps):
                        start = time.perf_counter()
                        step()
                        times[impl].append(time.perf_counter() - start)
            report[name] = {"times": times,
                            "overlap": {impl: overlap_probe(impl, name) for impl in IMPLS},
                            "tensors": sum(1 for _ in factory().parameters()),
                            "params": sum(p.numel() for p in factory().parameters())}
        queue.put((rank, report))
    finally:
        dist.destroy_process_group()


def _stats(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=4)
    return statistics.median(values), q[0], q[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    world = 2
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        init_file = os.path.join(tmp, "store")
        procs = [ctx.Process(target=worker, args=(r, world, init_file, args.rounds, args.steps,
                                                  queue)) for r in range(world)]
        for p in procs:
            p.start()
        reports = dict(queue.get(timeout=1800) for _ in procs)
        for p in procs:
            p.join()
    report = reports[0]
    print(f"torch {torch.__version__}, Gloo, {world} ranks, {os.cpu_count()} CPUs, "
          f"{args.rounds} interleaved rounds x {args.steps} steps per implementation")
    header = (f"{'model':<9} {'tensors':>7} {'params':>10} {'impl':<10} {'median ms':>10} "
              f"{'IQR ms':>15} {'ratio':>6}  overlap (allreduces before 1st layer / total)")
    print(header)
    print("-" * len(header))
    for name, data in report.items():
        base = _stats(data["times"]["torch"])[0]
        for impl in IMPLS:
            med, q1, q3 = _stats(data["times"][impl])
            before, total = data["overlap"][impl]
            print(f"{name:<9} {data['tensors']:>7} {data['params']:>10} {impl:<10} "
                  f"{med * 1e3:>10.2f} {q1 * 1e3:>7.2f}-{q3 * 1e3:<7.2f} {med / base:>6.3f}  "
                  f"{before}/{total}")


if __name__ == "__main__":
    main()
