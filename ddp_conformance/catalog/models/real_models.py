"""The catalog's real-world models: small versions of what users train with DDP.

A GPT-style block stack (tied embedding, LayerNorm, causal attention, dropout, optional
activation checkpointing), a ResNet-style net with BatchNorm in channels_last, an LSTM, a
top-1 mixture of experts whose experts go unused on some ranks and steps, and a model
whose layer is frozen mid-run. Each is a few dozen lines and fast; each registers a
:class:`~ddp_conformance.catalog.models.registry.ModelSpec` like the synthetic models.

Dropout draws from the process's RNG, which the engine and the oracle seed before every
forward from the rank's coordinates (``procedure.seed_forward``), so the oracle reproduces
each rank's masks; checkpointing recomputes a block with the RNG state it saved.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ddp_conformance.catalog.models.registry import Batch, ModelSpec, register
from ddp_conformance.catalog.models.synthetic import mse

# --- GPT-style block stack ----------------------------------------------------------------

VOCAB, CONTEXT, WIDTH, HEADS = 32, 8, 16, 2


class CausalSelfAttention(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        # No bias: a key bias's gradient is zero in exact arithmetic (softmax ignores a
        # shift shared by all keys), so it would be pure rounding noise, which Adam scales
        # up to a full step whose sign depends on the reduction order.
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(c // HEADS)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = self.drop(scores.masked_fill(causal, float("-inf")).softmax(-1))
        return self.proj((weights @ v).transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.attn = CausalSelfAttention(dropout)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH), nn.Dropout(dropout))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token and position embeddings, ``layers`` pre-LN blocks, a final LayerNorm and an
    output head tied to the token embedding (one parameter, two uses). ``checkpoint``:
    run every block under ``torch.utils.checkpoint`` ("reentrant" or "non_reentrant")."""

    def __init__(self, layers: int = 2, dropout: float = 0.1, checkpoint: str | None = None) -> None:
        super().__init__()
        if checkpoint not in (None, "reentrant", "non_reentrant"):
            raise ValueError(f"checkpoint={checkpoint!r}: one of None, 'reentrant', "
                             f"'non_reentrant'")
        self.checkpoint = checkpoint
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(CONTEXT, WIDTH)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            if self.checkpoint is None:
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.checkpoint == "reentrant")
        return self.head(self.ln_f(x))


def _token_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                 step: int) -> Batch:
    tokens = torch.randint(0, VOCAB, (size, CONTEXT + 1), generator=gen)
    return (tokens[:, :-1],), tokens[:, 1:]


def next_token_loss(logits: Tensor, target: Tensor) -> Tensor:
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), target.reshape(-1))


register(ModelSpec("gpt", GPT, _token_batch, next_token_loss,
                   "GPT-style blocks: tied embedding/head, LayerNorm, causal attention, dropout"))


# --- ResNet-style, channels_last ------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class ResNet(nn.Module):
    """A stem, two residual blocks with BatchNorm, global pooling and a head."""

    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU())
        self.blocks = nn.Sequential(BasicBlock(width), BasicBlock(width))
        self.fc = nn.Linear(width, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


def build_resnet_channels_last() -> nn.Module:
    """Weights in channels_last: 4-d gradients must keep that layout in DDP's buckets."""
    return ResNet().to(memory_format=torch.channels_last)  # type: ignore[call-overload]


def _channels_last_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                         step: int) -> Batch:
    x = torch.randn((size, 3, 6, 6), generator=gen) + 0.5 * rank  # per-rank BN statistics
    return (x.contiguous(memory_format=torch.channels_last),), torch.randn((size, 4), generator=gen)


register(ModelSpec("resnet_channels_last", build_resnet_channels_last, _channels_last_batch, mse,
                   "residual blocks with BatchNorm, weights and inputs in channels_last"))


# --- LSTM -----------------------------------------------------------------------------------


class LSTMModel(nn.Module):
    """Two stacked LSTM layers (torch keeps their weights as one flat list) and a head on
    the last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 8, num_layers=2, batch_first=True)
        self.head = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        self.lstm.flatten_parameters()  # what users call (cuDNN compacts, elsewhere a no-op)
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


register(ModelSpec("lstm", LSTMModel, lambda gen, size, rank, ws, step: (
    (torch.randn((size, 5, 6), generator=gen),), torch.randn((size, 4), generator=gen)), mse,
    "two-layer LSTM and a head"))


# --- mixture of experts, top-1 routing ---------------------------------------------------------


class TopOneMoE(nn.Module):
    """A router sends each sample to its top expert, scaled by the router's probability.
    An expert no sample of a rank's batch picks is not run there: unused on that rank,
    and on every rank when no sample anywhere picks it (``find_unused_parameters``)."""

    def __init__(self, experts: int = 6) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.router = nn.Linear(8, experts)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(experts))
        self.out = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.inp(x))
        probs = self.router(h).softmax(-1)
        gate, choice = probs.max(-1)
        mixed = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            rows = (choice == e).nonzero().squeeze(1)
            if rows.numel():
                mixed = mixed.index_add(0, rows, gate[rows, None] * expert(h[rows]))
        return self.out(mixed)


def _routed_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                  step: int) -> Batch:
    # A per-rank shift of the inputs sends different ranks to different experts.
    x = torch.randn((size, 8), generator=gen) + torch.linspace(-1, 1, 8) * (rank - 1)
    return (x,), torch.randn((size, 4), generator=gen)


register(ModelSpec("moe", TopOneMoE, _routed_batch, mse,
                   "top-1 mixture of experts: experts unused on some ranks and steps"))


# --- a layer frozen mid-run -------------------------------------------------------------------


class FreezeMidRun(nn.Module):
    """``body`` trains at steps 0 and 1, is frozen at step 2 (``requires_grad_(False)``
    before the step) and unfrozen at step 3."""

    FROZEN_STEPS = (2,)

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.body(x)))


def _freeze_schedule(module: nn.Module, step: int) -> None:
    module.get_submodule("body").requires_grad_(step not in FreezeMidRun.FROZEN_STEPS)


register(ModelSpec("freeze_mid_run", FreezeMidRun, lambda gen, size, rank, ws, step: (
    (torch.randn((size, 8), generator=gen),), torch.randn((size, 4), generator=gen)), mse,
    "layer `body` frozen at step 2, unfrozen at step 3", before_step=_freeze_schedule))
