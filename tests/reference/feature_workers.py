"""Rank-side code for the reference's feature tests: errors, sync strategies, Join, comm
hooks, overlap and gradient views. Each function runs on every rank and returns plain
data (or raises, which ``run_distributed`` reports with the rank's traceback)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ddp_reference
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer

from tests.reference import models
from tests.reference.workers import IMPLS, traced


def _error_text(fn: Callable[[], Any]) -> str | None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return f"{type(exc).__name__}: {exc}"
    return None


# ----------------------------------------------------------------------------- errors
def errors(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ref = ddp_reference.DistributedDataParallel
    # 1. an argument torch's DDP has but the reference does not support
    out["unsupported"] = _error_text(lambda: ref(models.MLP(), mixed_precision=None))
    out["unknown"] = _error_text(lambda: ref(models.MLP(), not_an_option=1))

    # 2. shape mismatch at init: rank 1's fc2 is wider; every rank must raise, no hang
    def mismatched() -> None:
        m = models.MLP()
        if rank == 1:
            m.fc2 = nn.Linear(32, 33)
            m.fc3 = nn.Linear(33, 4)
        ref(m)
    out["shape_mismatch"] = _error_text(mismatched)

    def fewer_params() -> None:
        m = models.MLP()
        if rank == 1:
            m.fc3 = nn.Linear(32, 4, bias=False)
        ref(m)
    out["count_mismatch"] = _error_text(fewer_params)

    # 3. a parameter unused on every rank without find_unused_parameters: the next forward
    #    raises torch's error, naming the indices (compared with torch's own message)
    def unused(impl: str) -> str | None:
        torch.manual_seed(0)
        m = models.UnusedOnSomeRanks()
        ddp = IMPLS[impl](m)
        ddp(torch.randn(2, 8)).sum().backward()
        return _error_text(lambda: ddp(torch.randn(2, 8)))
    out["unused_torch"] = unused("torch")
    out["unused_reference"] = unused("reference")

    # 4. a second comm hook
    def twice(impl: str) -> str | None:
        ddp = IMPLS[impl](models.MLP())
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        return _error_text(lambda: ddp.register_comm_hook(None, default_hooks.allreduce_hook))
    out["second_hook_torch"] = twice("torch")
    out["second_hook_reference"] = twice("reference")

    # 5. hooks firing twice (reentrant checkpointing) without static_graph
    def marked_twice(impl: str) -> str | None:
        ddp = IMPLS[impl](models.CheckpointedTwice())
        return _error_text(lambda: ddp(torch.randn(2, 8)).sum().backward())
    out["twice_torch"] = marked_twice("torch")
    out["twice_reference"] = marked_twice("reference")

    # 6. device_ids on a CPU module, a module with nothing to train
    out["cpu_device_ids"] = _error_text(lambda: ref(models.MLP(), device_ids=[0]))
    out["no_grad_params"] = _error_text(lambda: ref(models.MLP().requires_grad_(False)))
    return out


# ----------------------------------------------------------------------------- sync strategies
def sync_strategies(rank: int, world_size: int) -> dict[str, Any]:
    """Composer's ``test_ddp_sync_strategy``: 2 ranks, 2 microbatches, scalar weights at 0,
    microbatch i uses weight i; loss (w - target)^2 / 2 with target rank+1, so the local
    gradients are -1 (rank 0) and -2 (rank 1). Gradients of rank 0 after each microbatch
    and after the context of the last one."""
    out: dict[str, Any] = {}
    for impl in IMPLS:
        for strategy in ddp_reference.SyncStrategy:
            model = models.Scalars()
            ddp = IMPLS[impl](model, find_unused_parameters=True)
            target = torch.tensor([float(rank + 1)])
            seen = []
            for microbatch in range(2):
                with ddp_reference.ddp_sync_context(ddp, microbatch == 1, strategy):
                    output = ddp(microbatch + 1)
                    loss = (output - target) * (output - target)
                    loss.mul_(1 / 2)
                    loss.backward()
                    seen.append([None if p.grad is None else p.grad.item()
                                 for p in model.parameters()])
            seen.append([None if p.grad is None else p.grad.item() for p in model.parameters()])
            out[f"{impl}/{strategy.value}"] = seen
    return out


# ----------------------------------------------------------------------------- join
def _join_run(rank: int, impl: str, divide_initial: bool, use_zero: bool,
              buffers: bool) -> dict[str, Any]:
    torch.manual_seed(3 + rank)
    model: nn.Module = models.ConvBN() if buffers else models.MLP()
    ddp = IMPLS[impl](model, bucket_cap_mb=0.001)
    if use_zero:
        opt: Any = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.05)
        joinables = [ddp, opt]
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        joinables = [ddp]
    gen = torch.Generator().manual_seed(50 + rank)
    grads = []
    with Join(joinables, divide_by_initial_world_size=divide_initial):
        for _ in range(2 + 2 * rank):  # uneven: rank r has 2 + 2r batches
            models.loss_of(ddp(torch.randn(4, 8, generator=gen))).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
            opt.zero_grad()
    return {"grads": grads, "params": [p.detach().clone() for p in model.parameters()],
            "buffers": [b.detach().clone() for b in model.buffers()]}


def join_equivalence(rank: int, world_size: int) -> dict[str, Any]:
    out = {}
    for divide_initial in (True, False):
        for use_zero, buffers in ((False, False), (True, False), (False, True)):
            key = f"divide_initial={divide_initial} zero={use_zero} buffers={buffers}"
            a = _join_run(rank, "torch", divide_initial, use_zero, buffers)
            b = _join_run(rank, "reference", divide_initial, use_zero, buffers)
            diffs = []
            for step, (ga, gb) in enumerate(zip(a["grads"], b["grads"], strict=True)):
                diffs += [f"step {step} grad {i}" for i, (x, y) in enumerate(zip(ga, gb, strict=True))
                          if not torch.equal(x, y)]
            pairs = zip(a["params"], b["params"], strict=True)
            diffs += [f"final param {i}" for i, (x, y) in enumerate(pairs)
                      if not torch.equal(x, y)]
            diffs += [f"final buffer {i}" for i, (x, y) in
                      enumerate(zip(a["buffers"], b["buffers"], strict=True)) if not torch.equal(x, y)]
            out[key] = {"diffs": diffs, "params": [p.tolist() for p in b["params"]],
                        "buffers": [x.tolist() for x in b["buffers"]]}
    return out


def join_divisors(rank: int, world_size: int) -> dict[str, Any]:
    """A scalar weight whose local gradient is rank+1 every step; rank r has r+1 steps.
    Returns, per step, the reduced gradient seen by the ranks still active."""
    out: dict[str, Any] = {}
    for divide_initial in (True, False):
        model = nn.Linear(1, 1, bias=False)
        nn.init.constant_(model.weight, 0.0)
        ddp = ddp_reference.DistributedDataParallel(model)
        grads = []
        with Join([ddp], divide_by_initial_world_size=divide_initial):
            for _ in range(rank + 1):
                ddp(torch.ones(1, 1)).mul(rank + 1).sum().backward()
                grads.append(model.weight.grad.item())
                model.weight.grad = None
        out[str(divide_initial)] = grads
    return out


def join_throw(rank: int, world_size: int) -> dict[str, Any]:
    out = {}
    for impl in IMPLS:
        ddp = IMPLS[impl](models.MLP())

        def train(ddp: nn.Module = ddp) -> None:
            with Join([ddp], throw_on_early_termination=True):
                for _ in range(2 + rank):
                    models.loss_of(ddp(torch.randn(2, 8))).backward()
        out[impl] = _error_text(train)
    return out


# ----------------------------------------------------------------------------- comm hooks
def _hook_run(rank: int, impl: str, hook_name: str | None) -> list[list[torch.Tensor]]:
    """Five steps of the comm-hook MLP under ``impl`` with ``hook_name`` (None: no hook)."""
    torch.manual_seed(7 + rank)
    model = models.MLP(width=48)
    # PowerSGD issues a second allreduce from inside a future callback; with several
    # buckets in flight the two ranks can enqueue them in different orders and Gloo
    # deadlocks (torch's DDP too), so it gets one bucket (the default cap).
    ddp = IMPLS[impl](model, bucket_cap_mb=None if hook_name == "powersgd" else 0.004)
    if hook_name == "allreduce":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    elif hook_name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook_name == "powersgd":
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                       start_powerSGD_iter=2, min_compression_rate=0.5,
                                       use_error_feedback=True, warm_start=True, random_seed=0)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(70 + rank)
    grads = []
    for _ in range(5):
        models.loss_of(ddp(torch.randn(6, 8, generator=gen))).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return grads


def comm_hooks(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {"plain": _hook_run(rank, "torch", None)}
    for hook_name in ("allreduce", "fp16", "powersgd"):
        out[hook_name] = {impl: _hook_run(rank, impl, hook_name) for impl in IMPLS}
    return out


# ----------------------------------------------------------------------------- overlap, views
class _Probe(torch.autograd.Function):
    """Identity whose backward records how many allreduces had been issued by then."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, log: list[Any], seen: list[int]) -> torch.Tensor:  # type: ignore[override]
        ctx.log, ctx.seen = log, seen
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        ctx.seen.append(sum(1 for entry in ctx.log if entry.kind == "allreduce"))
        return grad, None, None


class _ProbedMLP(models.MLP):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[Any] = []
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = _Probe.apply(h, self.log, self.seen)  # runs after fc2/fc3 grads, before fc1's
        return self.fc3(torch.relu(self.fc2(h)))


def overlap_and_views(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for impl in IMPLS:
        model = _ProbedMLP()
        pg = traced(dist.distributed_c10d._get_default_group())
        ddp = IMPLS[impl](model, process_group=pg, bucket_cap_mb=0.002)
        for _ in range(3):
            pg.tracer.take()
            model.log = pg.tracer.log  # the list this backward's collectives go to
            model.seen.clear()
            ddp(torch.randn(4, 8)).sum().backward()
        # allreduces issued before fc1's gradient existed / in the whole backward
        out[f"overlap/{impl}"] = (model.seen[0], sum(1 for e in pg.tracer.log if e.kind == "allreduce"))

    model2 = models.MLP()
    ddp2 = ddp_reference.DistributedDataParallel(model2, gradient_as_bucket_view=True)
    checks = []
    for set_to_none in (True, False, True):
        ddp2(torch.randn(4, 8)).sum().backward()
        checks.append(all(
            any(p.grad.data_ptr() == v.data_ptr() for v in bucket.views_in)
            for bucket in ddp2.reducer.buckets for p in bucket.params))
        for p in model2.parameters():
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()
    out["grad_is_bucket_view"] = checks
    return out

