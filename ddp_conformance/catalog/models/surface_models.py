"""Models for torch 2.13 DDP's surface beyond training (``suites/test_surface.py``): the
modules DDP's constructor must refuse, and a module that names what DDP must ignore."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ddp_conformance.catalog.models.registry import ModelSpec, register
from ddp_conformance.catalog.models.synthetic import build_mlp, mse, normal_batch


def build_all_frozen() -> nn.Module:
    """No parameter requires a gradient: DDP has nothing to reduce and refuses the module."""
    model = nn.Sequential(nn.Linear(8, 4))
    model.requires_grad_(False)
    return model


def build_lazy() -> nn.Module:
    """An ``nn.LazyLinear`` before its first forward: its parameters are uninitialized, so
    their shapes cannot be checked across ranks and DDP refuses the module."""
    return nn.Sequential(nn.LazyLinear(4))


def build_sync_bn() -> nn.Module:
    """A BatchNorm converted to ``SyncBatchNorm`` on CPU: SyncBatchNorm works on GPU
    modules only (torch's DDP refuses it at construction, SyncBatchNorm itself in forward)."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(
        nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4)))


class Ignored(nn.Module):
    """A layer trained by DDP, a frozen layer, a frozen parameter of the root module and a
    constant buffer that the model names with ``DistributedDataParallel.
    _set_params_and_buffers_to_ignore_for_model`` (torch's static method: it sets
    ``_ddp_params_and_buffers_to_ignore`` and marks each tensor ``_ddp_ignored``). DDP
    must neither broadcast, reduce nor (under ``mixed_precision``) cast them; they are equal
    on every rank from the same seed, so the values are the oracle's either way, and the
    trace shows what DDP touched. The root's own trained ``gain`` comes first among the
    root's parameters, as a module's own parameters do in ``modules()`` order."""

    IGNORED = ("offset", "frozen.weight", "frozen.bias", "scale")

    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, 4))
        self.offset = nn.Parameter(torch.full((4,), 0.25), requires_grad=False)
        self.trained = nn.Linear(8, 4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.full((4,), 0.5))
        from torch.nn.parallel import DistributedDataParallel

        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            self, list(self.IGNORED))

    def forward(self, x: Tensor) -> Tensor:
        return self.frozen(self.trained(x) * self.gain + self.offset) * self.scale


register(ModelSpec("all_frozen", build_all_frozen, normal_batch((8,), 4), mse,
                   "no parameter requires a gradient"))
register(ModelSpec("lazy", build_lazy, normal_batch((8,), 4), mse,
                   "an uninitialized LazyLinear"))
register(ModelSpec("sync_bn", build_sync_bn, normal_batch((8,), 4), mse,
                   "SyncBatchNorm in a CPU module"))
register(ModelSpec("ignored", Ignored, normal_batch((8,), 4), mse,
                   "frozen parameters and a buffer named for DDP to ignore"))


def _replicated_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                      step: int) -> tuple[tuple[Tensor, ...], Tensor]:
    """The same batch on every rank (seeded by the step only): each rank's local gradient
    is then the average DDP computes, so a hook that does not communicate is judged too."""
    own = torch.Generator().manual_seed(1000 + step)
    return (torch.randn((size, 8), generator=own),), torch.randn((size, 4), generator=own)


register(ModelSpec("mlp_replicated_data", build_mlp, _replicated_batch, mse,
                   "the MLP on the same batch on every rank"))


# --- a memory handed back and fed into the next forward ----------------------------------------


class MemoryFedBack(nn.Module):
    """Transformer-XL's ``mems`` pattern: the forward returns its prediction and a memory
    for the next forward, made outside autograd (a tensor without ``grad_fn``), and the
    training loop feeds the memory it was handed back into the next forward. Here the loss
    (:func:`_memory_loss`) does the feeding: it stores the ``memory`` output it receives on
    the module, which the next forward adds to its prediction (the first forward adds a
    fresh one). The memory's value is the same at every forward, so the oracle, which runs
    every rank's forward on one module, sees the same values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        #: The memory handed back by the previous forward (set by the loss).
        self.memory: Tensor | None = None

    def forward(self, x: Tensor) -> dict[str, Any]:
        memory = torch.full((4,), 0.5, device=x.device)
        previous = self.memory if self.memory is not None else memory
        return {"pred": self.fc(x) + previous, "memory": memory, "owner": self}


def _memory_loss(out: dict[str, Any], target: Tensor) -> Tensor:
    out["owner"].memory = out["memory"]
    return nn.functional.mse_loss(out["pred"], target)


register(ModelSpec("memory_fed_back", MemoryFedBack, normal_batch((8,), 4), _memory_loss,
                   "returns a memory made outside autograd, fed into the next forward"))


# --- an output left out of the loss -------------------------------------------------------------


class TwoHeads(nn.Module):
    """Returns a tuple ``(main, side)`` of two heads on one trunk; the loss
    (:func:`_main_head_loss`) uses ``main`` only, so ``side``'s parameters get no gradient
    though they produced an output."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 8)
        self.main = nn.Linear(8, 4)
        self.side = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = torch.relu(self.trunk(x))
        return self.main(h), self.side(h)


def _main_head_loss(out: tuple[Tensor, Tensor], target: Tensor) -> Tensor:
    return nn.functional.mse_loss(out[0], target)


register(ModelSpec("two_heads_one_left_out", TwoHeads, normal_batch((8,), 4), _main_head_loss,
                   "a tuple of two heads, the second left out of the loss"))
