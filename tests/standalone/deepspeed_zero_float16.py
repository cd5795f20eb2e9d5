"""DeepSpeed ZeRO-1/2 on CPU: NaN gradients for a float16 model, inf gradients for a
float16 mean near float16's range (and far from it), IndexError for a model without
trainable parameters.

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
3. A float16 ``Linear(4, 2, bias=False)`` under the loss ``(out * t).sum()`` whose local
   gradient is +-2**15 on every rank: the mean over the 2 ranks (2**15) fits float16, the
   sum (2**16) does not. DDP divides before it sums and gives 2**15 exactly. ZeRO-1/2 give
   inf, and they also give inf when every gradient is scaled down to +-2**-5, sums
   included, far from float16's range: the inf is not a sum taken before the division
   (the default ``reduce_scatter`` path divides first, in float32), it is already in the
   rank's own gradient after ``engine.backward``, as in part 1.

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


def near_range(wrapper: str, rank: int, magnitude: float) -> str:
    """The first gradient element (DDP's mean over ranks is ``magnitude``) of a float16
    linear layer whose local gradient is ``+-magnitude`` on every rank."""
    from deepspeed.utils import safe_get_full_grad

    model = nn.Linear(4, 2, bias=False).half()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -0.25, 0.125, 1.0], [-1.0, 0.5, 0.25, -0.5]]))
    x = torch.ones(4, 4, dtype=torch.float16)
    # d loss / d weight[j, k] = sum over the batch of t[j] * x[k] = 4 * t[j] = +-magnitude.
    t = (torch.tensor([1.0, -1.0]) * magnitude / 4).half().expand(4, 2).clone()
    if wrapper == "DDP":
        ddp = nn.parallel.DistributedDataParallel(model)
        (ddp(x) * t).sum().backward()
        grad = model.weight.grad
    else:
        eng = engine(int(wrapper[-1]), model)
        eng.backward((eng(x) * t).sum())  # type: ignore[operator, attr-defined]
        grad = safe_get_full_grad(model.weight)
    value = "None" if grad is None else f"{float(grad[0, 0]):g}"
    return f"{value} (the mean over ranks is {magnitude:g})"


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
    cases = [("no trainable parameters, DDP", lambda: frozen_model(None)),
             ("float16 mean 2**15, DDP", lambda: near_range("DDP", rank, 2.0**15))]
    for stage in (1, 2):
        cases += [(f"float16 model, ZeRO-{stage}", lambda s=stage: float16_grad(s, rank)),
                  (f"fp16 mode, ZeRO-{stage}", lambda s=stage: fp16_mode(s)),
                  (f"no trainable parameters, ZeRO-{stage}", lambda s=stage: frozen_model(s)),
                  (f"float16 mean 2**15, ZeRO-{stage}",
                   lambda s=stage: near_range(f"ZeRO-{s}", rank, 2.0**15)),
                  (f"float16 mean 2**-5, ZeRO-{stage}",
                   lambda s=stage: near_range(f"ZeRO-{s}", rank, 2.0**-5))]
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
    near = any(v.startswith("inf") for k, v in out.items()
               if k.startswith("float16 mean 2**15") and "ZeRO" in k)
    return 1 if nan or index_error or near else 0


if __name__ == "__main__":
    sys.exit(main())
