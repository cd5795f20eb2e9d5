"""DeepSpeed cannot build its engine on a model whose weights are in channels_last.

Standalone (torch and deepspeed, no harness)::

    python tests/standalone/deepspeed_channels_last.py

Two ranks on Gloo (CPU), a small convolutional net moved to ``torch.channels_last``
(``model.to(memory_format=torch.channels_last)``, the usual way to train a CNN in NHWC).
``DistributedDataParallel`` wraps it and trains a step. ``deepspeed.initialize`` (0.19.8;
ZeRO stage 0, 1 and 2 alike) raises ``RuntimeError: self.stride(-1) must be 1 to view Float
as Byte (different element sizes), but got 3`` before any training: the engine's
construction-time broadcast of rank 0's weights (``DeepSpeedEngine._broadcast_model``)
sends every parameter as ``p.data.view(torch.uint8)``, and ``Tensor.view(dtype)`` to a
smaller element type needs a last dimension of stride 1, which a channels_last conv weight
(strides ``(C_in*kH*kW, 1, kW*C_in, C_in)``) has only when ``C_in == 1``. The same net in
the default contiguous format initializes. Related, older form of the same broadcast
(``dist.broadcast(p.data, ...)`` refusing non-contiguous parameters): deepspeedai/DeepSpeed#6571
(open). Prints one line per case (rank 0); exits 1 when DeepSpeed failed where DDP worked.
"""
from __future__ import annotations

import logging
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = 2


def net(channels_last: bool) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model


def batch(channels_last: bool) -> torch.Tensor:
    x = torch.randn(4, 3, 6, 6)
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def with_ddp(channels_last: bool) -> str:
    model = nn.parallel.DistributedDataParallel(net(channels_last))
    model(batch(channels_last)).sum().backward()
    return "ok (constructed, one backward)"


def with_deepspeed(stage: int, channels_last: bool) -> str:
    import deepspeed

    model = net(channels_last)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": stage},
              "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0,
              "steps_per_print": 2**31 - 1}
    try:
        engine, _, _, _ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config,
            dist_init_required=False)
        engine.backward(engine(batch(channels_last)).sum())
        engine.step()
    except RuntimeError as exc:
        return f"RuntimeError: {str(exc).splitlines()[0][:110]}"
    return "ok (initialize, one backward and step)"


def worker(rank: int, port: int, out: dict[str, str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    cases = [("DDP, channels_last", lambda: with_ddp(True))]
    for stage in (0, 1, 2):
        cases.append((f"deepspeed ZeRO-{stage}, channels_last",
                      lambda stage=stage: with_deepspeed(stage, True)))
    cases.append(("deepspeed ZeRO-2, contiguous", lambda: with_deepspeed(2, False)))
    for name, run in cases:
        result = run()
        if rank == 0:
            out[name] = result
            print(f"{name:34s} {result}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=WORLD, join=True)
    ddp_ok = out["DDP, channels_last"].startswith("ok")
    deepspeed_failed = any(not v.startswith("ok") for k, v in out.items()
                           if k.startswith("deepspeed") and "channels_last" in k)
    return 1 if ddp_ok and deepspeed_failed else 0


if __name__ == "__main__":
    sys.exit(main())
