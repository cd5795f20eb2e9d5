"""The ``torch-compile*`` built-in candidates: torch's DDP under ``torch.compile``.

Short runs through the harness (two ranks, Gloo): a compiled MLP (an ``nn.Sequential``,
which torch 2.13 would leave uncompiled under DDP without the adapter's user-level root),
``no_sync``, a small bucket cap (the DDP optimizer's first-bucket assertion: XFAIL from the
shipped expectations for ``torch-compile``, a split graph that passes for
``torch-compile-split``), and one compiled-autograd case. Skipped where dynamo cannot run.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from ddp_conformance.builtins import ADAPTERS
from ddp_conformance.builtins.torch_compile import (
    DDP_MODULE,
    VARIANTS,
    _why,
    compiler_settings,
    ddp_traced,
)
from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.config import RunConfig
from ddp_conformance.judge.expectations import Expectations
from ddp_conformance.judge.verdict import Verdict
from ddp_conformance.runner import Runner

NAMES = sorted(VARIANTS)


def _dynamo_supported() -> bool:
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported
    except ImportError:
        return False
    return bool(is_dynamo_supported())


needs_dynamo = pytest.mark.skipif(not _dynamo_supported(), reason="torch.compile cannot run here")


def test_every_variant_is_a_builtin_with_expectations() -> None:
    from ddp_conformance.contract.registry import builtin_candidates

    assert set(NAMES) <= set(builtin_candidates()) and set(NAMES) <= set(ADAPTERS)
    for name in NAMES:
        candidate = ADAPTERS[name]()
        assert candidate.name == name and candidate.expectations is not None
        entries = Expectations.load(candidate.expectations).entries
        assert entries and all(e.reason for e in entries)
        assert all(e.pattern.endswith(f"[{name}]") for e in entries), name
        assert os.path.basename(candidate.expectations) == f"{name}.txt"


def test_compiled_autograd_variant_does_not_claim_what_python_reducer_lacks() -> None:
    ca = ADAPTERS["torch-compile-ca"]().capabilities
    assert "join" not in ca and "comm_hook" not in ca and "no_sync" in ca
    reducer = ADAPTERS["torch-compile"]().capabilities
    assert {"join", "comm_hook", "no_sync", "option:find_unused_parameters"} <= reducer


@pytest.mark.parametrize("name", NAMES)
def test_settings_are_restored(name: str) -> None:
    """Nothing the candidate sets outlives its calls (other candidates share the process)."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch._dynamo import trace_rules

    def state() -> tuple[Any, ...]:
        return (dynamo_config.optimize_ddp, dynamo_config.recompile_limit,
                inductor_config.fallback_random, inductor_config.compile_threads,
                inductor_config._fuse_ddp_communication, DDP_MODULE in trace_rules.LEGACY_MOD_INLINELIST,
                dist._DEFAULT_FIRST_BUCKET_BYTES)

    before = state()
    variant = VARIANTS[name]
    with compiler_settings(variant, 0.001, 1000):
        inside = state()
    assert state() == before
    assert inside[0] == variant.optimize_ddp and inside[1] >= 64 and inside[6] == 1000
    assert inside[5] == variant.compiled_autograd
    assert inside[2] == (variant.backend == "inductor")


def test_ddp_traced_restores_a_leaked_inline_entry() -> None:
    """python-reducer DDP leaves DDP_MODULE in dynamo's inline list: undone while inside."""
    from torch._dynamo import trace_rules

    names = trace_rules.LEGACY_MOD_INLINELIST
    had = DDP_MODULE in names
    names.add(DDP_MODULE)
    try:
        with ddp_traced(False):
            assert DDP_MODULE not in names
        assert DDP_MODULE in names
    finally:
        if not had:
            names.discard(DDP_MODULE)
            trace_rules.get_legacy_mod_inlinelist.cache_clear()


def test_why_names_the_model_not_ddp() -> None:
    reasons = {"Attempt to trace generator\n  Explanation: Generators cannot be compiled directly.",
               "Attempted to wrap RNN\n  Explanation: Dynamo does not support RNN, GRU, or LSTM.\n"
               "  Hint: allow_rnn"}
    assert _why(reasons) == "Dynamo does not support RNN, GRU, or LSTM."


@pytest.fixture(scope="module")
def compile_runner() -> Iterator[Runner]:
    with Runner(RunConfig(candidates=["torch-compile", "torch-compile-split", "torch-compile-ca"],
                          timeout_s=60.0)) as runner:
        yield runner


def _scenario(scenario_id: str) -> Any:
    return next(s for s in load_catalog() if s.id == scenario_id)


@needs_dynamo
@pytest.mark.parametrize("name,scenario_id,verdict", [
    ("torch-compile", "gradients/mlp-sgd", Verdict.PASS),
    ("torch-compile", "no-sync/window-of-3", Verdict.PASS),
    ("torch-compile", "buckets/mlp-tiny-cap", Verdict.XFAIL),
    ("torch-compile-split", "buckets/mlp-tiny-cap", Verdict.PASS),
    ("torch-compile-ca", "gradients/mlp-sgd", Verdict.PASS),
])
def test_compiled_candidate_verdicts(compile_runner: Runner, name: str, scenario_id: str,
                                     verdict: Verdict) -> None:
    result = compile_runner.run_case(_scenario(scenario_id), name)
    assert result.verdict is verdict, result.summary_line()
    if verdict is Verdict.XFAIL:
        assert "First bucket should be smaller" in result.summary_line() + str(result.failures)


@needs_dynamo
def test_join_is_not_claimed_by_compiled_autograd(compile_runner: Runner) -> None:
    result = compile_runner.run_case(_scenario("join/uneven-divide-by-initial"), "torch-compile-ca")
    assert result.verdict is Verdict.NA and "join" in result.reason
