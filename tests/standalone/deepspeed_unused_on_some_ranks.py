"""DeepSpeed ZeRO-1/2 abort when a parameter is unused on some ranks.

Standalone (torch and deepspeed, no harness)::

    python tests/standalone/deepspeed_unused_on_some_ranks.py

Two ranks on Gloo (CPU), DeepSpeed 0.19.8, the engine configured as a user would for plain
SGD (``zero_optimization.stage`` 1 or 2, no fp16 section, clipping off). The model has a
branch ``extra`` that rank 1 never runs, so on rank 1 ``extra``'s parameters get no
gradient in backward.

``DistributedDataParallel(find_unused_parameters=True)`` gives rank 1 the averaged gradient
of ``extra`` (half of rank 0's). ZeRO-1/2 put in each rank's reduction bucket only the
gradients that rank's backward produced, so the two ranks all-reduce buckets of different
sizes (``average_tensor``'s ``all_reduce``): Gloo aborts rank 1 (SIGABRT, "op.preamble.length
<= op.nbytes. 72 vs 36. Received data size doesn't match expected size") and rank 0 fails
with "Connection reset by peer". Stage 0 (no ZeRO) reduces one flat buffer of every
gradient and trains, as DDP.

Each case runs in its own pair of processes (an abort kills them); every wait has a
deadline (the process group's timeout, the parent's joins). Prints one line per case and
exits 1 when ZeRO-1 or ZeRO-2 failed where DDP trained.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

WORLD = 2
TIMEOUT = timedelta(seconds=30)  # every collective gives up after this
DEADLINE_S = 120.0  # per case, for the parent's joins
CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0,
          "steps_per_print": 2**31 - 1}


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(8, 4)
        self.extra = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, use_extra: bool) -> torch.Tensor:
        out = self.body(x)
        return out + self.extra(x) if use_extra else out


def train(case: str, rank: int) -> str:
    """One forward/backward/step; ``extra`` is unused on rank 1. Returns rank's
    ``extra.weight`` gradient's first element after backward."""
    model = Branchy()
    x = torch.ones(2, 8)
    use_extra = rank != 1
    if case == "DDP":
        ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
        ddp(x, use_extra).sum().backward()
        grad = model.extra.weight.grad
    else:
        import deepspeed
        from deepspeed.utils import safe_get_full_grad

        config = dict(CONFIG, zero_optimization={"stage": int(case[-1])})
        eng, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config,
            dist_init_required=False)
        eng.backward(eng(x, use_extra).sum())
        grad = safe_get_full_grad(model.extra.weight)
        eng.step()
    return "None" if grad is None else f"{float(grad.flatten()[0]):g}"


def rank_main(case: str, rank: int, port: int, out: mp.Queue[str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD, timeout=TIMEOUT)
    out.put(f"rank {rank} extra.weight.grad[0, 0] = {train(case, rank)}")
    dist.destroy_process_group()


def run_case(case: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out: mp.Queue[str] = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(case, r, port, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=DEADLINE_S)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=10)
    codes = [p.exitcode for p in procs]
    lines = []
    while not out.empty():
        lines.append(out.get(timeout=5))
    if codes == [0] * WORLD:
        return "trained: " + "; ".join(sorted(lines))
    return f"failed: exit codes {codes} (negative: killed by that signal)"


def main() -> int:
    results = {}
    for case in ("DDP", "ZeRO-0", "ZeRO-1", "ZeRO-2"):
        results[case] = run_case(case)
        print(f"{case:7s} {results[case]}", flush=True)
    ddp_ok = results["DDP"].startswith("trained")
    zero_fails = any(results[c].startswith("failed") for c in ("ZeRO-1", "ZeRO-2"))
    return 1 if ddp_ok and zero_fails else 0


if __name__ == "__main__":
    sys.exit(main())
