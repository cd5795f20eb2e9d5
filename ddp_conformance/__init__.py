"""ddp-conformance: a test harness and conformance suite for DistributedDataParallel.

The public API; everything else is internal and may move. Names are imported on first use
(PEP 562), so that ``import ddp_conformance`` and the pytest plugin cost nothing until a
name is used::

    import ddp_conformance as d
    d.Candidate, d.Adapter, d.Capability, d.Scenario, d.RunConfig, d.Session, d.Verdict

Layers (each a package; a layer imports only the ones above it in this list):

- ``contract``: the candidate contract (Adapter, Candidate, Capability, detection, registry)
  and ``builtins``: the ecosystem adapters;
- ``catalog``: scenarios as data, models, the procedure, the loader;
- ``ranks``: the rank runtime, the pool, torchrun, the engine, the tracing process group;
- ``judge``: oracle, tolerances, checks, verdicts, expectations;
- ``report`` and ``bench``: reports and timing;
- ``runner``, ``session``, ``cli``, ``pytest_plugin``: running it all.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Accumulate", "Adapter", "Candidate", "Capability", "CommHook", "DDP_OPTIONS",
    "DDPLikeAdapter", "Init", "JoinSpec", "Optimizer", "Result", "RunConfig", "Runner",
    "Scenario", "Session", "SyncStrategy", "UsageError", "Verdict", "WrappedModuleAdapter",
    "ddp_like_candidate", "load_catalog", "resolve_candidate", "runner_for",
]

_HOMES = {
    "Adapter": "contract.adapter", "WrappedModuleAdapter": "contract.adapter",
    "Candidate": "contract.candidate",
    "Capability": "contract.capability", "DDP_OPTIONS": "contract.capability",
    "DDPLikeAdapter": "contract.ddp_like", "ddp_like_candidate": "contract.ddp_like",
    "resolve_candidate": "contract.registry",
    "Scenario": "catalog.scenario", "JoinSpec": "catalog.scenario",
    "Accumulate": "catalog.scenario", "Optimizer": "catalog.scenario",
    "Init": "catalog.scenario", "SyncStrategy": "catalog.scenario",
    "CommHook": "catalog.scenario",
    "load_catalog": "catalog.loader",
    "RunConfig": "config", "Runner": "runner", "runner_for": "backend_comparison",
    "Session": "session",
    "Result": "judge.verdict", "Verdict": "judge.verdict",
    "UsageError": "errors",
}

if TYPE_CHECKING:
    from ddp_conformance.backend_comparison import runner_for
    from ddp_conformance.catalog.loader import load_catalog
    from ddp_conformance.catalog.scenario import (
        Accumulate,
        CommHook,
        Init,
        JoinSpec,
        Optimizer,
        Scenario,
        SyncStrategy,
    )
    from ddp_conformance.config import RunConfig
    from ddp_conformance.contract.adapter import Adapter, WrappedModuleAdapter
    from ddp_conformance.contract.candidate import Candidate
    from ddp_conformance.contract.capability import DDP_OPTIONS, Capability
    from ddp_conformance.contract.ddp_like import DDPLikeAdapter, ddp_like_candidate
    from ddp_conformance.contract.registry import resolve_candidate
    from ddp_conformance.errors import UsageError
    from ddp_conformance.judge.verdict import Result, Verdict
    from ddp_conformance.runner import Runner
    from ddp_conformance.session import Session


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'ddp_conformance' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"ddp_conformance.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
