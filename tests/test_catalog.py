"""Scenario validation: a typo fails when the scenario is built or loaded, not as an ERROR.

No processes: scenarios are data, checked in ``Scenario.__post_init__`` and ``validate``.
"""
from __future__ import annotations

import enum
import re
from typing import Any

import pytest

from ddp_conformance.catalog import procedure
from ddp_conformance.catalog.loader import load_catalog, validate
from ddp_conformance.catalog.scenario import (
    Accumulate,
    CommHook,
    Init,
    JoinSpec,
    Optimizer,
    Scenario,
    SyncStrategy,
)
from ddp_conformance.contract.capability import DDP_OPTIONS, Capability

ENUM_FIELDS = [
    ("optimizer", "sgdd", Optimizer),
    ("init", "per-rank", Init),
    ("sync_strategy", "single_autosync", SyncStrategy),
    ("comm_hook", "fp16", CommHook),
    ("accumulate", "nosync", Accumulate),
]


def _fields(name: str, value: Any) -> dict[str, Any]:
    return {name: value}


@pytest.mark.parametrize("field, typo, enum_type", ENUM_FIELDS, ids=[f[0] for f in ENUM_FIELDS])
def test_an_enum_typo_fails_at_construction_naming_field_and_choices(
        field: str, typo: str, enum_type: type[enum.Enum]) -> None:
    with pytest.raises(ValueError) as info:
        Scenario(id="typo/x", model="mlp", **_fields(field, typo))
    message = str(info.value)
    assert "'typo/x'" in message and f"{field}={typo!r}" in message
    for member in enum_type:
        assert repr(member.value) in message


@pytest.mark.parametrize("field, typo, enum_type", ENUM_FIELDS, ids=[f[0] for f in ENUM_FIELDS])
def test_enum_fields_given_by_value_become_members(field: str, typo: str, enum_type: type[enum.Enum]) -> None:
    member = list(enum_type)[-1]
    scenario = Scenario(id="ok/x", model="mlp", **_fields(field, member.value))
    assert getattr(scenario, field) is member


def test_an_unknown_ddp_option_fails_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown DDP options \['find_unused_params'\]") as info:
        Scenario(id="typo/opt", model="mlp", ddp_options={"find_unused_params": True})
    for option in DDP_OPTIONS:
        assert option in str(info.value)


@pytest.mark.parametrize("field", ["steps", "batch_size", "microbatches", "min_world_size",
                                   "comm_hook_registrations"])
def test_counts_below_one_fail(field: str) -> None:
    with pytest.raises(ValueError, match=rf"{field} must be at least 1, got 0"):
        Scenario(id="bad/count", model="mlp", **_fields(field, 0))


def test_validate_rejects_an_unknown_model() -> None:
    scenario = Scenario(id="typo/model", model="mpl")
    with pytest.raises(ValueError, match=re.escape("unknown model 'mpl'; known: ")) as info:
        validate(scenario)
    assert "mlp" in str(info.value)
    validate(Scenario(id="ok/model", model="mlp"))


def test_the_whole_catalog_loads_with_unique_ids() -> None:
    catalog = load_catalog()
    ids = [s.id for s in catalog]
    assert len(ids) >= 64
    assert len(set(ids)) == len(ids)
    for s in catalog:  # every enum field holds a member, whatever the suite wrote
        assert isinstance(s.optimizer, Optimizer) and isinstance(s.init, Init)
        assert isinstance(s.accumulate, Accumulate)
        assert s.comm_hook is None or isinstance(s.comm_hook, CommHook)
        assert s.sync_strategy is None or isinstance(s.sync_strategy, SyncStrategy)


@pytest.mark.parametrize("member", [*Optimizer, *Init, *SyncStrategy, *CommHook, *Accumulate],
                         ids=str)
def test_enums_compare_and_hash_as_their_string_values(member: Any) -> None:
    value = member.value
    assert member == value and value == member
    assert hash(member) == hash(value)
    assert str(member) == value and f"{member}" == value
    assert {value: 1}[member] == 1 and {member: 1}[value] == 1
    assert member in {value} and value in {member}


def test_a_scenario_for_cpu_modules_says_why_it_means_nothing_on_another_device() -> None:
    scenario = Scenario(id="x/cpu", model="mlp", devices=("cpu",))
    assert scenario.unsupported_device("cpu") == ""
    assert scenario.unsupported_device("cuda") == "defined for cpu modules, not cuda"
    assert Scenario(id="x/any", model="mlp").unsupported_device("cuda") == ""


def test_no_forward_broadcasts_buffers_from_the_step_broadcast_buffers_is_set_off() -> None:
    scenario = Scenario(id="x/off", model="conv_bn", steps=3, microbatches=2,
                        broadcast_buffers_off_at=1)
    assert procedure.broadcasts(scenario, 0) == [True, True]
    assert procedure.broadcasts(scenario, 1) == [False, False]
    assert procedure.broadcasts(scenario, 2) == [False, False]
    assert Capability.SET_BROADCAST_BUFFERS.value in scenario.needs
    with pytest.raises(ValueError, match="broadcast_buffers_off_at under Join is not modelled"):
        Scenario(id="x/join", model="conv_bn", broadcast_buffers_off_at=1, join=JoinSpec())
