"""The model registry: :class:`ModelSpec` (a model, the batch it eats, the loss it is
trained on), :data:`MODELS` and :func:`register`, :func:`get_model`.

A :class:`ModelSpec` is looked up by name from a scenario, so scenarios stay plain data and
every rank process (and the oracle) builds the same module from the same seed. ``batch``
receives a seeded generator and the rank coordinates, so data differs per rank while any
process can rebuild any rank's batch. The modules of this package register their models
when imported; the package imports them all (``catalog/models/__init__.py``).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

Batch = tuple[tuple[Any, ...], Tensor]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[..., nn.Module]
    #: ``batch(gen, size, rank, world_size, step)``: one rank's batch at one step.
    batch: Callable[[torch.Generator, int, int, int, int], Batch]
    loss: Callable[[Any, Tensor], Tensor]
    description: str = ""
    #: ``build`` takes the building rank (a model that differs per rank on purpose).
    rank_aware: bool = False
    #: ``before_step(module, step)``: called on the unwrapped module at the start of every
    #: step, before ``zero_grad`` (on every rank and in the oracle): how a model changes
    #: between steps, e.g. freezing a parameter (``requires_grad_``) mid-run.
    before_step: Callable[[nn.Module, int], None] | None = None
    #: ``after_step(module, step)``: called on the unwrapped module right after the
    #: optimizer step, before the step's parameters are recorded (on every rank and in the
    #: oracle alike): a step undone as soon as it is taken, e.g. GradScaler's rule.
    after_step: Callable[[nn.Module, int], None] | None = None


MODELS: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Add ``spec`` to :data:`MODELS` (called at a model module's import); a name
    registered twice is a ValueError."""
    if spec.name in MODELS:
        raise ValueError(f"model {spec.name!r} registered twice")
    MODELS[spec.name] = spec
    return spec


def get_model(name: str) -> ModelSpec:
    """The registered model ``name``; a KeyError naming the known ones if none is."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None
