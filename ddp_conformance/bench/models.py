"""Benchmark models: communication-bound, hook-overhead-bound, and a small conv net."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


def mlp10m() -> nn.Module:
    """~10.5M parameters in 8 tensors: ~42 MB of gradients per step (communication-bound)."""
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(),
                         nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 512))


class ManySmall(nn.Module):
    """250 small linear layers: 500 parameter tensors of 16 or 256 floats (hook-bound)."""

    def __init__(self, n: int = 250, width: int = 16) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def convnet() -> nn.Module:
    """A small conv net with BatchNorm (buffers are broadcast every step): ~0.1M parameters."""
    def block(cin: int, cout: int, stride: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
                nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(3, 32, 1), *block(32, 64, 2), *block(64, 128, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))


def tiny() -> nn.Module:
    """For the project's own tests of the bench machinery."""
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


@dataclass(frozen=True)
class BenchModel:
    name: str
    factory: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    description: str

    def input(self, rank: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 + rank)
        return torch.randn(*self.input_shape, generator=g)


MODELS: dict[str, BenchModel] = {m.name: m for m in (
    BenchModel("mlp10m", mlp10m, (32, 512), "MLP, 10.5M parameters in 8 tensors"),
    BenchModel("many-small", ManySmall, (8, 16), "250 linear layers, 500 small tensors"),
    BenchModel("convnet", convnet, (16, 3, 32, 32), "3 conv+BN blocks, linear head"),
    BenchModel("tiny", tiny, (4, 8), "2 linear layers (tests)"),
)}
DEFAULT_MODELS = ["mlp10m", "many-small", "convnet"]


def size_of(model: nn.Module) -> tuple[int, int, int]:
    """(parameters, parameter tensors, gradient bytes)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return (sum(p.numel() for p in params), len(params),
            sum(p.numel() * p.element_size() for p in params))
