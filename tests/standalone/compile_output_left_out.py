"""torch.compile gives parameters of an output left out of the loss zero gradients, not None.

Standalone (torch only, no harness). Run from anywhere::

    python tests/standalone/compile_output_left_out.py     # or: torchrun --nproc-per-node 2 ...

A model returns ``{"heads": Heads(h), "aux": aux(h)}`` (``Heads`` a dataclass) and the
loss leaves ``aux`` out. Eager autograd leaves ``aux.weight.grad`` ``None``; a
``torch.compile``'d model (``aot_eager``) gives it a zero tensor (AOTAutograd materialises
the missing output gradient as zeros: pytorch/pytorch#131794, open). Under
``DistributedDataParallel(find_unused_parameters=True)`` eager DDP raises at the next
forward ("Expected to have finished reduction in the prior iteration ...": the parameter is
reachable from the outputs but produced no gradient); compiled DDP raises nothing and
all-reduces the zero gradient. With a plain dict output eager DDP handles the left-out
output (``aux`` keeps a ``None`` gradient) and compiled DDP again gives zeros, so an
optimizer with momentum or weight decay moves a parameter that eager training leaves
alone. Prints one line per case (rank 0); exits 1 when compiled DDP behaved unlike eager DDP.
"""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

WORLD = 2


@dataclass
class Heads:
    main: Tensor


class WithAux(nn.Module):
    """``{"heads": Heads(h), "aux": aux(h)}`` (or ``{"heads": h, ...}`` without the dataclass)."""

    def __init__(self, dataclass_output: bool = True) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.aux = nn.Linear(4, 2)
        self.dataclass_output = dataclass_output

    def forward(self, x: Tensor) -> dict[str, Any]:
        h = self.body(x)
        return {"heads": Heads(h) if self.dataclass_output else h, "aux": self.aux(h)}


def main_output(out: dict[str, Any]) -> Tensor:
    heads = out["heads"]
    return heads.main if isinstance(heads, Heads) else heads


def one_process() -> tuple[str, str]:
    torch.manual_seed(0)
    eager = WithAux()
    compiled = copy.deepcopy(eager)
    x = torch.randn(3, 4)
    main_output(eager(x)).sum().backward()
    main_output(torch.compile(compiled, backend="aot_eager")(x)).sum().backward()
    return repr(eager.aux.weight.grad), repr(compiled.aux.weight.grad)


def ddp(compiled: bool, dataclass_output: bool) -> str:
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = WithAux(dataclass_output)
    model = DistributedDataParallel(module, find_unused_parameters=True)
    run = torch.compile(model, backend="aot_eager") if compiled else model
    try:
        for step in range(3):
            torch.manual_seed(100 * step + dist.get_rank())
            main_output(run(torch.randn(3, 4))).sum().backward()
    except RuntimeError as exc:
        return f"raised at step {step}: {str(exc).splitlines()[0][:90]}..."
    grad = module.aux.weight.grad
    return f"no error in 3 steps; aux.weight.grad = {None if grad is None else grad.tolist()}"


def main(rank: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    eager_grad, compiled_grad = one_process()
    lines = [f"one process, eager:         aux.weight.grad = {eager_grad}",
             f"one process, torch.compile: aux.weight.grad = {' '.join(compiled_grad.split())}"]
    differs = False
    for dataclass_output in (True, False):
        eager_ddp, compiled_ddp = ddp(False, dataclass_output), ddp(True, dataclass_output)
        differs |= eager_ddp != compiled_ddp
        shape = "dict holding a dataclass" if dataclass_output else "plain dict"
        lines += [f"DDP(find_unused_parameters), {shape}, eager DDP:          {eager_ddp}",
                  f"DDP(find_unused_parameters), {shape}, torch.compile(DDP): {compiled_ddp}"]
    if rank == 0:
        print("\n".join(lines), flush=True)
    dist.destroy_process_group()
    if rank == 0 and differs:
        sys.exit(1)


if __name__ == "__main__":
    if "RANK" in os.environ:  # under torchrun
        main(int(os.environ["RANK"]))
    else:
        try:
            mp.spawn(main, nprocs=WORLD)
        except mp.ProcessExitedException:
            sys.exit(1)
