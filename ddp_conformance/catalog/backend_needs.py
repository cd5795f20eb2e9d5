"""What a scenario asks of the process-group backend, and what a backend cannot do.

A scenario's needs of the backend are derived from its model, never listed by hand per
scenario: a model with a sparse ``nn.Embedding``/``nn.EmbeddingBag`` makes DDP allreduce
sparse gradients. What a backend lacks is what torch itself refuses there, quoted: NCCL
has no sparse allreduce (``ProcessGroupNCCL``: "NCCL does not support all_reduce with
sparse tensors"; seen on an H100 with torch's own DDP and without the harness). Such a
scenario is N/A on that backend for every candidate, torch's DDP included: a
limitation of the backend is not a verdict on a DDP. A custom backend says what it lacks
itself: when its collective check of a feature (``collectives/sparse-allreduce-*``) is
N/A, the backend's own words make the scenarios that need the feature N/A in that run.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from ddp_conformance.catalog.models import get_model
from ddp_conformance.catalog.scenario import Scenario, StringEnum


class BackendFeature(StringEnum):
    SPARSE_ALLREDUCE = "sparse_allreduce"


#: (backend, device type) -> what it cannot do -> why (torch's words).
BACKEND_LACKS: dict[tuple[str, str], dict[BackendFeature, str]] = {
    ("nccl", "cuda"): {
        BackendFeature.SPARSE_ALLREDUCE: "NCCL does not support all_reduce with sparse tensors",
    },
}


def model_needs(module: nn.Module) -> frozenset[BackendFeature]:
    """What training ``module`` with DDP asks of the backend."""
    needs = set()
    for sub in module.modules():
        if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and sub.sparse:
            needs.add(BackendFeature.SPARSE_ALLREDUCE)
    return frozenset(needs)


_NEEDS: dict[tuple[str, str], frozenset[BackendFeature]] = {}


def backend_needs(scenario: Scenario) -> frozenset[BackendFeature]:
    """What ``scenario`` asks of the backend: its model, built on the CPU once per model and
    arguments (for every building rank of a model that differs per rank)."""
    key = (scenario.model, repr(sorted(scenario.model_kwargs.items())))
    if key not in _NEEDS:
        spec = get_model(scenario.model)
        builds = [dict(scenario.model_kwargs, rank=r) for r in range(2)] if spec.rank_aware \
            else [dict(scenario.model_kwargs)]
        needs: frozenset[BackendFeature] = frozenset()
        with torch.random.fork_rng(devices=[]):  # the caller's random stream is untouched
            for kwargs in builds:
                needs |= model_needs(spec.build(**kwargs))
        _NEEDS[key] = needs
    return _NEEDS[key]


def backend_lacks(scenario: Scenario, backend: str, device: str,
                  declined: Mapping[BackendFeature, str] | None = None) -> str:
    """Why ``backend`` on ``device`` cannot run ``scenario`` ('' if it can). ``declined``:
    what the backend itself declined in this run's collective checks, in its words."""
    lacks = {**BACKEND_LACKS.get((backend, device), {}), **(declined or {})}
    missing = [f for f in backend_needs(scenario) if f in lacks]
    return "; ".join(f"backend {backend} lacks {f.value.replace('_', ' ')} ({lacks[f]})"
                     for f in sorted(missing))
