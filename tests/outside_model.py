"""A model whose ``ModelSpec`` is written outside the catalog's modules (the test
registers it for the time of one test): ``repro`` finds its code from the registry
(``spec.build.__module__``), wherever it is defined."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ddp_conformance.catalog.models.registry import ModelSpec
from ddp_conformance.catalog.models.synthetic import mse

WIDTH = 6


class Outside(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x).tanh()


def _batch(gen: torch.Generator, size: int, rank: int, world_size: int,
           step: int) -> tuple[tuple[Any, ...], Tensor]:
    return (torch.randn(size, WIDTH, generator=gen),), torch.randn(size, 2, generator=gen)


SPEC = ModelSpec(name="outside_mlp", build=Outside, batch=_batch, loss=mse)
