"""The catalog's models: the registry (:mod:`.registry`) and the modules that register
models in it when imported, all imported here so that :data:`MODELS` is complete once
``ddp_conformance.catalog.models`` is.

- :mod:`.synthetic`: small modules, each holding one feature DDP must handle;
- :mod:`.real_models`: real-world models (GPT-style, ResNet, LSTM, MoE, freezing);
- :mod:`.composed`: the model composed from blocks, for generated scenarios;
- :mod:`.value_models`: the values and shapes real training meets;
- :mod:`.surface_models`: DDP's surface beyond training.

Every member imports the registry (never this package's ``__init__``), so there is no
import cycle.
"""
from __future__ import annotations

from ddp_conformance.catalog.models import (
    composed,
    real_models,
    surface_models,
    synthetic,
    value_models,
)
from ddp_conformance.catalog.models.registry import MODELS, Batch, ModelSpec, get_model, register

#: The modules that register models, in the order they are imported.
MEMBERS = (synthetic, real_models, composed, value_models, surface_models)

__all__ = ["MEMBERS", "MODELS", "Batch", "ModelSpec", "get_model", "register"]
