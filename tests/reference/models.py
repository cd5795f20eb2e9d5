"""Small CPU models for the reference DDP's tests (module level, so ranks can build them)."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ddp_conformance.catalog.models.synthetic import UsedTwice  # noqa: F401 - the catalog's model, shared


class MLP(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class ComplexMLP(nn.Module):
    """complex64 layers on a real input and a real output (``|z|``): every bucket is
    complex, so torch's reducer stores it as its real view."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16, dtype=torch.complex64)
        self.fc2 = nn.Linear(16, 4, dtype=torch.complex64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x.to(torch.complex64)))).abs()


class Wide(nn.Module):
    """About 2.2 MiB of float32 parameters: with the default cap the rebuilt layout has a
    1 MiB first bucket."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 256)
        self.fc2 = nn.Linear(256, 2048)
        self.fc3 = nn.Linear(2048, 32)
        self.fc4 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc4(torch.relu(self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))))


class ConvBN(nn.Module):
    """Buffers: BatchNorm running stats and its int64 batch counter."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, 2, 4, 4)
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


class UnusedOnSomeRanks(nn.Module):
    """``extra`` is used on rank 0 only; ``never`` is never used."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.extra = nn.Linear(4, 4)
        self.never = nn.Linear(4, 4)
        self.use_extra = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return self.extra(y) if self.use_extra else y


class Frozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.frozen(x))


class Tied(nn.Module):
    """One weight shared by two modules (listed twice by ``named_modules``)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 6, bias=False)
        self.mid = nn.Linear(6, 6)
        self.dec = nn.Linear(6, 8, bias=False)
        self.dec.weight = nn.Parameter(self.enc.weight.detach().t().contiguous())
        self.tied = nn.Linear(6, 6)
        self.tied.weight = self.mid.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.enc(x))
        return self.dec(self.tied(torch.tanh(self.mid(h))))


class CheckpointedTwice(nn.Module):
    """One block run twice under reentrant checkpointing: each run backward is a separate
    (nested) backward pass, so the block's gradient hooks fire twice per iteration, which
    torch's DDP only supports with ``static_graph=True``."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 6)
        self.block = nn.Linear(6, 6)
        self.out = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for _ in range(2):
            h = checkpoint(self._block, h, use_reentrant=True)
        return self.out(h)

    def _block(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.block(h))


class MixedDtypes(nn.Module):
    """float32 and float64 parameters: buckets are split per dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 16).double()
        self.c = nn.Linear(16, 4)
        self.d = nn.Linear(4, 4).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.b(torch.relu(self.a(x)).double()).float()
        return self.d(self.c(h).double()).float()


class ManyTiny(nn.Module):
    def __init__(self, n: int = 40) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 3)
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return h


class NestedOutputs(nn.Module):
    """Returns a dict with a tuple; ``aux`` (behind ``side``) is left out of the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 8)
        self.main = nn.Linear(8, 4)
        self.side = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        h = torch.relu(self.trunk(x))
        return {"out": (self.main(h), 3), "aux": self.side(h)}


class SparseEmbedding(nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 6, sparse=sparse)
        self.fc = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = (x.abs() * 7).long().clamp(max=19)[:, :3]
        return self.fc(self.emb(idx).sum(1))


class Scalars(nn.Module):
    """Composer's sync-strategy test model: three scalar weights, microbatch i uses
    weight i (input 1, 2 or 3), all initialised to 0."""

    def __init__(self) -> None:
        super().__init__()
        self.choice1 = nn.Linear(1, 1, bias=False)
        self.choice2 = nn.Linear(1, 1, bias=False)
        self.choice3 = nn.Linear(1, 1, bias=False)
        for m in (self.choice1, self.choice2, self.choice3):
            nn.init.constant_(m.weight, 0.0)

    def forward(self, choice: int) -> torch.Tensor:
        layer = (self.choice1, self.choice2, self.choice3)[choice - 1]
        return layer(torch.ones(1))


def loss_of(output: Any) -> torch.Tensor:
    """A scalar loss from any model output above (nested: only ``out`` counts)."""
    if isinstance(output, dict):
        output = output["out"][0]
    return (output.float() ** 2).mean()
