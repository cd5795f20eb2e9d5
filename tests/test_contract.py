"""The candidate contract: capabilities read from a DDP-like candidate, and the N/A reasons.

Capability detection runs on plain classes (no process group); one real run checks that a
``register_comm_hook`` of another signature makes comm-hook scenarios N/A, not ERROR.
"""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.scenario import missing_capabilities as scenario_missing
from ddp_conformance.contract.capability import Capabilities, Capability, missing_capabilities
from ddp_conformance.contract.ddp_like import DDPLikeAdapter, _instance_capabilities, ddp_like_candidate
from ddp_conformance.contract.registry import resolve_candidate
from tests.deadlines import deadline

ROOT = Path(__file__).resolve().parent.parent
COMM_HOOK = Capability.COMM_HOOK.value
TORCH_SIGNATURE = "not torch's (state, hook)"


class TorchLike:
    def register_comm_hook(self, state: object, hook: Any) -> None: ...


class HookOnly:
    def register_comm_hook(self, hook: Any) -> None: ...


class KeywordOnly:
    def register_comm_hook(self, *, state: object, hook: Any) -> None: ...


class ThreeRequired:
    def register_comm_hook(self, state: object, hook: Any, bucket_cap: int) -> None: ...


class ThirdOptional:
    def register_comm_hook(self, state: object, hook: Any, bucket_cap: int = 0) -> None: ...


class VarArgs:
    def register_comm_hook(self, *args: Any) -> None: ...


class VarArgsOnly:
    def register_comm_hook(*args: Any) -> None: ...  # self swallowed by *args


class Static:
    @staticmethod
    def register_comm_hook(state: object, hook: Any) -> None: ...


class NoHook:
    pass


@pytest.mark.parametrize("cls", [TorchLike, ThirdOptional, VarArgs, VarArgsOnly, Static])
@pytest.mark.parametrize("on", ["class", "instance"])
def test_state_hook_signatures_claim_comm_hook(cls: type, on: str) -> None:
    caps = _instance_capabilities(cls if on == "class" else cls())
    assert COMM_HOOK in caps
    assert COMM_HOOK not in caps.notes


@pytest.mark.parametrize("cls, shown", [
    (HookOnly, "(hook)"),
    (KeywordOnly, "(*, state, hook)"),
    (ThreeRequired, "(state, hook, bucket_cap)"),
])
@pytest.mark.parametrize("on", ["class", "instance"])
def test_other_signatures_do_not_claim_comm_hook_and_say_why(cls: type, shown: str, on: str) -> None:
    caps = _instance_capabilities(cls if on == "class" else cls())
    assert COMM_HOOK not in caps
    assert caps.notes[COMM_HOOK] == f"its register_comm_hook takes {shown}, {TORCH_SIGNATURE}"


def test_no_register_comm_hook_has_no_note() -> None:
    caps = _instance_capabilities(NoHook)
    assert COMM_HOOK not in caps and not caps.notes


class PlainBroadcastAttribute:
    def __init__(self) -> None:
        self.broadcast_buffers = True  # read by its forward, as torch's before 2.13


def test_setting_broadcast_buffers_is_claimed_where_the_attribute_is() -> None:
    from torch.nn.parallel import DistributedDataParallel

    claim = Capability.SET_BROADCAST_BUFFERS.value
    assert claim in _instance_capabilities(DistributedDataParallel)  # torch's property
    assert claim in _instance_capabilities(PlainBroadcastAttribute())
    assert claim not in _instance_capabilities(PlainBroadcastAttribute)  # set in __init__
    assert claim not in _instance_capabilities(NoHook)


def test_torch_and_reference_claim_every_feature() -> None:
    for name in ("torch", "reference"):
        caps = resolve_candidate(name).capabilities
        assert {c.value for c in Capability} <= caps, name
        assert not getattr(caps, "notes", {}), name


def _comm_hook_scenario() -> Any:
    return next(s for s in load_catalog() if s.id == "comm-hooks/allreduce")


def test_the_note_is_in_the_na_reason_of_a_class_candidate() -> None:
    from tests.limited import OneArgumentCommHook

    candidate = ddp_like_candidate("one-arg", OneArgumentCommHook)
    assert not candidate.late_capabilities
    assert scenario_missing(_comm_hook_scenario(), candidate.capabilities) == (
        "candidate lacks comm_hook (its register_comm_hook takes (hook), "
        f"{TORCH_SIGNATURE})")


class _HookOnlyModule(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def register_comm_hook(self, hook: Any) -> None: ...


def test_the_note_is_in_the_na_reason_of_a_wrapped_instance() -> None:
    """A factory function's capabilities are read from the adapter after wrapping."""
    accepted = frozenset({Capability.option("broadcast_buffers")})
    adapter = DDPLikeAdapter(_HookOnlyModule(), nn.Linear(2, 2), accepted)
    assert Capability.option("broadcast_buffers") in adapter.capabilities
    assert scenario_missing(_comm_hook_scenario(), adapter.capabilities) == (
        f"candidate lacks comm_hook (its register_comm_hook takes (hook), {TORCH_SIGNATURE})")


def test_other_na_reasons_are_unchanged() -> None:
    needs = frozenset({COMM_HOOK, "no_sync", "option:static_graph"})
    assert missing_capabilities(needs, frozenset()) == (
        "candidate lacks comm_hook, no_sync, option:static_graph")
    noted = Capabilities({"no_sync"}, {COMM_HOOK: "why", "join": "unused: not missing"})
    assert missing_capabilities(needs, noted) == "candidate lacks comm_hook (why), option:static_graph"
    assert missing_capabilities(frozenset({"no_sync"}), noted) == ""


def test_capabilities_keep_their_notes_through_union_and_pickle() -> None:
    caps = Capabilities({"join"}, {COMM_HOOK: "why"})
    for union in (caps | frozenset({"no_sync"}), frozenset({"no_sync"}) | caps):
        assert union == {"join", "no_sync"} and union.notes == {COMM_HOOK: "why"}  # type: ignore[attr-defined]
    assert (Capabilities({"a"}, {"x": "left"}) | Capabilities({"b"}, {"x": "right"})).notes == {"x": "left"}
    restored = pickle.loads(pickle.dumps(caps))
    assert restored == caps and restored.notes == caps.notes
    assert caps == frozenset({"join"}) and hash(caps) == hash(frozenset({"join"}))


def test_a_one_argument_register_comm_hook_runs_as_not_applicable(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddp_conformance", "run", "--candidate",
         "tests.limited:OneArgumentCommHook", "-k", "comm-hooks", "--report-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=deadline(300))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    cases = [r for r in results if r.get("type") == "result"]
    assert cases, results
    reason = ("candidate lacks comm_hook (its register_comm_hook takes (hook), "
              f"{TORCH_SIGNATURE})")
    for case in cases:
        assert case["verdict"] == "N/A" and case["reason"] == reason, case
