"""Shared fixtures: one runner (one rank pool) per test session and world size."""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from ddp_conformance.config import RunConfig
from ddp_conformance.runner import Runner

DEFECTIVE = "tests.defective:"
CANDIDATES = ["torch", "tests.limited:ForwardOnly", "tests.limited:torch_ddp_factory",
              *(DEFECTIVE + name for name in (
                  "SumsWithoutDividing", "NeverBroadcastsBuffers", "JoinHookDoesNotShadow",
                  "ExitsMidStep", "SegfaultsMidStep", "RaisesOnRank1", "SyncsInsideNoSync",
                  "NoSyncSwitchesSyncOn",
                  "ReducesInFloat16",
                  "UsesWorldGroup", "AcceptsSecondCommHook")),
              "tests.newcomers:NewcomerDDP", "tests.newcomers:SlowRank1"]


@pytest.fixture(scope="session")
def runner() -> Iterator[Runner]:
    """A runner knowing every test candidate, 2 ranks, a short deadline (hangs are tested)."""
    with Runner(RunConfig(candidates=CANDIDATES, timeout_s=8.0)) as r:
        yield r


@pytest.fixture(scope="session")
def runner4() -> Iterator[Runner]:
    """Four ranks, for the process-group scenarios."""
    with Runner(RunConfig(candidates=["torch", DEFECTIVE + "UsesWorldGroup"], world_size=4,
                          timeout_s=20.0)) as r:
        yield r
