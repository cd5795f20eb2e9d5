"""The built-in ecosystem adapters: registry, missing packages, and short runs of each.

Runs need the package an adapter wraps; they skip (``pytest.importorskip``) without it, so
the default test run stays green and fast without the extras.
"""
from __future__ import annotations

import builtins
import os
from collections.abc import Iterator
from typing import Any

import pytest

from ddp_conformance.builtins import ADAPTERS
from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.config import RunConfig
from ddp_conformance.errors import UsageError
from ddp_conformance.judge.expectations import Expectations
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.runner import Runner

TORCH_NATIVE = ["replicate", "fsdp-no-shard", "fsdp-full-shard", "fsdp2", "torch-python-reducer"]
PACKAGED = {"lightning": "pytorch_lightning", "accelerate": "accelerate",
            "deepspeed-zero0": "deepspeed", "deepspeed-zero1": "deepspeed",
            "deepspeed-zero2": "deepspeed", "fairscale-sharded": "fairscale"}
#: Smoke cases a framework cannot run by design: N/A naming the missing capability.
NOT_APPLICABLE = {("deepspeed-zero2", "no-sync/window-of-3"): "no_sync"}
#: Scenarios short enough for a smoke run of every adapter.
SMOKE = ("gradients/mlp-adam", "no-sync/window-of-3")


def test_every_adapter_is_a_builtin() -> None:
    from ddp_conformance.contract.registry import builtin_candidates

    assert set(TORCH_NATIVE) | set(PACKAGED) <= set(builtin_candidates())


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_shipped_expectations_parse_and_give_reasons(name: str) -> None:
    path = os.path.join(os.path.dirname(__import__("ddp_conformance.builtins").builtins.__file__),
                        "expectations", f"{name}.txt")
    if not os.path.exists(path):
        pytest.skip(f"{name} ships no expectations")
    entries = Expectations.load(path).entries
    assert entries and all(e.reason for e in entries)


#: The third-party DDPs of the trust issue: (module, extra) each (tests/test_third_party.py).
THIRD_PARTY_EXTRAS = {"torchft": ("torchft", "torchft"), "megatron-core": ("megatron", "megatron-core"),
                      "ignite": ("ignite", "ignite")}


@pytest.mark.parametrize("name,module,extra", sorted(
    [(name, module, "ecosystem") for name, module in PACKAGED.items()]
    + [(name, module, extra) for name, (module, extra) in THIRD_PARTY_EXTRAS.items()]))
def test_missing_package_is_one_usage_line(name: str, module: str, extra: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def fake_import(mod: str, *args: Any, **kwargs: Any) -> Any:
        if mod == module or mod.startswith(module + "."):
            raise ImportError(f"No module named {mod!r}")
        return real_import(mod, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.setattr("importlib.import_module", lambda mod: fake_import(mod))
    with pytest.raises(UsageError) as info:
        ADAPTERS[name]()
    message = str(info.value)
    assert "\n" not in message and f"candidate {name!r} needs" in message
    assert f"pip install -e .[{extra}]" in message


@pytest.fixture(scope="module")
def adapter_runner() -> Iterator[Runner]:
    names = TORCH_NATIVE + [n for n, m in PACKAGED.items() if _importable(m)]
    with Runner(RunConfig(candidates=names, timeout_s=60.0)) as runner:
        yield runner


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _scenario(scenario_id: str) -> Any:
    return next(s for s in load_catalog() if s.id == scenario_id)


@pytest.mark.parametrize("scenario_id", SMOKE)
@pytest.mark.parametrize("name", TORCH_NATIVE + sorted(PACKAGED))
def test_adapter_runs_and_passes(adapter_runner: Runner, name: str, scenario_id: str) -> None:
    if name in PACKAGED:
        pytest.importorskip(PACKAGED[name])
    result = adapter_runner.run_case(_scenario(scenario_id), name)
    missing = NOT_APPLICABLE.get((name, scenario_id))
    if missing is not None:
        assert result.verdict is Verdict.NA and missing in result.reason, result.summary_line()
        return
    assert result.verdict in (Verdict.PASS, Verdict.XPASS), result.summary_line()


def test_value_dependent_option_is_not_applicable(adapter_runner: Runner) -> None:
    """FSDP never broadcasts buffers: broadcast_buffers=True is N/A, not silently ignored."""
    broadcast = next(s for s in load_catalog() if s.ddp_options.get("broadcast_buffers") is True
                     or (s.model == "conv_bn" and "broadcast_buffers" not in s.ddp_options
                         and s.id.startswith("buffers/")))
    result = adapter_runner.run_case(broadcast, "fsdp-no-shard")
    assert result.verdict is Verdict.NA and "broadcast_buffers" in result.reason


def test_sync_windows_switch_sync_on_only_when_the_outermost_window_closes() -> None:
    """FSDP2's and replicate's no_sync: a nested window leaves the outer one unsynced, and
    an exception inside still restores."""
    from ddp_conformance.builtins._common import SyncWindows

    calls: list[bool] = []
    windows = SyncWindows(calls.append)
    with windows.window():
        with windows.window():
            pass
        assert calls == [False, False, False]  # the inner exit keeps sync off
    assert calls[-1] is True
    with pytest.raises(ValueError), windows.window():
        raise ValueError("inside")
    assert calls[-2:] == [False, True]


def test_only_the_refusal_the_scenario_names_excuses_an_unreadable_candidate() -> None:
    from ddp_conformance.catalog.scenario import Scenario
    from ddp_conformance.ranks.engine import _the_expected_refusal

    refused = Scenario("t", "sync_bn", expect_error=r"SyncBatchNorm")
    assert _the_expected_refusal(refused, "ValueError: SyncBatchNorm expected input on GPU")
    assert not _the_expected_refusal(refused, "RuntimeError: size mismatch")
    assert not _the_expected_refusal(refused, "")
    limit = Scenario("t", "gpt", torch_limit=r"mark a variable ready only once")
    assert not _the_expected_refusal(limit, "RuntimeError: Expected weight to be of same shape")
    assert not _the_expected_refusal(Scenario("t", "mlp"), "RuntimeError: anything")
