"""FSDP2 (``fully_shard``) with experts used on some ranks only, over a ``no_sync`` window:
the gradients without and with ``set_reduce_scatter_unused_params``.

Standalone (torch only, no harness)::

    python tests/standalone/fsdp2_unused_params.py

Three ranks on Gloo (CPU), torch 2.13. A model of four "experts" (``nn.Linear(6, 6)``:
two rows of each weight and bias per rank, no padding) under one ``fully_shard``; one
step of two microbatches, the first inside the window
(``set_requires_gradient_sync(False)``, what DDP's ``no_sync`` is for FSDP2), the second
synced:

========  =====================  =================
rank      window microbatch      synced microbatch
========  =====================  =================
0, 1      expert 0               expert 1
2         expert 2               expert 1
========  =====================  =================

Expert 3 is used on no rank. DDP with ``find_unused_parameters=True`` gives experts 0-2
the average over the ranks of each rank's accumulated gradient (zero where a rank did not
use it) on every rank, and expert 3 no gradient (``None``).

1. **Without** ``set_reduce_scatter_unused_params``: each rank reduce-scatters the
   parameters that have a gradient on *that rank* (accumulated in the window or from the
   synced backward): experts 0 and 1 on ranks 0 and 1, experts 1 and 2 on rank 2. The
   sizes agree, so Gloo raises nothing, and the reduce-scatter sums different experts'
   gradients together: expert 0's on ranks 0, 1 with expert 1's on rank 2, expert 1's
   with expert 2's. Ranks 0 and 1 get wrong gradients for experts 0 and 1 and none for
   expert 2; rank 2 wrong ones for experts 1 and 2 and none for expert 0. (Where the
   sizes differ, Gloo aborts the process.)
   This is the mismatch ``set_reduce_scatter_unused_params``'s docstring names ("causing
   mismatched reduce-scatter collectives. Similar to DDP's find_unused_parameters"): not
   a defect, the setting DDP's ``find_unused_parameters=True`` corresponds to is off.
2. **With** ``set_reduce_scatter_unused_params(True)``: every rank reduce-scatters every
   parameter that requires a gradient (zeros where it has none): experts 0-2 get DDP's
   average on every rank, and expert 3 a zero gradient where DDP leaves ``None`` (the
   setter's documented behaviour: "include zero gradients for unused parameters").

Each rank compares its local shard of every ``.grad`` with the same rows of DDP's average,
computed here in each process from the four ranks' local gradients. Prints one line per
case and rank; exits 1 when, with the setting on, an expert some rank used does not get
DDP's average (a defect of FSDP2); 0 otherwise (case 1 is printed, not judged).
"""
from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

WORLD = 3
EXPERTS = 4
#: Per rank, the expert each microbatch routes to: the window's, then the synced one's.
ROUTES = {0: (0, 1), 1: (0, 1), 2: (2, 1)}
#: The average of three float32 gradients, summed in any order and divided before or
#: after (FSDP2's pre/post divide factors on Gloo), is within a few roundings of the exact
#: one, each at most half an ulp of a partial sum bounded by sum_r |g_r|: 4 such ulps
#: bound it; a misrouted sum is off by the size of a gradient itself.
ULPS = 4


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(6, 6) for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor, expert: int) -> torch.Tensor:
        return self.experts[expert](x)


def build() -> Experts:
    torch.manual_seed(0)
    return Experts()


def microbatch(rank: int, index: int) -> torch.Tensor:
    return torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * rank + index))


def local_grads(rank: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s gradients accumulated over both microbatches, unwrapped (zeros
    where it used the parameter in neither)."""
    model = build()
    for index, expert in enumerate(ROUTES[rank]):
        model(microbatch(rank, index), expert).square().mean().backward()
    return {n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in
            model.named_parameters()}


def ddp_average() -> dict[str, tuple[torch.Tensor | None, torch.Tensor]]:
    """DDP's gradient per parameter (None where no rank used it) and sum_r |g_r|."""
    grads = [local_grads(rank) for rank in range(WORLD)]
    used = {f"experts.{e}." for route in ROUTES.values() for e in route}
    out: dict[str, tuple[torch.Tensor | None, torch.Tensor]] = {}
    for name in grads[0]:
        stack = torch.stack([g[name] for g in grads])
        mean = stack.sum(0) / WORLD if any(name.startswith(u) for u in used) else None
        out[name] = (mean, stack.abs().sum(0))
    return out


def judge(rank: int, name: str, grad: torch.Tensor | None,
          expected: tuple[torch.Tensor | None, torch.Tensor]) -> str:
    """What this rank's shard of ``name``'s gradient is, against DDP's."""
    mean, scale = expected
    if mean is None:
        if grad is None:
            return "None, as DDP"
        zero = bool((grad.to_local() == 0).all())
        return "zeros (DDP: None)" if zero else "a nonzero gradient (DDP: None)"
    if grad is None:
        return "None (DDP: the average)"
    rows = torch.chunk(mean, WORLD, 0)[rank]
    bound = ULPS * torch.finfo(torch.float32).eps * torch.chunk(scale, WORLD, 0)[rank]
    error = (grad.to_local() - rows).abs()
    return "DDP's average" if bool((error <= bound).all()) else (
        f"wrong (max |error| {error.max().item():.3g})")


def worker(rank: int, port: int, out: dict[str, bool]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    expected = ddp_average()
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    for case in ("without set_reduce_scatter_unused_params",
                 "set_reduce_scatter_unused_params(True)"):
        model = build()
        fully_shard(model, mesh=mesh)
        model.set_reduce_scatter_unused_params(case.endswith("(True)"))
        for index, expert in enumerate(ROUTES[rank]):
            model.set_requires_gradient_sync(index == len(ROUTES[rank]) - 1)
            model(microbatch(rank, index), expert).square().mean().backward()
        seen = {n: judge(rank, n, p.grad, expected[n]) for n, p in model.named_parameters()
                if n.endswith("weight")}
        lines: list[str | None] = [None] * WORLD
        dist.all_gather_object(lines, f"{case}, rank {rank}: " + "; ".join(
            f"{n.removesuffix('.weight')} {what}" for n, what in seen.items()))
        if rank == 0:
            print("\n".join(str(line) for line in lines), flush=True)
        if case.endswith("(True)"):
            out[f"rank{rank}"] = all(what in ("DDP's average", "zeros (DDP: None)")
                                     for what in seen.values())
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=WORLD, join=True)
    return 0 if all(out.get(f"rank{r}", False) for r in range(WORLD)) else 1


if __name__ == "__main__":
    sys.exit(main())
