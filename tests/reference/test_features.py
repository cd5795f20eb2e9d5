"""The reference DDP's features on real Gloo ranks: error cases and their messages,
Composer's sync-strategy table, Join (divisors, final sync, ZeRO, early termination),
comm hooks, overlap of communication with backward, and gradient bucket views."""
from __future__ import annotations

import pytest
import torch

from tests.deadlines import deadline
from tests.distributed import run_distributed
from tests.reference import feature_workers as fw


@pytest.fixture(scope="module")
def errors() -> list[dict[str, str | None]]:
    return run_distributed(fw.errors, 2)


def test_unknown_arguments_are_type_errors(errors: list[dict[str, str | None]]) -> None:
    """torch 2.13's every keyword is accepted (tests/reference/test_options_surface.py);
    one torch does not take is a TypeError naming it."""
    for per_rank in errors:
        assert per_rank["unsupported"] is None  # mixed_precision=None: torch's default
        assert per_rank["unknown"] is not None and "'not_an_option'" in per_rank["unknown"]


def test_shape_mismatch_raises_on_every_rank(errors: list[dict[str, str | None]]) -> None:
    rank0, rank1 = errors[0]["shape_mismatch"], errors[1]["shape_mismatch"]
    assert rank0 is not None and "rank 1 at params[2] (fc2.weight)" in rank0
    assert rank1 is not None and "[1]: params[2] (fc2.weight)" in rank1
    assert "[33, 32]" in rank1 and "appears not to match" in rank1
    for per_rank in errors:
        count = per_rank["count_mismatch"]
        assert count is not None and "DDP expects same model across all ranks" in count
        assert "rank 0: 6 params" in count and "rank 1: 5 params" in count


def test_unused_parameter_without_flag_raises_like_torch(errors: list[dict[str, str | None]]) -> None:
    for rank, per_rank in enumerate(errors):
        ours, theirs = per_rank["unused_reference"], per_rank["unused_torch"]
        assert ours is not None and theirs is not None
        # Same text up to the parameter listing; torch lists names only in debug mode,
        # the reference always does.
        head = "Parameter indices which did not receive grad"
        assert ours.split("\nParameters which")[0] == theirs.split("\n" + head)[0]
        line = f"{head} for rank {rank}: 4 5"
        assert line in ours and line in theirs
        assert f"did not receive grad for rank {rank}: never.weight, never.bias" in ours


def test_second_comm_hook_raises_like_torch(errors: list[dict[str, str | None]]) -> None:
    for per_rank in errors:
        assert per_rank["second_hook_reference"] == per_rank["second_hook_torch"]
        assert per_rank["second_hook_reference"] is not None


def test_hook_fired_twice_without_static_graph_raises_like_torch(
        errors: list[dict[str, str | None]]) -> None:
    for per_rank in errors:
        ours, theirs = per_rank["twice_reference"], per_rank["twice_torch"]
        assert ours is not None and theirs is not None
        assert ours.split(". ")[0] == theirs.split(". ")[0] == (
            "RuntimeError: Expected to mark a variable ready only once")
        assert "has been marked as ready twice" in ours


def test_constructor_checks(errors: list[dict[str, str | None]]) -> None:
    for per_rank in errors:
        assert (per_rank["cpu_device_ids"] or "").startswith("ValueError: DistributedDataParallel "
                                                             "device_ids and output_device")
        assert "doesn't have any parameter that requires a gradient" in (per_rank["no_grad_params"] or "")


# Composer's tests/trainer/test_ddp_sync_strategy.py, rank 0's gradients after
# microbatch 0, after microbatch 1, and after the last context exits.
COMPOSER_TABLE = {
    "single_auto_sync": [[-1.0, None, None], [-1.5, -1.5, None], [-1.5, -1.5, None]],
    "multi_auto_sync": [[-1.5, None, None], [-1.5, -1.5, None], [-1.5, -1.5, None]],
    "forced_sync": [[-1.0, None, None], [-1.0, -1.0, None], [-1.5, -1.5, None]],
}


def test_sync_strategies_match_composer_table() -> None:
    results = run_distributed(fw.sync_strategies, 2)
    for impl in ("torch", "reference"):
        for strategy, expected in COMPOSER_TABLE.items():
            # Exact: every value is a small dyadic rational.
            assert results[0][f"{impl}/{strategy}"] == expected, (impl, strategy)
            # Rank 1 (local gradient -2) ends with the same synchronised values.
            assert results[1][f"{impl}/{strategy}"][-1] == expected[-1], (impl, strategy)


@pytest.mark.parametrize("world_size", [2, 3])
def test_join_matches_torch(world_size: int) -> None:
    results = run_distributed(fw.join_equivalence, world_size, timeout=deadline(240))
    for rank, per_rank in enumerate(results):
        for key, outcome in per_rank.items():
            assert outcome["diffs"] == [], f"rank {rank} {key}: {outcome['diffs']}"
    # After the join's final broadcast every rank holds the same model.
    for key in results[0]:
        for per_rank in results[1:]:
            assert per_rank[key]["params"] == results[0][key]["params"], key
            assert per_rank[key]["buffers"] == results[0][key]["buffers"], key


@pytest.mark.parametrize("world_size", [2, 3])
def test_join_divisors(world_size: int) -> None:
    # Rank r contributes gradient r+1 for r+1 steps. At step s the active ranks are
    # s..world-1: the sum is sum(r+1 for r >= s); the divisor is the initial world size,
    # or the number of active ranks.
    results = run_distributed(fw.join_divisors, world_size)
    for rank, per_rank in enumerate(results):
        for step in range(rank + 1):
            total = sum(r + 1 for r in range(step, world_size))
            active = world_size - step
            # float32: each term is rounded once when multiplied by 1/divisor and the sum
            # of at most 3 terms rounds twice more, so 4 ulps (float32 eps 1.2e-7) bound
            # the error; a wrong divisor is off by at least 1/3 relative.
            assert per_rank["True"][step] == pytest.approx(total / world_size, rel=5e-7)
            assert per_rank["False"][step] == pytest.approx(total / active, rel=5e-7)


def test_join_throw_on_early_termination_matches_torch() -> None:
    results = run_distributed(fw.join_throw, 2)
    assert results[0]["reference"] == results[0]["torch"] == "RuntimeError: Rank 0 exhausted all inputs."
    assert results[1]["reference"] == results[1]["torch"] == (
        "RuntimeError: Detected at least one rank that exhausted inputs. Throwing across all ranks.")


def test_comm_hooks_match_torch() -> None:
    results = run_distributed(fw.comm_hooks, 2, timeout=deadline(240))
    for rank, per_rank in enumerate(results):
        plain = per_rank["plain"]
        for hook in ("allreduce", "fp16", "powersgd"):
            ours, theirs = per_rank[hook]["reference"], per_rank[hook]["torch"]
            for step, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                for i, (x, y) in enumerate(zip(a, b, strict=True)):
                    assert torch.equal(x, y), f"rank {rank} {hook} step {step} grad {i}"
        # The allreduce hook divides before summing, as the built-in reduction does:
        # identical results (world size 2, exact halving).
        for a, b in zip(per_rank["allreduce"]["reference"], plain, strict=True):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        # fp16 compression really reduced in half precision: close to, but not equal to,
        # the fp32 result (relative error bounded by fp16's 2^-11 per rounding, a few times).
        first16 = per_rank["fp16"]["reference"][0]
        assert any(not torch.equal(x, y) for x, y in zip(first16, plain[0], strict=True))
        for x, y in zip(first16, plain[0], strict=True):
            assert torch.allclose(x, y, rtol=4e-3, atol=1e-6)


def test_overlap_and_gradient_views() -> None:
    for per_rank in run_distributed(fw.overlap_and_views, 2):
        for impl in ("torch", "reference"):
            before_first_layer, total = per_rank[f"overlap/{impl}"]
            # Buckets of the later layers were reduced while backward still had fc1 to do.
            assert 1 <= before_first_layer < total, (impl, before_first_layer, total)
        assert per_rank["overlap/reference"] == per_rank["overlap/torch"]
        assert per_rank["grad_is_bucket_view"] == [True, True, True]
