"""DeepSpeed ZeRO-1/2 on CPU: NaN gradients for a float16 model, IndexError for a model
without trainable parameters.

Standalone (torch and deepspeed, no harness)::

    python tests/standalone/deepspeed_zero_float16.py

Two ranks on Gloo (CPU), DeepSpeed 0.19.8, the engine configured as a user would for plain
SGD (``zero_optimization.stage`` 1 or 2, no fp16 section, clipping off).

1. A small MLP wholly in float16 (``model.half()``). ``DistributedDataParallel`` averages
   its gradients (finite, checked against the mean of both ranks' local gradients computed
   here in one process). After ``engine.backward`` the gradient DeepSpeed documents for
   reading (``deepspeed.utils.safe_get_full_grad``) is NaN at ZeRO-1 and ZeRO-2. DeepSpeed's
   own way to train in float16, ``"fp16": {"enabled": true}``, is refused on this CPU
   (``ValueError: Type fp16 is not supported on your device``), so nothing tells the user.
2. A model whose parameters all have ``requires_grad=False``: DDP's constructor refuses it
   with a message that says so; ZeRO-1/2's optimizer constructor raises ``IndexError: list
   index out of range`` (``Stage1And2ZeroOptimizer.__init__``: ``self.bit16_groups[i][0]``
   of an empty group).

Prints one line per case (rank 0); exits 1 when DeepSpeed deviated where DDP worked.
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
CONFIG = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
          "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0,
          "steps_per_print": 2**31 - 1}


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).half()


def data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1 + rank)
    return torch.randn(4, 8, generator=gen).half(), torch.randn(4, 4, generator=gen).half()


def ddp_mean_grad() -> torch.Tensor:
    """The first weight's gradient DDP gives: the mean of both ranks' local gradients."""
    grads = []
    for rank in range(WORLD):
        model = mlp()
        x, y = data(rank)
        ((model(x) - y) ** 2).mean().backward()
        grads.append(model[0].weight.grad.float())
    return sum(grads) / WORLD


def engine(stage: int, model: nn.Module, extra: dict[str, object] | None = None) -> object:
    import deepspeed

    config = dict(CONFIG, zero_optimization={"stage": stage}, **(extra or {}))
    params = [p for p in model.parameters()]
    eng, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(params, lr=0.1),
                                        config=config, dist_init_required=False)
    return eng


def float16_grad(stage: int, rank: int) -> str:
    from deepspeed.utils import safe_get_full_grad

    model = mlp()
    eng = engine(stage, model)
    x, y = data(rank)
    eng.backward(((eng(x) - y) ** 2).mean())  # type: ignore[operator, attr-defined]
    grad = safe_get_full_grad(model[0].weight)
    want = ddp_mean_grad()
    if not bool(torch.isfinite(grad).all()):
        return f"NaN/inf gradient (DDP's is finite, max|g| {want.abs().max():.3g})"
    return f"finite, max error {(grad.float() - want).abs().max():.3g} against DDP's"


def fp16_mode(stage: int) -> str:
    try:
        engine(stage, mlp(), {"fp16": {"enabled": True, "loss_scale": 1.0}})
    except ValueError as exc:
        return f"refused: ValueError: {exc}"
    return "ok"


def frozen_model(stage: int | None) -> str:
    model = nn.Linear(4, 4)
    model.requires_grad_(False)
    try:
        if stage is None:
            nn.parallel.DistributedDataParallel(model)
        else:
            engine(stage, model)
    except Exception as exc:  # noqa: BLE001 - the point is which exception
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}"
    return "accepted"


def worker(rank: int, port: int, out: dict[str, str]) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    cases = [("no trainable parameters, DDP", lambda: frozen_model(None))]
    for stage in (1, 2):
        cases += [(f"float16 model, ZeRO-{stage}", lambda s=stage: float16_grad(s, rank)),
                  (f"fp16 mode, ZeRO-{stage}", lambda s=stage: fp16_mode(s)),
                  (f"no trainable parameters, ZeRO-{stage}", lambda s=stage: frozen_model(s))]
    for name, run in cases:
        result = run()
        if rank == 0:
            out[name] = result
            print(f"{name:38s} {result}", flush=True)
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(worker, args=(port, out), nprocs=WORLD, join=True)
    nan = any(v.startswith("NaN") for k, v in out.items() if k.startswith("float16"))
    index_error = any(v.startswith("IndexError") for k, v in out.items()
                      if k.startswith("no trainable") and "ZeRO" in k)
    return 1 if nan or index_error else 0


if __name__ == "__main__":
    sys.exit(main())
