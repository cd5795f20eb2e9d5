"""The values and shapes real training meets (issue 22, build item 3).

Complex parameters, whole models in float64, bfloat16 and float16, one parameter tensor
above 2**18 elements, a gradient that is non-finite on one rank, buffers of every kind
(non-persistent, integer, a running statistic outside BatchNorm) and a parameter first used
late in a run. Each registers a :class:`~ddp_conformance.catalog.models.registry.ModelSpec` like the
synthetic models and runs in well under a second per case.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ddp_conformance.catalog.models.registry import Batch, ModelSpec, register
from ddp_conformance.catalog.models.synthetic import mse

# --- complex parameters ---------------------------------------------------------------------


class ComplexLinear(nn.Module):
    """A complex64 linear layer (weight and bias) feeding a real float32 head.

    The loss is real: the head reads the real and imaginary parts and the output adds the
    modulus ``|z|``. torch's DDP buckets the complex64 gradients apart from the float32
    ones and reduces them as ``view_as_real`` pairs of float32 (sums of the real and the
    imaginary parts, exactly the complex sum).
    """

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 8, dtype=torch.complex64) * 0.3)
        self.bias = nn.Parameter(torch.randn(4, dtype=torch.complex64) * 0.1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: Tensor) -> Tensor:
        z = x.to(torch.complex64) @ self.weight.T + self.bias
        return self.head(torch.tanh(torch.cat([z.real, z.imag], dim=1))) + z.abs()


def _normal(gen: torch.Generator, size: int, dtype: torch.dtype = torch.float32) -> Batch:
    x = torch.randn((size, 8), generator=gen).to(dtype)
    return (x,), torch.randn((size, 4), generator=gen).to(dtype)


register(ModelSpec("complex", ComplexLinear,
                   lambda gen, size, rank, ws, step: _normal(gen, size), mse,
                   "complex64 linear layer (weight, bias) and a float32 head; real loss"))


# --- whole models in one dtype ----------------------------------------------------------------


def _mlp_in(dtype: torch.dtype) -> nn.Module:
    """An MLP built in float32 (the same draws as any float32 model) and cast to ``dtype``
    whole: parameters, activations, gradients and loss all in ``dtype``, no autocast."""
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 4)).to(dtype)


# One registration per dtype, written out: ``ddp-conformance repro`` copies a model from
# its literal ``register(ModelSpec("name", ...))`` and the names that call uses.


def _mlp_float64() -> nn.Module:
    return _mlp_in(torch.float64)


def _mlp_bfloat16() -> nn.Module:
    return _mlp_in(torch.bfloat16)


def _mlp_float16() -> nn.Module:
    return _mlp_in(torch.float16)


def _batch_float64(gen: torch.Generator, size: int, rank: int, world_size: int,
                   step: int) -> Batch:
    return _normal(gen, size, torch.float64)


def _batch_bfloat16(gen: torch.Generator, size: int, rank: int, world_size: int,
                    step: int) -> Batch:
    return _normal(gen, size, torch.bfloat16)


def _batch_float16(gen: torch.Generator, size: int, rank: int, world_size: int,
                   step: int) -> Batch:
    return _normal(gen, size, torch.float16)


register(ModelSpec("mlp_float64", _mlp_float64, _batch_float64, mse,
                   "an MLP wholly in float64: parameters, data, gradients and loss"))
register(ModelSpec("mlp_bfloat16", _mlp_bfloat16, _batch_bfloat16, mse,
                   "an MLP wholly in bfloat16: parameters, data, gradients and loss"))
register(ModelSpec("mlp_float16", _mlp_float16, _batch_float16, mse,
                   "an MLP wholly in float16: parameters, data, gradients and loss"))


# --- one layer in another dtype: float32 elsewhere --------------------------------------------


class EndsInDtype(nn.Module):
    """The catalog's MLP (the same float32 draws) with its first layer cast to ``first``
    and its last to ``last``; activations are cast at each boundary, data and loss are
    float32. DDP buckets per dtype, in reverse registration order: the last layer's
    parameters fill the first bucket, reduced first."""

    def __init__(self, first: torch.dtype, last: torch.dtype) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.inp, self.hidden, self.out = nn.Linear(8, 16), nn.Linear(16, 16), nn.Linear(16, 4)
        self.inp.to(first)
        self.out.to(last)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.inp(x.to(self.first))).float()
        h = torch.tanh(self.hidden(h))
        return self.out(h.to(self.last)).float()


def _bfloat16_first_layer() -> nn.Module:
    return EndsInDtype(torch.bfloat16, torch.float32)


def _float16_first_bucket() -> nn.Module:
    return EndsInDtype(torch.float32, torch.float16)


def _batch_float32(gen: torch.Generator, size: int, rank: int, world_size: int,
                   step: int) -> Batch:
    return _normal(gen, size)


register(ModelSpec("mlp_bfloat16_first_layer", _bfloat16_first_layer, _batch_float32, mse,
                   "bfloat16 parameters (the first layer) beside float32 ones"))
register(ModelSpec("mlp_float16_first_bucket", _float16_first_bucket, _batch_float32, mse,
                   "float16 parameters registered last (DDP's first bucket) beside float32"))


# --- one tensor above 2**18 elements ----------------------------------------------------------


class HugeTensor(nn.Module):
    """A 600 x 512 weight: 307,200 elements (1.2 MB in float32), above 2**18 and above DDP's
    1 MiB first bucket; the rest of the model is small, so a step stays fast."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 512)
        self.big = nn.Linear(512, 600, bias=False)
        self.out = nn.Linear(600, 4)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(torch.relu(self.big(torch.tanh(self.inp(x)))) / 16)


register(ModelSpec("huge_tensor", HugeTensor,
                   lambda gen, size, rank, ws, step: _normal(gen, size), mse,
                   "one 600 x 512 weight (307,200 elements, above 2**18)"))


# --- a non-finite gradient on one rank --------------------------------------------------------

#: The step at which the last rank's batch carries inf, -inf and NaN.
NON_FINITE_STEP = 1
#: The columns of ``z`` that get +inf, -inf and NaN in sample 0 then.
NON_FINITE_COLUMNS = {3: float("inf"), 5: float("-inf"), 6: float("nan")}


class NonFiniteGain(nn.Module):
    """A Linear head on ``x`` and an element-wise ``gain`` on ``z``, with separate losses.

    When ``z[0, j]`` is inf (or NaN), only ``gain[j]``'s gradient ``2 gain[j] sum z[:, j]**2
    / N`` is non-finite (+-inf by the sign of ``gain[j]``, NaN where z is NaN); the other
    elements of ``gain`` and the head stay finite. DDP must carry every inf and NaN to every
    rank (the sum of a finite and an infinite gradient is infinite), so that a GradScaler
    check (``torch.isfinite``) makes the same decision on every rank.

    The step taken with those gradients leaves some of ``gain`` non-finite; the model's
    ``after_step`` undoes it at once (:func:`_skip_non_finite_step`), as ``GradScaler.step``
    would have skipped it: the parameters go back to the copy taken before that step, and
    the step is recorded undone. A candidate that skips such a step itself (DeepSpeed's
    ZeRO optimizer checks the gradients for inf and NaN and skips the step) records the
    same parameters.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        # Signs alternate, so the non-finite gradients are +inf and -inf.
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, 8) * torch.tensor([1.0, -1.0] * 4))
        #: The parameters before the last step that left them all finite (not a buffer:
        #: DDP must not broadcast it, each rank keeps its own, equal if DDP is right).
        self.last_finite: list[Tensor] = []

    def forward(self, x: Tensor, z: Tensor) -> tuple[Tensor, Tensor]:
        return self.fc(x), z * self.gain


def _non_finite_loss(out: tuple[Tensor, Tensor], target: Tensor) -> Tensor:
    head, scaled = out
    return F.mse_loss(head, target) + scaled.pow(2).mean()


def _non_finite_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                      step: int) -> Batch:
    x = torch.randn((size, 8), generator=gen)
    z = torch.randn((size, 8), generator=gen)
    if step == NON_FINITE_STEP and rank == world_size - 1:
        for column, value in NON_FINITE_COLUMNS.items():
            z[0, column] = value
    return (x, z), torch.randn((size, 4), generator=gen)


def _skip_non_finite_step(module: nn.Module, step: int) -> None:
    """GradScaler's rule, applied right after the step: if it left a non-finite parameter
    (its gradients were not finite), restore the parameters from before it; otherwise
    remember them. Run on every rank and in the oracle alike, before the step is recorded.
    The copy is taken after each finite step, so it holds the parameters before the next."""
    assert isinstance(module, NonFiniteGain)
    params = list(module.parameters())
    with torch.no_grad():
        if all(bool(torch.isfinite(p).all()) for p in params):
            module.last_finite = [p.detach().clone() for p in params]
        else:
            for p, saved in zip(params, module.last_finite, strict=True):
                p.copy_(saved)


register(ModelSpec("non_finite_grad", NonFiniteGain, _non_finite_batch, _non_finite_loss,
                   f"the last rank's batch holds inf, -inf and NaN at step {NON_FINITE_STEP}: "
                   f"non-finite gradients everywhere, the step undone",
                   after_step=_skip_non_finite_step))


# --- buffers of every kind --------------------------------------------------------------------


class BufferKinds(nn.Module):
    """Buffers outside BatchNorm, each updated in forward (under ``no_grad``):

    - ``calls``: an int64 counter of training forwards (persistent);
    - ``mean``: a running mean of the input, a cumulative average ``mean += (m - mean) /
      calls`` (persistent, float32), subtracted from the input;
    - ``peak``: a running max of ``|x|`` per feature, non-persistent
      (``persistent=False``: not in the state dict, but a buffer DDP broadcasts), dividing
      the input;
    - ``offset``: drawn at init, non-persistent and never updated (differs per rank under
      per-rank init: DDP's init sync broadcasts it).
    """

    calls: Tensor
    mean: Tensor
    peak: Tensor
    offset: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))
        self.register_buffer("mean", torch.zeros(8))
        self.register_buffer("peak", torch.ones(8), persistent=False)
        self.register_buffer("offset", torch.randn(4) * 0.1, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            with torch.no_grad():
                self.calls += 1
                self.mean += (x.mean(0) - self.mean) / self.calls
                torch.maximum(self.peak, x.abs().amax(0), out=self.peak)
        return self.fc((x - self.mean) / self.peak) + self.offset


def _shifted_batch(gen: torch.Generator, size: int, rank: int, world_size: int,
                   step: int) -> Batch:
    # A per-rank shift and spread, so every running statistic differs between ranks.
    x = torch.randn((size, 8), generator=gen) * (1 + 0.5 * rank) + 0.25 * rank
    return (x,), torch.randn((size, 4), generator=gen)


register(ModelSpec("buffer_kinds", BufferKinds, _shifted_batch, mse,
                   "int64 counter, running mean, non-persistent running max and offset"))


# --- a parameter first used late --------------------------------------------------------------


class LateUse(nn.Module):
    """``late`` joins the forward from step ``first_use`` on (8+ step runs: step 5)."""

    def __init__(self, first_use: int = 5) -> None:
        super().__init__()
        self.first_use = first_use
        self.body = nn.Linear(8, 4)
        self.late = nn.Linear(8, 4)
        #: Set by ``before_step`` on every rank and in the oracle alike.
        self.use_late = False

    def forward(self, x: Tensor) -> Tensor:
        out = self.body(x)
        return out + self.late(torch.tanh(x)) if self.use_late else out


def _late_schedule(module: nn.Module, step: int) -> None:
    assert isinstance(module, LateUse)
    module.use_late = step >= module.first_use


register(ModelSpec("late_use", LateUse,
                   lambda gen, size, rank, ws, step: _normal(gen, size), mse,
                   "layer `late` unused until step `first_use` (5), used from then on",
                   before_step=_late_schedule))


# --- buffers replaced in forward, not updated in place ----------------------------------------


class BuffersReplaced(nn.Module):
    """Buffers *reassigned* in every training forward, never written in place:
    ``self.mean = ...`` and ``self.calls = ...`` give the module new tensors (``nn.Module``
    files an assignment to a buffer's name under ``_buffers``), so a DDP that keeps the
    tensors it saw at construction broadcasts stale ones and leaves the module's buffers
    rank-local.

    - ``mean``: an exponential average of the input (float32), subtracted from the input;
    - ``calls``: an int64 count of training forwards, scaling the correction.
    """

    mean: Tensor
    calls: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("mean", torch.zeros(8))
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            with torch.no_grad():
                self.calls = self.calls + 1
                self.mean = 0.5 * self.mean + 0.5 * x.mean(0)
        return self.fc(x - self.mean * (1.0 + 0.25 * self.calls.float()))


register(ModelSpec("buffers_replaced", BuffersReplaced, _shifted_batch, mse,
                   "buffers reassigned to new tensors in forward (running mean, counter)"))


# --- exactly one buffer, drifting per rank ----------------------------------------------------


class OneBuffer(nn.Module):
    """A single buffer, ``mean``: an exponential average of the input, updated in place in
    every training forward and subtracted from the input. The per-rank data of
    ``_shifted_batch`` make it drift apart between ranks, so only DDP's forward buffer sync
    (the module has one buffer: ``len(buffers) > 0``) keeps the ranks on one trajectory."""

    mean: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.register_buffer("mean", torch.zeros(8))

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.5).add_(x.mean(0), alpha=0.5)
        return self.fc(x - self.mean)


register(ModelSpec("one_buffer", OneBuffer, _shifted_batch, mse,
                   "one buffer only: a running mean of the input, updated in place"))
