"""torch 2.13 DDP's surface beyond training steps, on real Gloo ranks: the reference
against torch's DDP, bitwise."""
from __future__ import annotations

import torch

from tests.distributed import run_distributed
from tests.reference import surface_workers as sw


def test_pickle_deepcopy_and_torch_save_keep_training_like_torch() -> None:
    for rank_out in run_distributed(sw.copies_train_on, 2):
        for how in sw.COPIES:
            ours, theirs = rank_out[f"reference/{how}"], rank_out[f"torch/{how}"]
            assert ours[2] == "DistributedDataParallel"
            for ours_step, theirs_step in zip(ours[0] + ours[1], theirs[0] + theirs[1],
                                              strict=True):
                for a, b in zip(ours_step, theirs_step, strict=True):
                    assert torch.equal(a, b), how


def test_copies_keep_reducing() -> None:
    """After the copy the ranks' parameters stay equal although their data differ: the
    copy still reduces (a copy without a reducer would drift apart)."""
    ranks = run_distributed(sw.copies_train_on, 2)
    for key in ranks[0]:
        for a, b in zip(ranks[0][key][1][-1], ranks[1][key][1][-1], strict=True):
            assert torch.equal(a, b), key


def test_pickling_on_another_group_is_refused_like_torch() -> None:
    for rank_out in run_distributed(sw.copy_on_a_subgroup, 2):
        assert rank_out["reference"] is not None
        assert rank_out["reference"] == rank_out["torch"]


def test_backward_with_create_graph_like_torch() -> None:
    for rank_out in run_distributed(sw.create_graph, 2):
        ours, theirs = rank_out["reference"], rank_out["torch"]
        assert torch.equal(ours[0], theirs[0])
        # 6 backwards of d/dp (r+1) p^2 = 2 (r+1) at p = 1, averaged over 2 ranks: 3 each.
        assert ours[0].item() == 18.0
        assert ours[1:] == theirs[1:] == [True, True]


def test_set_static_graph_twice_warns_and_after_training_raises_like_torch() -> None:
    for rank_out in run_distributed(sw.static_graph_calls, 2):
        ours, theirs = rank_out["reference"], rank_out["torch"]
        assert ours[0] == theirs[0] and len(ours[0]) == 1
        assert ours[1] is not None and theirs[1] is not None
        assert "should be called before training loop starts" in ours[1]
        assert "should be called before training loop starts" in theirs[1]
