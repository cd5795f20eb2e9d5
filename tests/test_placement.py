"""Device placement at scale, without a GPU: 8 GPUs per node under torchrun, Gloo ranks
sharing one GPU, and the per-node GPU check (torch's CUDA queries are stubbed: only the
harness's placement rule is under test here, no collective runs)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ddp_conformance.errors import UsageError
from ddp_conformance.ranks import placement
from ddp_conformance.ranks.environment import validate
from ddp_conformance.ranks.placement import Placement, cuda_index, pin_device, plan


def test_eight_gpus_per_node_each_rank_its_own_gpu() -> None:
    ranks = plan(world_size=16, ranks_per_node=8, gpus_per_node=8, device="cuda")
    assert ranks[0] == Placement(0, 0, 0, "cuda:0")
    assert ranks[15] == Placement(15, 1, 7, "cuda:7")
    for node in (0, 1):
        on_node = [p.device for p in ranks if p.node == node]
        assert on_node == [f"cuda:{i}" for i in range(8)], "one GPU per rank on every node"


def test_gloo_ranks_share_a_gpu_and_cpu_ranks_have_none() -> None:
    assert [p.device for p in plan(2, 2, 1, "cuda")] == ["cuda:0", "cuda:0"]
    assert [p.device for p in plan(3, 3, 2, "cuda")] == ["cuda:0", "cuda:1", "cuda:0"]
    assert {p.device for p in plan(4, 4, 0, "cpu")} == {"cpu"}
    with pytest.raises(ValueError, match="no CUDA device"):
        cuda_index(0, 0)


def test_a_rank_pins_its_device_before_using_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned: list[int] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", pinned.append)
    assert pin_device("cuda", 5) == torch.device("cuda", 1) and pinned == [1]
    assert pin_device("cpu", 5) == torch.device("cpu") and pinned == [1]


@pytest.fixture
def eight_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.usefixtures("eight_gpus")
def test_nccl_needs_one_gpu_per_rank_of_the_node() -> None:
    # torchrun, 2 nodes x 8 ranks, 8 GPUs each: fine; NCCL implies CUDA.
    assert validate("nccl", "cpu", 16, local_world_size=8) == "cuda"
    with pytest.raises(UsageError, match=r"^backend nccl needs one GPU per rank: 16 ranks on "
                                         r"this node, 8 GPU\(s\) visible$"):
        validate("nccl", "cuda", 16, local_world_size=16)
    # The rank pool puts every rank on this machine.
    assert validate("nccl", "cuda", 8) == "cuda"
    with pytest.raises(UsageError, match="9 ranks, 8 GPU"):
        validate("nccl", "cuda", 9)
    # Gloo on CUDA: any number of ranks share the GPUs.
    assert validate("gloo", "cuda", 16) == "cuda"


def test_pool_and_torchrun_place_by_the_same_rule() -> None:
    """Both transports call pin_device (one rule), with the rank or LOCAL_RANK."""
    import inspect

    from ddp_conformance.ranks import torchrun, worker

    assert "pin_device(" in inspect.getsource(worker.serve)
    assert "pin_device(" in inspect.getsource(torchrun._device)
    assert placement.pin_device is pin_device


def test_both_transports_pay_cuda_start_up_after_pinning_and_before_any_job() -> None:
    """The pool's worker and torchrun's member each pin the device, then warm it up (CUDA
    context, a kernel), before they take a job: no case's deadline pays CUDA start-up."""
    import inspect

    from ddp_conformance.ranks import torchrun, worker

    for source in (inspect.getsource(worker.serve), inspect.getsource(torchrun._Member)):
        pin = max(source.find("pin_device("), source.find("= _device("))  # torchrun's wraps it
        warm = source.find("warm_up(")
        assert 0 <= pin < warm, source
        assert "Ready(" not in source or warm < source.find("Ready(")
