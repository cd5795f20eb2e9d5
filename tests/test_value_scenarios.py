"""The value models (``catalog/models/value_models.py``) do what their scenarios claim, seen
through the single-process oracle (no process group)."""
from __future__ import annotations

import math

import pytest
import torch

from ddp_conformance import Scenario
from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.models import get_model
from ddp_conformance.catalog.models.value_models import NON_FINITE_COLUMNS, NON_FINITE_STEP
from ddp_conformance.catalog.procedure import batch, build_module
from ddp_conformance.judge.oracle import run_oracle

CPU = torch.device("cpu")


def test_every_values_scenario_is_in_the_catalog_with_a_description() -> None:
    ids = [s.id for s in load_catalog() if s.id.startswith("values/")]
    assert len(ids) >= 15 and len(ids) == len(set(ids))
    for s in load_catalog():
        if s.id.startswith("values/"):
            assert s.description, s.id
            get_model(s.model)


@pytest.mark.parametrize(("model", "dtype"), [
    ("mlp_float64", torch.float64), ("mlp_bfloat16", torch.bfloat16),
    ("mlp_float16", torch.float16)])
def test_whole_dtype_models_are_in_their_dtype_everywhere(model: str, dtype: torch.dtype) -> None:
    scenario = Scenario("t", model, steps=2)
    oracle = run_oracle(scenario, 2, CPU)
    assert oracle.grad_dtypes == frozenset({str(dtype).removeprefix("torch.")})
    (x,), y = batch(scenario, 0, 0, 0, 2, CPU)
    assert x.dtype == y.dtype == dtype
    for step in oracle.steps:
        assert all(g is not None and g.dtype == dtype for g in step.grads.values())


def test_complex_model_has_complex64_gradients_and_a_real_loss() -> None:
    oracle = run_oracle(Scenario("t", "complex", steps=2), 2, CPU)
    assert oracle.grad_dtypes == frozenset({"complex64", "float32"})
    g = oracle.steps[1].grads["weight"]
    assert g is not None and g.dtype == torch.complex64 and bool(g.imag.abs().sum() > 0)


def test_huge_tensor_is_above_two_to_the_eighteen() -> None:
    model = build_module(Scenario("t", "huge_tensor"), 0, CPU)
    assert max(p.numel() for p in model.parameters()) > 2**18


def test_non_finite_batch_and_oracle() -> None:
    """The last rank's batch holds inf, -inf and NaN at one step only; the oracle's
    gradient of ``gain`` is non-finite exactly in those columns (signs from ``gain``), the
    step it takes is undone at once (its recorded parameters are those before it, as a
    candidate that skips the step itself leaves them), and the next step trains."""
    scenario = Scenario("t", "non_finite_grad", steps=4)
    for world_size in (1, 2, 3):
        for rank in range(world_size):
            for step in range(4):
                (_, z), _ = batch(scenario, rank, step, 0, world_size, CPU)
                expect = step == NON_FINITE_STEP and rank == world_size - 1
                assert bool(torch.isfinite(z).all()) != expect
    oracle = run_oracle(scenario, 2, CPU)
    before = oracle.steps[NON_FINITE_STEP - 1].params
    g = oracle.steps[NON_FINITE_STEP].grads["gain"]
    assert g is not None
    for column in range(8):
        value = NON_FINITE_COLUMNS.get(column)
        if value is None:
            assert math.isfinite(g[column])
        elif math.isnan(value):
            assert math.isnan(g[column])
        else:
            sign = 1.0 if before["gain"][column] > 0 else -1.0
            assert g[column] == sign * math.inf
    fc = oracle.steps[NON_FINITE_STEP].grads["fc.weight"]
    assert fc is not None and bool(torch.isfinite(fc).all())
    undone = oracle.steps[NON_FINITE_STEP].params
    assert all(torch.equal(undone[n], p) for n, p in before.items())
    # The step after trains from the restored parameters.
    after = oracle.steps[NON_FINITE_STEP + 1]
    assert not torch.equal(after.params["fc.weight"], before["fc.weight"])
    assert all(bool(torch.isfinite(p).all()) for p in after.params.values())
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in after.grads.values())


def test_buffer_kinds_are_integer_float_and_non_persistent() -> None:
    model = build_module(Scenario("t", "buffer_kinds"), 0, CPU)
    buffers = dict(model.named_buffers())
    assert buffers["calls"].dtype == torch.int64
    assert set(model.state_dict()) >= {"calls", "mean"}
    assert not {"peak", "offset"} & set(model.state_dict())
    oracle = run_oracle(Scenario("t", "buffer_kinds", steps=3,
                                 ddp_options={"broadcast_buffers": False}), 2, CPU)
    last = oracle.steps[-1].buffers
    assert int(last[0]["calls"]) == int(last[1]["calls"]) == 3
    assert not torch.equal(last[0]["mean"], last[1]["mean"])
    assert not torch.equal(last[0]["peak"], last[1]["peak"])


def test_late_layer_has_no_gradient_until_step_five() -> None:
    oracle = run_oracle(Scenario("t", "late_use", steps=8,
                                 ddp_options={"find_unused_parameters": True}), 2, CPU)
    for step, ostep in enumerate(oracle.steps):
        assert (ostep.grads["late.weight"] is None) == (step < 5), step
