"""A model composed from blocks, for generated scenarios: ``composed`` with
``model_kwargs={"blocks": (...)}``.

Each block maps a batch of 8 features to 8 features, so any sequence of blocks is a model;
a final Linear(8, 4) is the head. The blocks are the ingredients of real models whose
combinations defects hide in: a channels_last convolution, BatchNorm and LayerNorm, a
weight tied to the head, a layer used twice, a frozen layer, a non-contiguous (transposed)
weight, and layers in float64, float16 and bfloat16 beside float32 (DDP buckets per dtype).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ddp_conformance.catalog.models.registry import Batch, ModelSpec, register
from ddp_conformance.catalog.models.synthetic import mse

FEATURES = 8


class Conv(nn.Module):
    """The 8 features as a 2-channel 2x2 image through a 3x3 convolution (padding 1)."""

    def __init__(self, channels_last: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 2, 3, padding=1)
        self.channels_last = channels_last
        if channels_last:
            self.conv.to(memory_format=torch.channels_last)  # type: ignore[call-overload]

    def forward(self, x: Tensor) -> Tensor:
        image = x.view(-1, 2, 2, 2)
        if self.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        return torch.tanh(self.conv(image)).flatten(1)


class InDtype(nn.Module):
    """A Linear whose parameters are in ``dtype``; the input is cast in and out."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.fc = nn.Linear(FEATURES, FEATURES).to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.fc(x.to(self.fc.weight.dtype))).to(x.dtype)


class Transposed(nn.Module):
    """A weight stored transposed: a non-contiguous parameter (strides (1, 8))."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(FEATURES, FEATURES).div(FEATURES ** 0.5).t())

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x @ self.weight)


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(FEATURES, FEATURES)

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(self.fc(torch.tanh(self.fc(x))))


def _linear() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, FEATURES), nn.Tanh())


def _frozen() -> nn.Module:
    return _linear().requires_grad_(False)


#: Block name -> builder, simplest first (the shrinker moves towards the front).
BLOCKS = {
    "linear": _linear,
    "layernorm": lambda: nn.LayerNorm(FEATURES),
    "batchnorm": lambda: nn.BatchNorm1d(FEATURES),
    "conv": lambda: Conv(channels_last=False),
    "conv_channels_last": lambda: Conv(channels_last=True),
    "twice": Twice,
    "frozen": _frozen,
    "transposed": Transposed,
    "tied": _linear,  # its weight becomes the head's input layer's, see Composed
    "float64": lambda: InDtype(torch.float64),
    "float16": lambda: InDtype(torch.float16),
    "bfloat16": lambda: InDtype(torch.bfloat16),
}


class Composed(nn.Module):
    """``blocks`` in sequence, then ``head``; a ``tied`` block shares its weight with
    ``pre``, a Linear applied before the head (one parameter, two uses)."""

    def __init__(self, blocks: tuple[str, ...] = ("linear",)) -> None:
        super().__init__()
        unknown = [b for b in blocks if b not in BLOCKS]
        if unknown:
            raise ValueError(f"unknown blocks {unknown}; known: {', '.join(BLOCKS)}")
        self.blocks = nn.ModuleList(BLOCKS[b]() for b in blocks)
        self.pre = nn.Linear(FEATURES, FEATURES)
        for name, block in zip(blocks, self.blocks, strict=True):
            if name == "tied":
                self.pre.weight = block[0].weight  # type: ignore[index]
        self.head = nn.Linear(FEATURES, 4)

    def forward(self, x: Tensor) -> Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(torch.tanh(self.pre(x)))


def _composed_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                    step: int) -> Batch:
    # Two samples at least, so BatchNorm1d has a batch statistic to compute.
    x = torch.randn((max(size, 2), FEATURES), generator=gen) + 0.25 * rank
    return (x,), torch.randn((max(size, 2), 4), generator=gen)


register(ModelSpec("composed", Composed, _composed_batch, mse,
                   "blocks in sequence (model_kwargs blocks=...): generated scenarios"))
