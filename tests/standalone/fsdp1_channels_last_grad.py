"""FSDP1 NO_SHARD with ``use_orig_params=True`` steps a channels_last parameter with a
permuted gradient.

Standalone (torch only, no harness)::

    python tests/standalone/fsdp1_channels_last_grad.py

Two ranks on Gloo (CPU). A ``Conv2d`` whose weight is channels_last (``model.to(
memory_format=torch.channels_last)``, as vision models are trained) is wrapped three
ways: ``DistributedDataParallel`` (the reference), ``FullyShardedDataParallel(...,
sharding_strategy=NO_SHARD, use_orig_params=True)`` and the same with ``FULL_SHARD``; each
runs one forward, backward and ``SGD`` step on the same per-rank batches.

FSDP1 keeps the weight's strides in the flat parameter (the parameter itself stays
channels_last, and ``summon_full_params(with_grads=True)`` shows the right gradient), but
after backward it gives the original parameter its ``.grad`` as
``flat_grad[offset:offset + numel].reshape(param.shape)``
(``FlatParamHandle._use_sharded_grad_views``, torch 2.13), which ignores the stored
strides: the gradient, laid out in the flat buffer in channels_last memory order, is read
row-major. The optimizer's ``.grad`` is then a permutation of the true gradient (equal,
bitwise, to DDP's gradient read in memory order), and ``optimizer.step()`` updates the
weight with it: training goes on without an error, wrong. FULL_SHARD's original
parameters are 1-d shards, parameter and gradient alike, so its update is right.

Prints one line per wrapper (rank 0): the optimizer's gradient and the weight after the
step against DDP's. Exits 1 when NO_SHARD's weight after the step differs from DDP's.
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

WORLD = 2


def build() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 2))
    return model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]


def train(wrap: str, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One step; the conv weight's ``.grad`` as the optimizer saw it (None under FULL_SHARD
    on a rank whose shard holds none of it), and the full weight after the step."""
    model = build()
    if wrap == "ddp":
        wrapped: nn.Module = DistributedDataParallel(model)
    else:
        wrapped = FSDP(model, sharding_strategy=getattr(ShardingStrategy, wrap),
                       use_orig_params=True, device_id=torch.device("cpu"))
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    wrapped(x).square().mean().backward()
    grad = model[0].weight.grad
    grad = None if grad is None else grad.detach().clone()
    opt.step()
    if wrap == "ddp":
        return grad, model[0].weight.detach().clone()
    with FSDP.summon_full_params(wrapped):
        return grad, model[0].weight.detach().clone()


def worker(rank: int, port: int, out: dict[str, float]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    torch.manual_seed(1 + rank)
    x = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    ref_grad, ref_weight = train("ddp", x)
    assert ref_grad is not None
    if rank == 0:
        print(f"DDP: weight stride {tuple(build()[0].weight.stride())} (channels_last)",
              flush=True)
    for wrap in ("NO_SHARD", "FULL_SHARD"):
        grad, weight = train(wrap, x)
        weight_err = (weight - ref_weight).abs().max().item()
        if rank == 0:
            if grad is None:
                what = "optimizer's .grad is None (none of the weight in this rank's shard)"
            elif grad.shape == ref_grad.shape:
                in_memory_order = ref_grad.permute(0, 2, 3, 1).reshape(-1).view(grad.shape)
                what = (f"optimizer's .grad stride {tuple(grad.stride())}, max |.grad - DDP's| "
                        f"{(grad - ref_grad).abs().max().item():.3g}, equal to DDP's read in "
                        f"memory order: {torch.equal(grad, in_memory_order)}")
            else:
                what = f"optimizer's .grad is this rank's 1-d shard ({grad.numel()} elements)"
            print(f"{wrap}: {what}; weight after step: max |error| vs DDP {weight_err:.3g}",
                  flush=True)
            out[wrap] = weight_err
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=WORLD, join=True)
    return 1 if out["NO_SHARD"] > 1e-6 else 0


if __name__ == "__main__":
    sys.exit(main())
