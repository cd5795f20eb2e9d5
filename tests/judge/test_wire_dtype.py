"""trace.dtype flags only reductions that lose precision (torch's own dtype when strict)."""
from __future__ import annotations

import pytest
import torch

from ddp_conformance.catalog.scenario import CommHook, Scenario, SyncStrategy
from ddp_conformance.script.wire_dtypes import lossless, same, shortfall

from .world import World, bucket_trace, make_world

FP16_HOOK = Scenario("judge/fp16-hook", "mlp", comm_hook=CommHook.FP16_COMPRESS)


def model(*dtypes: torch.dtype) -> dict[str, torch.Tensor]:
    """One parameter per dtype, of different sizes (3, 2, 4, 5 elements)."""
    sizes = (3, 2, 4, 5)
    return {f"p{i}": torch.ones(sizes[i], dtype=d) for i, d in enumerate(dtypes)}


def reduced_in(wire: str, *dtypes: torch.dtype, strict: bool = False,
               scenario: Scenario | None = None) -> World:
    params = model(*dtypes)
    world = make_world(scenario, params, strict=strict)
    world.set_trace(bucket_trace(world.scenario, params, 2, wire=wire))
    return world


@pytest.mark.parametrize(("wire", "grad", "ok"), [
    ("float64", "float32", True), ("float64", "bfloat16", True), ("float32", "float16", True),
    ("float32", "bfloat16", True), ("float32", "float32", True), ("float32", "float64", False),
    ("float16", "float32", False), ("float16", "bfloat16", False), ("bfloat16", "float16", False),
    ("bfloat16", "float32", False), ("float16", "float16", True)])
def test_lossless_wire_dtypes(wire: str, grad: str, ok: bool) -> None:
    assert lossless(wire, grad) is ok


def test_float32_reduced_in_float64_passes_non_strict() -> None:
    world = reduced_in("float64", torch.float32)
    assert world.failed() == set()


def test_float32_reduced_in_float64_fails_strict() -> None:
    world = reduced_in("float64", torch.float32, strict=True)
    assert world.failed() == {"trace.dtype"}
    message = world.messages("trace.dtype")[0]
    assert "float64" in message and "expected float32 (strict profile" in message


def test_float32_reduced_in_float16_fails() -> None:
    for strict in (False, True):
        world = reduced_in("float16", torch.float32, strict=strict)
        assert world.failed() == {"trace.dtype"}
        message = world.messages("trace.dtype")[0]
        assert "float16" in message and "expected float32" in message
    assert world.messages("trace.dtype")[0].endswith("precision silently changed)")
    world = reduced_in("float16", torch.float32)
    world.judge()
    assert world.messages("trace.dtype")[0] == (
        "trace.dtype: step 0, microbatch 0, rank 0: gradients reduced as allreduce(3 x float16, "
        "group of 2), expected float32 or a dtype that holds it exactly (float64) "
        "(precision lost)")
    assert len(world.messages("trace.dtype")) == 2  # one per rank


@pytest.mark.parametrize(("grad", "wire", "ok"), [
    (torch.bfloat16, "float16", False), (torch.float16, "bfloat16", False),
    (torch.float16, "float32", True), (torch.bfloat16, "float64", True),
    (torch.float64, "float32", False)])
def test_other_single_dtype_models(grad: torch.dtype, wire: str, ok: bool) -> None:
    assert reduced_in(wire, grad).failed() == (set() if ok else {"trace.dtype"})


def test_float64_reduced_in_float32_in_a_mixed_model_fails() -> None:
    world = reduced_in("float32", torch.float32, torch.float64)
    assert world.failed() == {"trace.dtype"}
    assert world.messages("trace.dtype") == [
        "trace.dtype: step 0, microbatch 0, rank 0: only 0 of the model's 2 float64 gradient "
        "elements were reduced in float64 (reduced as {'float32': 5}: precision lost)"]


def test_a_mixed_model_reduced_in_float64_passes_non_strict_fails_strict() -> None:
    assert reduced_in("float64", torch.float32, torch.float64).failed() == set()
    world = reduced_in("float64", torch.float32, torch.float64, strict=True)
    assert world.failed() == {"trace.dtype"}


def test_a_mixed_model_in_torchs_buckets_passes_strict_and_not() -> None:
    for strict in (False, True):
        params = model(torch.float32, torch.float64)
        assert make_world(params=params, strict=strict).failed() == set()


def test_strict_per_dtype_volume_keeps_its_message() -> None:
    params = model(torch.float32, torch.float64)
    world = make_world(params=params, strict=True)
    world.set_trace([c for c in world.records[0].trace if c.dtype == "float32"])
    assert world.failed() == {"trace.dtype", "trace.reduced_once", "trace.buckets"}
    assert world.messages("trace.dtype") == [
        "trace.dtype: step 0, microbatch 0, rank 0: only 0 of the model's 2 float64 gradient "
        "elements were reduced in float64 (reduced as {'float32': 3}: precision changed)"]


def test_a_globally_unused_float64_parameter_need_not_be_reduced() -> None:
    params = model(torch.float32, torch.float64)
    world = make_world(params=params, unused=frozenset({"p1"}))
    assert [c.dtype for c in world.backward_reductions()] == ["float32", "float32"]
    assert world.failed() == set()
    world.oracle.steps[0].local_grads = [frozenset({"p0", "p1"})]  # p1 used on some rank
    assert world.failed() >= {"trace.dtype"}
    assert "only 0 of the model's 2 float64" in world.messages("trace.dtype")[0]


def test_fp16_compress_demands_float16_exactly() -> None:
    assert reduced_in("float16", torch.float32, scenario=FP16_HOOK).failed() == set()
    for wire in ("float32", "float64"):  # the hook ignored, or a wider wire: not what it asked
        world = reduced_in(wire, torch.float32, scenario=FP16_HOOK)
        assert world.failed() == {"trace.dtype"}
        assert "expected float16 (precision silently changed)" in world.messages("trace.dtype")[0]


def test_under_forced_sync_the_hook_never_runs_and_gradients_go_in_their_own_dtype() -> None:
    """Composer's forced_sync: every microbatch inside no_sync, then an allreduce by hand."""
    forced = Scenario("judge/fp16-hook-forced", "mlp", comm_hook=CommHook.FP16_COMPRESS,
                      microbatches=2, sync_strategy=SyncStrategy.FORCED_SYNC)
    assert reduced_in("float32", torch.float32, scenario=forced).failed() == set()
    world = reduced_in("float16", torch.float32, scenario=forced)
    assert world.failed() == {"trace.dtype"}
    assert "precision lost" in world.messages("trace.dtype")[0]


def test_hall_condition_over_sets_of_dtypes() -> None:
    # float16 and bfloat16 both fit float32, but 4 + 4 elements do not fit in 6.
    short = shortfall({"float16": 4, "bfloat16": 4}, {"float32": 6, "float16": 0}, lossless)
    assert short is not None and short.dtypes == ("float16", "bfloat16")
    assert (short.needed, short.covered) == (8, 6)
    assert shortfall({"float16": 4, "bfloat16": 4}, {"float32": 8}, lossless) is None
    # float64 elements cannot travel in float32 even when the total is enough.
    short = shortfall({"float32": 3, "float64": 2}, {"float32": 5}, lossless)
    assert short is not None and short.dtypes == ("float64",)
    assert shortfall({"float32": 3, "float64": 2}, {"float64": 5}, lossless) is None
    assert shortfall({"float32": 3, "float64": 2}, {"float64": 5}, same) is not None
    assert shortfall({"float32": 0}, {}, lossless) is None
