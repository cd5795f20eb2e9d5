"""The oracle against gradients written out by hand."""
from __future__ import annotations

import torch

from ddp_conformance.catalog.procedure import batch, build_module
from ddp_conformance.catalog.scenario import JoinSpec, Scenario
from ddp_conformance.judge.oracle import run_oracle

CPU = torch.device("cpu")


def local_grads(scenario: Scenario, rank: int, step: int, world_size: int) -> dict[str, torch.Tensor]:
    """One rank's local gradient at the initial weights, computed directly."""
    model = build_module(scenario, 0, CPU)
    inputs, target = batch(scenario, rank, step, 0, world_size, CPU)
    from ddp_conformance.catalog.models import get_model

    get_model(scenario.model).loss(model(*inputs), target).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_first_step_gradient_is_the_mean_of_local_gradients() -> None:
    s = Scenario("t/mlp", "mlp", steps=1)
    for ws in (1, 2, 3):
        record = run_oracle(s, ws, CPU)
        locals_ = [local_grads(s, r, 0, ws) for r in range(ws)]
        for name, g in record.steps[0].grads.items():
            want = sum(lg[name] for lg in locals_) / ws
            assert g is not None and torch.allclose(g, want, rtol=1e-6, atol=1e-7), name


def test_parameters_follow_sgd() -> None:
    s = Scenario("t/mlp", "mlp", steps=1, lr=0.5)
    record = run_oracle(s, 2, CPU)
    for name, p in record.steps[0].params.items():
        g = record.steps[0].grads[name]
        assert g is not None
        assert torch.equal(p, record.initial_params[name] - 0.5 * g)


def test_join_divisor_and_active_ranks() -> None:
    for by_initial in (True, False):
        s = Scenario("t/join", "mlp", steps=3, join=JoinSpec(divide_by_initial_world_size=by_initial))
        record = run_oracle(s, 3, CPU)
        assert [st.active for st in record.steps] == [[0, 1, 2], [0, 1], [0]]
        assert record.last_joiner == 0
    # At step 0 all three ranks are active, so both divisors agree; the data differs per rank.
    a = run_oracle(Scenario("t/j", "mlp", steps=1, join=JoinSpec(True)), 3, CPU).steps[0].grads
    b = run_oracle(Scenario("t/j", "mlp", steps=1, join=JoinSpec(False)), 3, CPU).steps[0].grads
    assert all(torch.equal(a[n], b[n]) for n in a)  # type: ignore[arg-type]


def test_divide_by_active_ranks_scales_a_lone_rank_by_world_size() -> None:
    """With one active rank left, dividing by 1 instead of 3 makes the gradient 3x larger."""
    grads = {}
    for by_initial in (True, False):
        s = Scenario("t/j", "mlp", steps=3, lr=0.0,
                     join=JoinSpec(divide_by_initial_world_size=by_initial))
        grads[by_initial] = run_oracle(s, 3, CPU).steps[2].grads
    for name, g in grads[False].items():
        assert g is not None and grads[True][name] is not None
        assert torch.allclose(g, 3 * grads[True][name], rtol=1e-6)  # type: ignore[operator]


def test_a_parameter_unused_everywhere_keeps_none() -> None:
    # unused_on_rank1 with a single rank 1 only: `extra` never used.
    s = Scenario("t/u", "unused_on_rank1", steps=2)
    record = run_oracle(s, 2, CPU)
    assert record.steps[0].grads["extra.weight"] is not None  # used on rank 0
    ranks_data = [batch(s, r, 0, 0, 2, CPU)[0][1] for r in range(2)]
    assert ranks_data == [True, False]


def test_per_rank_data_differs() -> None:
    s = Scenario("t/mlp", "mlp")
    x0 = batch(s, 0, 0, 0, 2, CPU)[0][0]
    x1 = batch(s, 1, 0, 0, 2, CPU)[0][0]
    assert not torch.equal(x0, x1)
    assert torch.equal(x0, batch(s, 0, 0, 0, 2, CPU)[0][0])  # rebuildable


def test_exact_data_is_dyadic_and_divisible_by_world_size() -> None:
    s = Scenario("t/d", "dyadic", exact=True, batch_size=8)
    for ws in (2, 3, 4):
        record = run_oracle(s, ws, CPU)
        for g in record.steps[0].grads.values():
            assert g is not None
            # Multiples of 1/64: exactly representable with few mantissa bits.
            assert torch.equal(g * 64, torch.round(g * 64))


def test_after_a_join_an_unused_parameter_may_be_none_or_zero_never_anything_else() -> None:
    """Under Join with find_unused_parameters torch's joined rank allreduces its stale used
    map: a parameter no active rank used may get the reduced zeros instead of keeping None."""
    from ddp_conformance.judge.evidence import Evidence
    from ddp_conformance.judge.grads import check_grads
    from ddp_conformance.judge.tolerance import Policy

    s = Scenario("t/moe-join", "moe", steps=2, batch_size=1, seed=244,
                 ddp_options={"find_unused_parameters": True},
                 join=JoinSpec(fewer_steps_per_rank=1, divide_by_initial_world_size=False))
    record = run_oracle(s, 2, CPU)
    assert record.steps[0].zero_or_none == frozenset(), "nobody joined at step 0"
    late = record.steps[1]
    assert late.active == [0] and late.zero_or_none, "an expert unused by rank 0 at step 1"
    name = sorted(late.zero_or_none)[0]
    assert late.grads[name] is None

    def verdict(value: torch.Tensor | None) -> set[str]:
        ev = Evidence()
        grads = {n: g for n, g in late.grads.items()}
        grads[name] = value
        check_grads(ev, "oracle", 1, 0, grads, late.grads, late.grad_scales, Policy(),
                    "the oracle", late.zero_or_none)
        return {f.check for f in ev.failures}

    shape = dict(build_module(s, 0, CPU).named_parameters())[name].shape
    assert verdict(None) == set()
    assert verdict(torch.zeros(shape)) == set()
    assert verdict(torch.full(shape, 1e-3)) == {"oracle.grad_none"}
