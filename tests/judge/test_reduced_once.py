"""trace.reduced_once demands one reduction of every gradient defined on some rank."""
from __future__ import annotations

import torch

from ddp_conformance.catalog.loader import load_catalog
from ddp_conformance.catalog.scenario import Accumulate, Scenario
from ddp_conformance.judge.oracle import run_oracle
from ddp_conformance.ranks.tracing import Collective

from .world import bucket_trace, make_world


def params_with_unused() -> dict[str, torch.Tensor]:
    return {"w": torch.ones(3), "extra": torch.ones(2), "never": torch.ones(4)}


def test_a_ddp_skipping_a_globally_unused_parameter_passes() -> None:
    world = make_world(params=params_with_unused(), unused=frozenset({"never"}))
    assert sum(c.numel for c in world.backward_reductions() if c.step == 0) == 5  # w, extra
    assert world.failed() == set()
    figure = next(f for f in world.evidence.figures if f.check == "trace.reduced_once")
    assert figure.passed and figure.detail == "5 of 5 to 9 elements"


def test_torch_reducing_the_unused_parameter_too_passes() -> None:
    params = params_with_unused()
    world = make_world(params=params, unused=frozenset({"never"}))
    world.set_trace(bucket_trace(world.scenario, params, 2))
    assert world.failed() == set()


def test_a_ddp_skipping_a_parameter_used_on_one_rank_fails() -> None:
    params = params_with_unused()
    # `extra` has a local gradient on some rank (rank 0): it is defined, it must be reduced.
    world = make_world(params=params, unused=frozenset({"never"}))
    world.set_trace(bucket_trace(world.scenario, params, 2, skip=frozenset({"never", "extra"})))
    assert world.failed() == {"trace.reduced_once"}
    message = world.messages("trace.reduced_once")[0]
    assert "reduced 3 of the 5 gradient elements defined on some rank (the model has 9" in message


def test_no_sync_window_needs_the_union_of_its_microbatches() -> None:
    scenario = Scenario("judge/no-sync", "mlp", microbatches=2, accumulate=Accumulate.NO_SYNC)
    params = params_with_unused()
    # `extra` is used in the first (no_sync) microbatch only: the synced one still owes it.
    window = [frozenset({"w", "extra"}), frozenset({"w"})]
    world = make_world(scenario, params, unused=frozenset({"never"}), local_grads=window)
    assert world.failed() == set()
    world.set_trace(bucket_trace(scenario, params, 2, skip=frozenset({"never", "extra"})))
    assert world.failed() == {"trace.reduced_once"}
    assert len(world.messages("trace.reduced_once")) == 2 * 2  # both steps, both ranks


def test_every_microbatch_synced_owes_only_its_own_gradients() -> None:
    scenario = Scenario("judge/sync-each", "mlp", microbatches=2)
    params = params_with_unused()
    world = make_world(scenario, params, unused=frozenset({"never"}),
                       local_grads=[frozenset({"w", "extra"}), frozenset({"w"})])
    world.set_trace([Collective(step, mb, "backward", "allreduce", "float32", 5 if mb == 0 else 3,
                                2) for step in range(2) for mb in range(2)])
    assert world.failed() == set()


def test_reducing_twice_is_still_caught() -> None:
    params = params_with_unused()
    world = make_world(params=params, unused=frozenset({"never"}))
    world.set_trace(bucket_trace(world.scenario, params, 2) * 2)  # 18 of at most 9
    assert world.failed() == {"trace.reduced_once"}
    assert "reduced more than once" in world.messages("trace.reduced_once")[0]


def test_partially_reducing_is_still_caught_with_the_old_message() -> None:
    world = make_world()
    world.set_trace([Collective(s, 0, "backward", "allreduce", "float32", 3, 2) for s in range(2)])
    assert world.failed() == {"trace.reduced_once"}
    assert world.messages("trace.reduced_once")[0] == (
        "trace.reduced_once: step 0, microbatch 0, rank 0: backward reduced 3 of the model's 4 "
        "gradient elements (some gradients never synchronised) in 1 collective(s)")


def test_padding_slack_is_kept() -> None:
    world = make_world()
    world.set_trace([Collective(s, 0, "backward", "reduce_scatter", "float32", n, 2)
                     for s in range(2) for n in (2, 3)])  # 5 = 4 + one padding element
    assert world.failed() == set()


def test_an_oracle_without_local_gradients_demands_everything() -> None:
    params = params_with_unused()
    world = make_world(params=params, unused=frozenset({"never"}))
    for step in world.oracle.steps:
        step.local_grads = []
    assert world.failed() == {"trace.reduced_once"}


def test_the_oracle_records_which_gradients_some_rank_produced() -> None:
    scenario = {s.id: s for s in load_catalog()}["unused/always-and-alternate"]
    oracle = run_oracle(scenario, 2, torch.device("cpu"), threads=1)
    defined = [step.local_grads for step in oracle.steps]
    assert all(len(mbs) == scenario.microbatches for mbs in defined)
    names = set(oracle.initial_params)
    never = {n for n in names if n.startswith("never.")}
    alternate = {n for n in names if n.startswith("alternate.")}
    assert never and alternate
    for step, (mb,) in enumerate(defined):
        assert not mb & never
        assert (alternate <= mb) if step % 2 == 0 else not (mb & alternate)
        assert {n for n in names if n.startswith("body.")} <= mb
