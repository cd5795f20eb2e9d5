"""Rank-side code for the reference's surface tests (pickling, ``copy.deepcopy``,
``torch.save``, ``backward(create_graph=True)``): each function runs on every rank with
torch's DDP and the reference and returns plain data to compare."""
from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tests.reference.workers import IMPLS


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2))


def _steps(ddp: nn.Module, module: nn.Module, first: int, count: int) -> list[list[torch.Tensor]]:
    """``count`` SGD steps on rank-dependent data; the parameters after each."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    after = []
    for step in range(first, first + count):
        opt.zero_grad()
        gen = torch.Generator().manual_seed(100 * step + dist.get_rank())
        ddp(torch.randn(3, 4, generator=gen)).pow(2).sum().backward()
        opt.step()
        after.append([p.detach().clone() for p in module.parameters()])
    return after


COPIES: dict[str, Callable[[nn.Module], nn.Module]] = {
    "pickle": lambda ddp: pickle.loads(pickle.dumps(ddp)),
    "deepcopy": copy.deepcopy,
}


def _torch_save(ddp: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(ddp, buffer)
    buffer.seek(0)
    loaded: nn.Module = torch.load(buffer, weights_only=False)
    return loaded


COPIES["torch.save"] = _torch_save


def copies_train_on(rank: int, world_size: int) -> dict[str, Any]:
    """Per DDP and way of copying: two steps, a copy, two more steps of the copy (which
    must keep reducing: rank-dependent data makes local gradients differ)."""
    out: dict[str, Any] = {}
    for impl, cls in IMPLS.items():
        for how, copier in COPIES.items():
            module = _mlp()
            ddp = cls(module)
            before = _steps(ddp, module, 0, 2)
            clone = copier(ddp)
            after = _steps(clone, clone.module, 2, 2)
            out[f"{impl}/{how}"] = [before, after, type(clone).__name__]
    return out


def copy_on_a_subgroup(rank: int, world_size: int) -> dict[str, str | None]:
    """Pickling a DDP whose group is not the default one: the error, per DDP."""
    group = dist.new_group(list(range(dist.get_world_size())))
    out: dict[str, str | None] = {}
    for impl, cls in IMPLS.items():
        ddp = cls(_mlp(), process_group=group)
        try:
            pickle.dumps(ddp)
            out[impl] = None
        except Exception as exc:  # noqa: BLE001 - the test compares them
            out[impl] = f"{type(exc).__name__}: {exc}"
    return out


class _Scalar(nn.Module):
    """torch's ``test_ddp_create_graph`` model, with a rank-dependent output."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.tensor(1.0))

    def forward(self) -> torch.Tensor:
        return self.p.pow(2) * (dist.get_rank() + 1)


def create_graph(rank: int, world_size: int) -> dict[str, Any]:
    """Six ``backward(create_graph=True)`` in a row (gradients accumulate): the gradient
    and whether it carries a graph, per DDP."""
    out: dict[str, Any] = {}
    for impl, cls in IMPLS.items():
        module = _Scalar()
        ddp = cls(module)
        for _ in range(6):
            ddp().backward(create_graph=True)
        grad = module.p.grad
        assert grad is not None
        out[impl] = [grad.detach().clone(), grad.requires_grad, grad.grad_fn is not None]
    return out


def static_graph_calls(rank: int, world_size: int) -> dict[str, Any]:
    """``_set_static_graph`` twice before training (the second warns), and once after a
    step (refused): the warnings' texts and the error, per DDP."""
    import warnings

    out: dict[str, Any] = {}
    for impl, cls in IMPLS.items():
        module = _mlp()
        ddp = cls(module, static_graph=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ddp._set_static_graph()
        later = cls(_mlp())
        _steps(later, later.module, 0, 1)
        try:
            later._set_static_graph()
            error = None
        except RuntimeError as exc:
            error = str(exc)
        out[impl] = [[str(w.message) for w in caught], error]
    return out
