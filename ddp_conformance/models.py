"""The catalog's models, each with the batch it eats and the loss it is trained on.

A :class:`ModelSpec` is looked up by name from a scenario, so scenarios stay plain data and
every rank process (and the oracle) builds the same module from the same seed. ``batch``
receives a seeded generator and the rank coordinates, so data differs per rank while any
process can rebuild any rank's batch.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Batch = tuple[tuple[Any, ...], Tensor]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[..., nn.Module]
    batch: Callable[[torch.Generator, int, int, int], Batch]
    loss: Callable[[Any, Tensor], Tensor]
    description: str = ""


MODELS: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    if spec.name in MODELS:
        raise ValueError(f"model {spec.name!r} registered twice")
    MODELS[spec.name] = spec
    return spec


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def mse(out: Any, target: Tensor) -> Tensor:
    return F.mse_loss(out, target)


def dot(out: Any, target: Tensor) -> Tensor:
    """A loss linear in the output: its gradient is ``target``, exact for dyadic data."""
    return (out * target).sum()


def _normal_batch(in_shape: tuple[int, ...], out_features: int) -> Callable[..., Batch]:
    def batch(gen: torch.Generator, size: int, rank: int, world_size: int) -> Batch:
        x = torch.randn((size, *in_shape), generator=gen)
        y = torch.randn((size, out_features), generator=gen)
        return (x,), y

    return batch


# --- MLP -----------------------------------------------------------------------------


def build_mlp(width: int = 16, depth: int = 2) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(8, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 4))
    return nn.Sequential(*layers)


register(ModelSpec("mlp", build_mlp, _normal_batch((8,), 4), mse, "Linear/ReLU stack"))


# --- conv + BatchNorm (buffers) ---------------------------------------------------------


class ConvBN(nn.Module):
    """Conv, BatchNorm (running-stat buffers that drift per rank), ReLU, Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=False)  # BatchNorm follows: the usual bias-free conv
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(F.relu(self.bn(self.conv(x))).flatten(1))


def _image_batch(gen: torch.Generator, size: int, rank: int, world_size: int) -> Batch:
    # Per-rank offset so the BatchNorm running statistics visibly differ between ranks.
    x = torch.randn((size, 3, 6, 6), generator=gen) + 0.5 * rank
    return (x,), torch.randn((size, 4), generator=gen)


register(ModelSpec("conv_bn", ConvBN, _image_batch, mse, "Conv2d + BatchNorm2d + Linear"))


# --- a parameter unused on some ranks ---------------------------------------------------


class Branchy(nn.Module):
    """An MLP whose ``extra`` branch runs only when the batch says so (rank-dependent)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 4)
        self.extra = nn.Linear(8, 4)

    def forward(self, x: Tensor, use_extra: bool) -> Tensor:
        out = self.body(x)
        return out + self.extra(x) if use_extra else out


def _branchy_batch(gen: torch.Generator, size: int, rank: int, world_size: int) -> Batch:
    x = torch.randn((size, 8), generator=gen)
    # Rank 1 never uses ``extra``: the parameter is used on some ranks only.
    return (x, rank != 1), torch.randn((size, 4), generator=gen)


register(ModelSpec("unused_on_rank1", Branchy, _branchy_batch, mse,
                   "branch `extra` unused on rank 1 only"))


# --- exact-valued (dyadic) ------------------------------------------------------------


def _dyadic_(t: Tensor, scale: int, low: int, high: int, gen: torch.Generator | None) -> Tensor:
    return t.copy_(torch.randint(low, high, t.shape, generator=gen).to(t.dtype) / scale)


def build_dyadic() -> nn.Module:
    """Two bias-free linear layers with weights in {-1/2, ..., 1/2} (multiples of 1/8)."""
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.ReLU(), nn.Linear(8, 4, bias=False))
    with torch.no_grad():
        for p in model.parameters():
            _dyadic_(p, 8, -4, 5, None)
    return model


def _dyadic_batch(gen: torch.Generator, size: int, rank: int, world_size: int) -> Batch:
    """Inputs in halves, targets in quarters times the world size.

    With the ``dot`` loss every gradient is a short sum of products of such numbers, so it is
    exact in float32 in any summation order; the factor ``world_size`` makes each rank's
    gradient divisible by the world size exactly (DDP divides before it sums).
    """
    x = torch.randint(-2, 3, (size, 8), generator=gen).float() / 2
    t = torch.randint(-4, 5, (size, 4), generator=gen).float() / 4 * world_size
    return (x,), t


register(ModelSpec("dyadic", build_dyadic, _dyadic_batch, dot,
                   "exact-valued: every gradient sum exact in any order"))
