"""The synthetic models: each a small module built to hold one feature DDP must handle
(buffers, a parameter unused on some ranks, tied and shared weights, mixed dtypes, sparse
gradients, nested outputs...), with the batch it eats and the loss it is trained on; and
the two losses and the normal batch the other model modules share."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddp_conformance.catalog.models.registry import Batch, ModelSpec, register


def mse(out: Any, target: Tensor) -> Tensor:
    return F.mse_loss(out, target)


def dot(out: Any, target: Tensor) -> Tensor:
    """A loss linear in the output: its gradient is ``target``, exact for dyadic data."""
    return (out * target).sum()


def normal_batch(in_shape: tuple[int, ...], out_features: int) -> Callable[..., Batch]:
    def batch(gen: torch.Generator, size: int, rank: int, world_size: int, step: int) -> Batch:
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


register(ModelSpec("mlp", build_mlp, normal_batch((8,), 4), mse, "Linear/ReLU stack"))


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


def _image_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                 step: int) -> Batch:
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


def _branchy_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                   step: int) -> Batch:
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


def _dyadic_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                  step: int) -> Batch:
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


# --- parameters unused always, on alternate steps -----------------------------------


class Unused(nn.Module):
    """``never`` is never used; ``alternate`` only on even steps (the batch says which)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 4)
        self.never = nn.Linear(8, 4)
        self.alternate = nn.Linear(8, 4)

    def forward(self, x: Tensor, use_alternate: bool) -> Tensor:
        out = self.body(x)
        return out + self.alternate(x) if use_alternate else out


def _alternate_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                     step: int) -> Batch:
    x = torch.randn((size, 8), generator=gen)
    return (x, step % 2 == 0), torch.randn((size, 4), generator=gen)


register(ModelSpec("unused_always_and_alternate", Unused, _alternate_batch, mse,
                   "`never` unused on every rank; `alternate` used on even steps only"))


def _sometimes_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                     step: int) -> Batch:
    # Rank 0 uses `alternate` on about half its microbatches (the draw is the batch's own,
    # so each microbatch decides anew); the other ranks never do.
    x = torch.randn((size, 8), generator=gen)
    use = rank == 0 and bool(torch.rand((), generator=gen) < 0.5)
    return (x, use), torch.randn((size, 4), generator=gen)


register(ModelSpec("used_on_some_microbatches", Unused, _sometimes_batch, mse,
                   "`alternate` used by rank 0 on some microbatches only, `never` unused"))


# --- frozen, tied, used twice ----------------------------------------------------------


class Frozen(nn.Module):
    """The first layer does not require gradients: DDP must not reduce it."""

    def __init__(self) -> None:
        super().__init__()
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.frozen(x)))


class Tied(nn.Module):
    """One weight shared by two modules: DDP reduces it once."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(8, 6)
        self.mid = nn.Linear(6, 6)
        self.tied = nn.Linear(6, 6)
        self.tied.weight = self.mid.weight
        self.dec = nn.Linear(6, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.enc(x))
        return self.dec(self.tied(torch.tanh(self.mid(h))))


class UsedTwice(nn.Module):
    """One module applied twice per forward: its gradient accumulates two contributions."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 6)
        self.shared = nn.Linear(6, 6)
        self.out = nn.Linear(6, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.shared(torch.tanh(self.shared(self.inp(x)))))


register(ModelSpec("frozen", Frozen, normal_batch((8,), 4), mse, "a frozen first layer"))
register(ModelSpec("tied", Tied, normal_batch((8,), 4), mse, "a weight shared by two layers"))
register(ModelSpec("used_twice", UsedTwice, normal_batch((8,), 4), mse,
                   "one layer applied twice per forward"))


# --- mixed dtypes, many tiny tensors, one large tensor -----------------------------------


class MixedDtypes(nn.Module):
    """float32 and float64 parameters: DDP buckets them separately."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 6)
        self.b = nn.Linear(6, 6).double()
        self.c = nn.Linear(6, 6)
        self.d = nn.Linear(6, 4).double()

    def forward(self, x: Tensor) -> Tensor:
        h = self.b(torch.relu(self.a(x)).double()).float()
        return self.d(self.c(h).double()).float()


class ManyTiny(nn.Module):
    """``layers`` tiny Linear(3, 3) layers: 2 x layers + 4 parameter tensors."""

    def __init__(self, layers: int = 100) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 3)
        self.layers = nn.ModuleList(nn.Linear(3, 3) for _ in range(layers))
        self.out = nn.Linear(3, 4)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = h + 0.1 * torch.tanh(layer(h))
        return self.out(h)


class OneLarge(nn.Module):
    """A 128 x 128 weight (64 KiB): above a small bucket cap on its own."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 128)
        self.big = nn.Linear(128, 128)
        self.out = nn.Linear(128, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(torch.relu(self.big(torch.relu(self.inp(x)))))


register(ModelSpec("mixed_dtypes", MixedDtypes, normal_batch((8,), 4), mse,
                   "float32 and float64 parameters"))
register(ModelSpec("many_tiny", ManyTiny, normal_batch((8,), 4), mse,
                   "204 tiny parameter tensors"))
register(ModelSpec("one_large", OneLarge, normal_batch((8,), 4), mse,
                   "one 64 KiB weight, above a small bucket cap"))


# --- embeddings --------------------------------------------------------------------------


#: Rows of the embedding table (``Embedding``'s ``nn.Embedding(EMBEDDING_ROWS, 6)``).
EMBEDDING_ROWS = 20


class Embedding(nn.Module):
    def __init__(self, sparse: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(EMBEDDING_ROWS, 6, sparse=sparse)
        self.fc = nn.Linear(6, 4)

    def forward(self, idx: Tensor) -> Tensor:
        return self.fc(self.emb(idx).sum(1))


def index_offset(rank: int) -> int:
    """The first of the 12 consecutive rows ``rank`` indexes: ``2 * rank`` for ranks 0-4
    (the catalog's data at world sizes 1-5 as it always was), then ranks 5, 6, ... cycle
    through the offsets of ranks 1-4 again. At every world size from 2 on, rows 0-1 are
    rank 0's alone and rows 2-11 are shared by ranks 0 and 1 at least; below world size 5
    the last rows are nobody's. Every index is below :data:`EMBEDDING_ROWS` at any world
    size (at most 8 + 11 = 19)."""
    return 0 if rank == 0 else 2 + 2 * ((rank - 1) % 4)


def _index_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                 step: int) -> Batch:
    # Ranks index overlapping but different rows (``index_offset``), so some rows get
    # gradients from one rank only and others from several.
    idx = torch.randint(0, 12, (size, 3), generator=gen) + index_offset(rank)
    return (idx,), torch.randn((size, 4), generator=gen)


register(ModelSpec("embedding", Embedding, _index_batch, mse, "dense nn.Embedding"))
register(ModelSpec("sparse_embedding", lambda: Embedding(sparse=True), _index_batch, mse,
                   "nn.Embedding(sparse=True): sparse gradients"))


# --- nested outputs ----------------------------------------------------------------------


@dataclass
class Heads:
    main: Tensor
    extra: tuple[Tensor, int]


class NestedOutputs(nn.Module):
    """Returns a dict holding a dataclass holding a tuple (with a non-tensor), and ``aux``:
    DDP must find the tensors inside to traverse the graph (``find_unused_parameters``)."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(8, 8)
        self.main = nn.Linear(8, 4)
        self.side = nn.Linear(8, 4)
        self.aux = nn.Linear(8, 2)

    def forward(self, x: Tensor) -> dict[str, Any]:
        h = torch.relu(self.trunk(x))
        return {"heads": Heads(self.main(h), (self.side(h), 3)), "aux": self.aux(h)}


def nested_loss(out: Any, target: Tensor) -> Tensor:
    heads = out["heads"]
    return F.mse_loss(heads.main + heads.extra[0], target) + out["aux"].pow(2).mean()


def nested_loss_without_aux(out: Any, target: Tensor) -> Tensor:
    """Leaves the ``aux`` output out of the loss: its parameters never get a gradient."""
    heads = out["heads"]
    return F.mse_loss(heads.main + heads.extra[0], target)


register(ModelSpec("nested_outputs", NestedOutputs, normal_batch((8,), 4), nested_loss,
                   "dict / dataclass / tuple outputs, all in the loss"))
register(ModelSpec("nested_outputs_aux_left_out", NestedOutputs, normal_batch((8,), 4),
                   nested_loss_without_aux, "nested outputs; `aux` left out of the loss"))


# --- float16 near its range ----------------------------------------------------------------


def build_fp16_overflow() -> nn.Module:
    """A float16 linear layer whose gradients are exact and near float16's range."""
    model = nn.Linear(4, 2, bias=False).half()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -0.25, 0.125, 1.0], [-1.0, 0.5, 0.25, -0.5]]))
    return model


#: Per world size, a power of two ``base`` with ``W * base < 65504 < W * W * base``: each
#: rank's gradient ``W * base`` fits in float16 and so does their mean, but their sum does
#: not. DDP divides before it sums; a DDP that divides after overflows to inf. Beyond
#: world size 4: :func:`fp16_base`.
FP16_BASE = {1: 2.0**14, 2: 2.0**14, 3: 2.0**13, 4: 2.0**12}


def fp16_base(world_size: int) -> float:
    """:data:`FP16_BASE` at world sizes 1-4, else ``2 ** (15 - ceil(log2 W))``: then
    ``W * base <= 2**15 < 65504`` and ``W * W * base >= W * 2**14 > 65504`` (W >= 5), and
    every partial sum of the ranks' means ``k * base`` (k <= W <= 2**11) is exact."""
    if world_size in FP16_BASE:
        return FP16_BASE[world_size]
    return 2.0 ** (15 - (world_size - 1).bit_length())


def _fp16_overflow_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                         step: int) -> Batch:
    x = torch.ones((size, 4), dtype=torch.float16)
    # Signs vary per output but not per rank, so the ranks' gradients never cancel.
    signs = torch.tensor([1.0, -1.0], dtype=torch.float16)
    t = signs * fp16_base(world_size) * world_size / size
    return (x,), t.expand(size, 2).clone()


register(ModelSpec("fp16_overflow", build_fp16_overflow, _fp16_overflow_batch, dot,
                   "float16 gradients whose sum over ranks overflows float16"))


# --- a model that differs between ranks (DDP must refuse it) -------------------------------


def build_mismatched(rank: int) -> nn.Module:
    """Rank 1 builds an extra layer: DDP's init must raise on every rank, not hang."""
    layers: list[nn.Module] = [nn.Linear(8, 4)]
    if rank == 1:
        layers.append(nn.Linear(4, 4))
    return nn.Sequential(*layers)


register(ModelSpec("mismatched_by_rank", build_mismatched, normal_batch((8,), 4), mse,
                   "rank 1 has an extra layer", rank_aware=True))


# --- a random buffer (init sync must broadcast buffers) -------------------------------------


class RandomBuffer(nn.Module):
    """A Linear plus a buffer drawn at init (so it differs per rank under per-rank init)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x: Tensor) -> Tensor:
        return self.fc(x) + self.shift


register(ModelSpec("random_buffer", RandomBuffer, normal_batch((8,), 4), mse,
                   "a buffer drawn at init: differs per rank before init sync"))


# --- a branch unused on some ranks, defined first ---------------------------------------------


class BranchFirst(nn.Module):
    """Like ``unused_on_rank1`` but the rank-dependent branch is defined *before* the used
    one: with small buckets, ranks become ready for different buckets in different orders,
    so a DDP that launches buckets as they fill (not in bucket order) mismatches."""

    def __init__(self) -> None:
        super().__init__()
        # Different widths, so the two branches' buckets differ in size.
        self.extra = nn.Linear(8, 12)
        self.extra_out = nn.Linear(12, 4)
        self.body = nn.Linear(8, 8)
        self.body_out = nn.Linear(8, 4)

    def forward(self, x: Tensor, use_extra: bool) -> Tensor:
        out = self.body_out(torch.relu(self.body(x)))
        return out + self.extra_out(torch.relu(self.extra(x))) if use_extra else out


register(ModelSpec("unused_first_on_rank1", BranchFirst, _branchy_batch, mse,
                   "branch unused on rank 1, defined before the used one"))

