"""FSDP1 FULL_SHARD cannot backward through two reentrant checkpoints in one FSDP unit.

Standalone (torch only, no harness)::

    python tests/standalone/fsdp1_full_shard_reentrant_checkpoint.py

Two ranks on Gloo (CPU). A model of two blocks, each run as
``torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)`` (as a GPT runs its
transformer blocks), is wrapped four ways and trained one forward, backward and ``SGD``
step on the same per-rank batches:

- ``DistributedDataParallel`` (the reference);
- ``FullyShardedDataParallel(..., NO_SHARD, use_orig_params=True)``, one unit;
- ``FULL_SHARD`` with each block its own FSDP unit (the layout ``auto_wrap_policy`` gives);
- ``FULL_SHARD`` as one unit: both blocks' parameters in one ``FlatParameter``.

Reentrant checkpointing runs each block's recomputed forward and its backward in a nested
``torch.autograd.backward`` inside the outer one, so the ``FlatParameter``'s
``AccumulateGrad`` (where FSDP1 hooks its post-backward) runs at the end of the *first*
nested backward. torch 2.13 means to allow that ("For multiple applications of reentrant
AC across submodules sharing the same ``FlatParameter``, the post-backward hook may run
multiple times in one backward", ``_runtime_utils._post_backward_hook``), and under
NO_SHARD it only reduces the gradient a second time. Under FULL_SHARD the hook also
reshards (``_post_backward_reshard``: ``_should_free_in_backward`` is true for a sharded
strategy that syncs gradients) and frees the unsharded ``FlatParameter``; the next
block's recomputed forward then runs on the 1-d (or empty) shard views of its
parameters and fails ("mat2 must be a matrix, got 1-D tensor" here; in a GPT "size
mismatch, got input (32), mat (32x16), vec (768)" or a LayerNorm "weight of shape [0]").
FSDP's state is left in ``FORWARD_BACKWARD``, so a later ``summon_full_params`` raises
"Cannot manually unshard parameters during forward/backward".

Prints one line per wrapper (rank 0): the weights after the step against DDP's, or the
error. Exits 1 when the one-unit FULL_SHARD run raises.
"""
from __future__ import annotations

import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import ShardingStrategy
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

WORLD = 2
WIDTH = 8


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())
                                    for _ in range(2))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return self.head(x)


def train(wrap: str, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """One step; the full parameters after it."""
    torch.manual_seed(0)
    model = Model()
    if wrap == "ddp":
        wrapped: nn.Module = DistributedDataParallel(model)
    elif wrap == "FULL_SHARD per block":
        for i, block in enumerate(model.blocks):
            model.blocks[i] = FSDP(block, sharding_strategy=ShardingStrategy.FULL_SHARD,
                                   use_orig_params=True, device_id=torch.device("cpu"))
        wrapped = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD,
                       use_orig_params=True, device_id=torch.device("cpu"))
    else:
        wrapped = FSDP(model, sharding_strategy=getattr(ShardingStrategy, wrap),
                       use_orig_params=True, device_id=torch.device("cpu"))
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    x = x.clone().requires_grad_(True)  # reentrant checkpointing needs an input with grad
    wrapped(x).square().mean().backward()
    opt.step()
    if wrap == "ddp":
        return {n: p.detach().clone() for n, p in model.named_parameters()}
    with FSDP.summon_full_params(wrapped):
        return {n.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
                for n, p in wrapped.named_parameters()}


def worker(rank: int, port: int, out: dict[str, str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    torch.manual_seed(1 + rank)
    x = torch.randn(4, WIDTH)
    ref = train("ddp", x)
    for wrap in ("NO_SHARD", "FULL_SHARD per block", "FULL_SHARD"):
        try:
            got = train(wrap, x)
            err = max((got[n] - ref[n]).abs().max().item() for n in ref)
            line = f"trains; max |weight - DDP's| after the step {err:.3g}"
        except Exception as exc:  # noqa: BLE001 - the finding is that it raises
            line = f"raises {type(exc).__name__}: {str(exc).splitlines()[0]}"
        if rank == 0:
            print(f"{wrap}: {line}", flush=True)
            out[wrap] = line
        if line.startswith("raises"):
            break  # FSDP's state is broken; stop before another collective
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=WORLD, join=True)
    return 1 if out.get("FULL_SHARD", "").startswith("raises") else 0


if __name__ == "__main__":
    sys.exit(main())
