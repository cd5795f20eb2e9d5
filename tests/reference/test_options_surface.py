"""torch 2.13 DDP's whole constructor and method surface, on 2 real Gloo ranks: the
reference against torch's DDP step by step, bitwise (mixed precision, which torch cannot
run on CPU, against a hand computation)."""
from __future__ import annotations

import inspect
from typing import Any

import ddp_reference
import pytest
import torch
from torch import nn

from tests.distributed import run_distributed
from tests.reference import options_workers as ow


def _same(ranks: list[dict[str, Any]]) -> None:
    for per_rank in ranks:
        assert not ow._diff(per_rank["torch"], per_rank["reference"])


def test_signature_is_torchs() -> None:
    ours = inspect.signature(ddp_reference.DistributedDataParallel.__init__).parameters
    theirs = inspect.signature(nn.parallel.DistributedDataParallel.__init__).parameters
    assert list(ours) == list(theirs)
    assert [p.default for p in ours.values()] == [p.default for p in theirs.values()]
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for n, p in ours.items() if n != "self")


@pytest.fixture(scope="module")
def constructor() -> list[dict[str, Any]]:
    return run_distributed(ow.constructor_options, 2)


def test_buffer_options_warnings_and_init_sync_like_torch(constructor: list[dict[str, Any]]) -> None:
    _same(constructor)
    rank1 = constructor[1]["reference"]
    # forward_sync_buffers given: buffers synced at init whatever its value.
    assert rank1["fwd_false"]["running_mean"].eq(0).all()
    assert rank1["both_false"]["running_mean"].eq(0).all()
    assert rank1["bcast_false"]["running_mean"].eq(1).all()  # not synced at init
    assert rank1["both"]["forward_sync_buffers"] is True  # forward_sync_buffers wins
    assert [c for c, _ in rank1["bcast_false"]["warnings"]] == ["FutureWarning"]
    assert "Both `broadcast_buffers`" in rank1["both"]["warnings"][0][1]
    assert rank1["default"]["warnings"] == []


def test_check_reduction_dim_positional_and_cap_list_like_torch(
        constructor: list[dict[str, Any]]) -> None:
    rank0 = constructor[0]["reference"]
    assert rank0["check_reduction"]["dim"] == 1
    assert any("check_reduction" in m for _, m in rank0["check_reduction"]["warnings"])
    assert rank0["positional"] == [2, False, int(0.001 * 1024 * 1024)]
    assert rank0["cap_list"] == [int(0.003 * 1024 * 1024),
                                 [int(0.001 * 1024 * 1024), int(0.003 * 1024 * 1024)]]
    assert rank0["delay_without_hook"].startswith("ValueError: delay_all_reduce_named_params")
    assert rank0["hook_without_delay"] == rank0["delay_without_hook"]


def test_device_mesh_like_torch() -> None:
    ranks = run_distributed(ow.device_mesh_options, 2)
    _same(ranks)
    ours = ranks[0]["reference"]
    assert ours["same_group"] is True and ours["mesh_kept"] is True
    assert ours["both"] == "RuntimeError: Cannot specify both process_group and device_mesh arguments."
    assert ours["2d"].startswith("RuntimeError: Only 1D device mesh is supported")


@pytest.mark.parametrize("names", [["cap_list", "cap_list_find_unused", "cap_list_static"],
                                   ["skip_unused", "skip_unused_one_bucket", "skip_unused_static"],
                                   ["batched", "batched_grad_view", "batched_find_unused",
                                    "batched_static"],
                                   ["fwd_sync_off", "fwd_sync_on_bcast_off"]], ids=lambda n: n[0])
def test_training_options_like_torch(names: list[str]) -> None:
    """Layouts, collectives, gradients, parameters and buffers, every step."""
    for per_rank in run_distributed(ow.compare_specs, 2, names):
        assert per_rank == {name: [] for name in names}


def test_batched_grad_copy_divides_the_flat_bucket_like_torch_on_3_ranks() -> None:
    """With 3 ranks ``x / 3`` and ``x * (1/3)`` differ in the last bit: batched copies
    divide (``div_``), unbatched ones multiply by the reciprocal."""
    names = ["batched", "batched_grad_view", "batched_static"]
    for per_rank in run_distributed(ow.compare_specs, 3, names):
        assert per_rank == {name: [] for name in names}


def test_cap_list_layouts_like_torch() -> None:
    ranks = run_distributed(ow.layouts, 2)
    _same(ranks)
    initial, rebuilt = ranks[0]["reference"]
    assert len(initial.split(", ")) > 1 and len(rebuilt.split(", ")) > 1


def test_skip_all_reduce_unused_issues_no_allreduce_for_them() -> None:
    """The spec's collectives equal torch's (checked above); here: skipping is visible."""
    spec = ow.SPECS["skip_unused"]
    ranks = run_distributed(_skip_traces, 2)
    for per_rank in ranks:
        with_skip, without = per_rank
        assert len(with_skip) < len(without), spec


def _skip_traces(rank: int, world_size: int) -> list[list[Any]]:
    out = []
    for skip in (True, False):
        spec = ow.Spec("unused", {**ow.SPECS["skip_unused"].kwargs,
                                  "skip_all_reduce_unused_params": skip}, steps=2)
        record = ow.run_spec(rank, "torch", spec)
        out.append([c for s in record["steps"] for c in s["trace"]])
    return out


@pytest.mark.parametrize("names", [["allreduce", "fp16_compress", "fp16_wrapper", "noop"],
                                   ["powerSGD"], ["post_localSGD"]],
                         ids=lambda n: n[0])
def test_torch_comm_hook_modules_like_torch(names: list[str]) -> None:
    for per_rank in run_distributed(ow.comm_hooks, 2, names):
        assert per_rank == {name: [] for name in names}


def test_batched_powersgd_fails_in_torch_and_the_reference_alike() -> None:
    for per_rank in run_distributed(ow.batched_powersgd_errors, 2):
        assert per_rank["torch"] is not None and per_rank["torch"].startswith("AssertionError")
        assert per_rank["reference"] == per_rank["torch"]


def test_builtin_comm_hooks_like_torch() -> None:
    for per_rank in run_distributed(ow.builtin_hooks, 2):
        assert all(d == [] for d in per_rank.values()) and len(per_rank) == 2


def test_second_comm_hook_refused_like_torch() -> None:
    ranks = run_distributed(ow.hook_twice, 2)
    _same(ranks)
    assert all(e is not None and "can only be called once" in e for e in ranks[0]["reference"])


def test_fused_optimizer_like_torch() -> None:
    for per_rank in run_distributed(ow.fused_optim, 2):
        assert per_rank == {"sgd": [], "adam_subset": []}


def test_buffer_comm_hooks_like_torch() -> None:
    for per_rank in run_distributed(ow.buffer_hooks, 2):
        assert per_rank == {"post_futures": [], "pre_sync": []}


def test_buffer_hook_futures_awaited_at_end_of_backward_like_torch() -> None:
    for per_rank in run_distributed(ow.buffer_futures_awaited, 2):
        assert per_rank == {"torch": [True, True], "reference": [True, True]}


def test_update_process_group_like_torch() -> None:
    for per_rank in run_distributed(ow.update_group, 2):
        assert per_rank == []


def test_delayed_allreduce_like_torch() -> None:
    for per_rank in run_distributed(ow.delayed, 2):
        assert per_rank == {"some": [], "all": [], "all_without_frozen": []}


def test_mixed_precision_constructor_like_torch() -> None:
    ranks = run_distributed(ow.mixed_precision_constructor, 2)
    for per_rank in ranks:
        theirs = dict(per_rank["torch"])
        assert "doesn't support events" in (theirs.pop("forward") or "")
        assert not ow._diff(theirs, per_rank["reference"])
    ours = ranks[0]["reference"]
    assert set(ours["buffers"]) == {torch.bfloat16}  # num_batches_tracked too, as torch
    assert set(ours["params"]) == {torch.float32}


@pytest.mark.parametrize("dtypes", [(torch.float16, torch.float32), (torch.float16, None),
                                    (torch.bfloat16, torch.float16)], ids=str)
def test_mixed_precision_training_on_cpu(dtypes: tuple[torch.dtype, torch.dtype | None]) -> None:
    ranks = run_distributed(ow.mixed_precision_training, 2, *dtypes)
    for per_rank in ranks:
        assert per_rank["diffs"] == []
        assert set(per_rank["forward_dtypes"]) == {dtypes[0]}
    for a, b in zip(ranks[0]["replicas_equal"], ranks[1]["replicas_equal"], strict=True):
        assert torch.equal(a, b)


def test_misc_surface_like_torch() -> None:
    ranks = run_distributed(ow.misc_surface, 2)
    ours = ranks[0]["reference"]
    for per_rank in ranks:
        # The reference names the parameters in the error where torch (debug off) only
        # gives indices; the common head must match.
        theirs, mine = (per_rank[k].pop("not_finalized").split("\n")[0]
                        for k in ("torch", "reference"))
        assert theirs == mine
        assert mine.startswith("RuntimeError: Expected to have finished")
    _same(ranks)
    assert ours["keys"][0].startswith("module.")
    assert ours["finalized"] is None and ours["no_hooks_next"] is None
    assert ours["sink_clone_True"] is False and ours["sink_clone_False"] is True
    assert not torch.equal(ranks[0]["reference"]["no_hooks_grads"][0],
                           ranks[1]["reference"]["no_hooks_grads"][0])


def test_deleting_the_wrapper_releases_the_module_like_torch() -> None:
    ranks = run_distributed(ow.delete_wrapper, 2)
    _same(ranks)
    for per_rank in ranks:
        assert per_rank["reference"]["trace"] == []
    assert not torch.equal(ranks[0]["reference"]["grads"][0], ranks[1]["reference"]["grads"][0])


def test_hooks_torch_itself_cannot_run_on_gloo_cpu() -> None:
    """Confirmed only: quantization and bf16 hooks fail under torch's own DDP here."""
    for per_rank in run_distributed(ow.quantization_and_bf16_under_torch, 2):
        assert all(err is not None for err in per_rank.values()), per_rank


@pytest.mark.parametrize("grad_view", [False, True])
def test_optimizer_in_backward_on_cpu(grad_view: bool) -> None:
    for per_rank in run_distributed(ow.optimizer_in_backward, 2, grad_view):
        assert "accelerator" in (per_rank["torch_on_cpu"] or "")
        for step in per_rank["steps"]:
            assert step["params"] == [] and all(step["grads"])


@pytest.mark.parametrize("case", [(torch.float16, torch.float32, None, "mlp"),
                                  (torch.float16, None, None, "mlp"),
                                  (torch.bfloat16, torch.float16, torch.bfloat16, "convbn")],
                         ids=str)
def test_mixed_precision_like_torch_with_its_cpu_obstacles_stubbed(case: tuple[Any, ...]) -> None:
    """torch's mixed precision only fails on CPU for want of events and an accelerator
    stream; with those stubbed (no-ops on one CPU stream) it runs, and the reference
    matches it step by step, bitwise."""
    for per_rank in run_distributed(ow.mixed_precision_vs_torch, 2, *case):
        assert per_rank == []


@pytest.mark.parametrize("grad_view", [False, True])
def test_optimizer_in_backward_like_torch_with_its_stream_stubbed(grad_view: bool) -> None:
    for per_rank in run_distributed(ow.optimizer_in_backward_vs_torch, 2, grad_view):
        assert per_rank == []
