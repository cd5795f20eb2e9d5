"""The judge on the values real training meets: complex tensors (compared as their real
pairs, ULP per component), non-finite values (NaN and inf compared by position), and
complex collectives counted in real elements in the trace."""
from __future__ import annotations

import math

import torch

from ddp_conformance.judge.evidence import Evidence
from ddp_conformance.judge.tolerance import (
    Policy,
    distance,
    non_finite_mismatches,
    rtol_for,
    ulp_distance,
)
from ddp_conformance.judge.trace_facts import backward_allreduce_sizes, gradient_elements
from ddp_conformance.ranks.tracing import Collective
from ddp_conformance.script.collective import as_real, real_counts

from .judge.world import World, bucket_trace, make_world

INF, NAN = math.inf, math.nan


# --- complex ------------------------------------------------------------------------------


def _up(t: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(t, torch.full_like(t, INF))


def test_complex_tolerance_is_its_real_dtype_s() -> None:
    assert rtol_for(torch.complex64, False) == rtol_for(torch.float32, False) == 1e-5
    assert rtol_for(torch.complex128, False) == rtol_for(torch.float64, False)
    assert rtol_for(torch.complex64, True) == 0.0
    assert Policy().rtol(torch.complex64) == 1e-5
    assert Policy.for_model(False, None, frozenset({"complex64", "float32"})).floor == 1e-5


def test_complex_ulp_counts_steps_per_component() -> None:
    z = torch.tensor([1.0 + 2.0j, -3.0 + 0.5j], dtype=torch.complex64)
    assert ulp_distance(z, z.clone()) == 0.0
    real_up = torch.complex(_up(z.real), z.imag)
    assert ulp_distance(real_up, z) == 1.0
    imag_up2 = torch.complex(z.real, _up(_up(z.imag)))
    assert ulp_distance(imag_up2, z) == 2.0
    d = distance(imag_up2, z)
    assert d.max_ulp == 2.0 and d.max_abs > 0 and not d.within(0.0)
    assert d.within(rtol_for(torch.complex64, False))


def test_complex_error_in_the_imaginary_part_alone_is_caught() -> None:
    """A DDP that reduces only the real part (or drops the imaginary one) fails."""
    gen = torch.Generator().manual_seed(0)
    z = torch.complex(torch.randn(100, generator=gen), torch.randn(100, generator=gen))
    assert not distance(torch.complex(z.real, torch.zeros(100)), z).within(1e-5)
    assert not distance(z.conj().resolve_conj(), z).within(1e-5)
    # A conjugate view is compared by value, not by its lazy bit.
    assert distance(z.conj().conj(), z).within(0.0)


def test_reordered_complex64_reduction_passes_and_a_float16_one_fails() -> None:
    gen = torch.Generator().manual_seed(1)
    for world_size in (2, 3, 4):
        grads = [torch.complex(torch.randn(500, generator=gen), torch.randn(500, generator=gen))
                 for _ in range(world_size)]

        def reduce(order: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
            total = torch.zeros(500, 2, dtype=dtype)
            for g in order:
                total = total + torch.view_as_real(g).to(dtype) / len(order)
            return torch.view_as_complex(total.float().contiguous())

        expected = reduce(grads, torch.float32)
        assert distance(reduce(grads[::-1], torch.float32), expected).within(1e-5)
        assert not distance(reduce(grads, torch.float16), expected).within(1e-5)


def test_complex_against_real_is_a_mismatch() -> None:
    d = distance(torch.ones(3, dtype=torch.complex64), torch.ones(3))
    assert d.max_abs == INF and not d.within(1.0)


# --- non-finite values --------------------------------------------------------------------


def test_nan_and_inf_at_the_same_positions_are_equal_even_bitwise() -> None:
    e = torch.tensor([1.0, NAN, INF, -INF, 2.0])
    a = e.clone()
    a[1] = -NAN  # another NaN payload / sign: still NaN
    assert non_finite_mismatches(a, e) == 0
    d = distance(a, e)
    assert d.within(0.0) and d.max_abs == 0.0 and d.max_ulp == 0.0 and d.scale == 2.0


def test_a_nan_where_a_finite_value_is_expected_fails_at_any_tolerance() -> None:
    e = torch.tensor([1.0, 2.0, 3.0])
    a = torch.tensor([1.0, NAN, 3.0])
    for actual, expected in ((a, e), (e, a)):
        d = distance(actual, expected)
        assert not d.within(0.0) and not d.within(1.0) and not d.within(1e30)
        assert non_finite_mismatches(actual, expected) == 1


def test_inf_of_the_other_sign_or_nan_for_inf_fails() -> None:
    e = torch.tensor([INF, -INF, 1.0])
    for broken in ([-INF, -INF, 1.0], [INF, NAN, 1.0], [INF, -INF, INF], [1e38, -INF, 1.0]):
        a = torch.tensor(broken)
        assert non_finite_mismatches(a, e) == 1, broken
        assert not distance(a, e).within(1.0), broken


def test_finite_elements_beside_non_finite_ones_are_still_compared() -> None:
    e = torch.tensor([INF, NAN, 1.0, 2.0])
    a = torch.tensor([INF, NAN, 1.0, 2.5])
    d = distance(a, e)
    assert d.max_abs == 0.5 and d.scale == 2.0 and not d.within(1e-5)
    assert distance(torch.tensor([INF, NAN, 1.0, 2.0 + 1e-6]), e).within(1e-5)


def test_complex_non_finite_components_compare_by_position() -> None:
    e = torch.complex(torch.tensor([INF, 1.0]), torch.tensor([0.0, NAN]))
    assert distance(e.clone(), e).within(0.0)
    broken = torch.complex(torch.tensor([INF, 1.0]), torch.tensor([NAN, NAN]))
    assert not distance(broken, e).within(1.0)


def test_evidence_names_the_non_finite_mismatch_and_ignores_a_non_finite_scale() -> None:
    ev = Evidence()
    e = torch.tensor([INF, 1.0])
    ev.compare("oracle.grad", 1, 0, "gain", torch.tensor([1.0, 1.0]), e, 1e-5, "the oracle",
               scale=INF)
    assert len(ev.failures) == 1 and "non-finite" in ev.failures[0].message
    # An infinite scale (an inf among the summed gradients) must not excuse a finite error.
    ev = Evidence()
    ev.compare("oracle.grad", 1, 0, "gain", torch.tensor([INF, 1.5]), e, 1e-5, "the oracle",
               scale=INF)
    assert len(ev.failures) == 1 and "max abs error 0.5" in ev.failures[0].message
    ev = Evidence()
    ev.compare("oracle.grad", 1, 0, "gain", torch.tensor([INF, 1.0]), e, 1e-5, "the oracle",
               scale=NAN)
    assert not ev.failures


def _non_finite_world() -> tuple[World, dict[str, torch.Tensor]]:
    world = make_world()
    for records in (world.records, world.reference or {}):
        for rec in records.values():
            rec.steps[1].grads["w"] = torch.tensor([INF, NAN, -INF])
    g = torch.tensor([INF, NAN, -INF])
    world.oracle.steps[1].grads["w"] = g
    return world, {"w": g}


def test_the_judge_passes_identical_non_finite_gradients_and_fails_one_rank_finite() -> None:
    world, _ = _non_finite_world()
    assert world.failed() == set()
    # A DDP that did not carry the inf to rank 1: its gradient stays finite there.
    world.records[1].steps[1].grads["w"] = torch.tensor([1.0, NAN, -INF])
    assert {"oracle.grad", "reference.grad"} <= world.failed()
    # And a NaN where the oracle has a finite value.
    world, _ = _non_finite_world()
    world.records[0].steps[0].grads["b"] = torch.tensor([NAN])
    assert "oracle.grad" in world.failed()


def test_replicas_with_nan_at_the_same_positions_are_bitwise_equal() -> None:
    world = make_world()
    for rec in world.records.values():
        rec.steps[0].params["w"] = torch.tensor([1.0, NAN, INF])
    world.oracle.steps[0].params["w"] = torch.tensor([1.0, NAN, INF])
    assert world.failed() - {"reference.param"} == set()
    world.records[1].steps[0].params["w"] = torch.tensor([1.0, 2.0, INF])
    assert "replica.param" in world.failed()


# --- complex in the trace -----------------------------------------------------------------


def test_complex_collectives_count_in_real_elements() -> None:
    assert as_real("complex64", 5) == ("float32", 10)
    assert as_real("complex128", 5) == ("float64", 10)
    assert as_real("float32", 5) == ("float32", 5)
    assert real_counts({"complex64": 36, "float32": 36}) == {"float32": 108}
    native = [Collective(0, 0, "backward", "allreduce", "complex64", 36, 2)]
    viewed = [Collective(0, 0, "backward", "allreduce", "float32", 72, 2)]
    assert backward_allreduce_sizes(native) == backward_allreduce_sizes(viewed) == {(0, 0): [72]}
    assert gradient_elements(native) == gradient_elements(viewed) == {(0, 0): (72, 1)}


def _complex_world() -> World:
    params = {"z": torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64),
              "b": torch.tensor([0.5])}
    return make_world(params=params, strict=True)


def test_a_complex_model_reduced_as_real_pairs_or_natively_passes_the_trace() -> None:
    world = _complex_world()
    assert world.failed() == set()
    params = world.oracle.initial_params
    # torch: the complex bucket as view_as_real float32 (twice the elements).
    trace = [Collective(c.step, c.microbatch, c.stage, c.kind,
                        "float32" if c.dtype == "complex64" else c.dtype,
                        c.numel * (2 if c.dtype == "complex64" else 1), c.group_size)
             for c in bucket_trace(world.scenario, params, 2)]
    world.set_trace(trace)
    assert world.reference is not None
    for rec in world.reference.values():
        rec.trace = list(trace)
    assert world.failed() == set()


def test_a_complex_gradient_reduced_half_or_twice_is_caught() -> None:
    world = _complex_world()
    half = [Collective(c.step, c.microbatch, c.stage, c.kind, "float32",
                       c.numel if c.dtype == "complex64" else c.numel, c.group_size)
            for c in world.records[0].trace]
    world.set_trace(half)
    assert "trace.reduced_once" in world.failed()
    world = _complex_world()
    twice = list(world.records[0].trace) * 2
    world.set_trace(twice)
    assert "trace.reduced_once" in world.failed()


# --- a parameter keeps its dtype ----------------------------------------------------------


def test_a_parameter_left_in_another_dtype_fails_although_its_values_are_close() -> None:
    """Under mixed_precision the parameters are full precision outside forward and
    backward: a float16 copy left in place rounds every value by at most 2**-11 relative,
    inside the scenario's 5e-3, so only the dtype tells the defect."""
    expected = torch.linspace(-1, 1, 16)
    ev = Evidence()
    ev.compare("oracle.param", 0, 0, "w", expected.to(torch.float16), expected, 5e-3, "the oracle")
    assert [f.check for f in ev.failures] == ["oracle.param"]
    assert "parameter in float16, the oracle's in float32" in ev.failures[0].message
    ok = Evidence()
    ok.compare("oracle.param", 0, 0, "w", expected.clone(), expected, 5e-3, "the oracle")
    assert not ok.failures
    # A gradient's dtype is the trace's business (trace.dtype), not this check's.
    grad = Evidence()
    grad.compare("oracle.grad", 0, 0, "w", expected.to(torch.float16), expected, 5e-3, "the oracle")
    assert not grad.failures
