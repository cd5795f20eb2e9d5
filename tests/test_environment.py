"""Environment checks before any rank starts: NCCL needs a GPU per (local) rank."""
from __future__ import annotations

import pytest
import torch

from ddp_conformance.errors import UsageError
from ddp_conformance.ranks.environment import validate


def test_gloo_cpu_is_always_fine() -> None:
    assert validate("gloo", "cpu", 3) == "cpu"


@pytest.mark.parametrize("bad", [("gloo", "cpu", 0), ("mpi", "cpu", 2), ("gloo", "tpu", 2)])
def test_bad_usage_is_one_line(bad: tuple[str, str, int]) -> None:
    with pytest.raises(UsageError) as info:
        validate(*bad)
    assert "\n" not in str(info.value)


def test_nccl_with_fewer_gpus_than_ranks_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(UsageError, match=r"needs one GPU per rank: 2 ranks, 1 GPU\(s\) visible"):
        validate("nccl", "cpu", 2)


def test_nccl_under_torchrun_counts_this_nodes_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert validate("nccl", "cpu", 8, local_world_size=2) == "cuda"
    with pytest.raises(UsageError, match="4 ranks on this node, 2 GPU"):
        validate("nccl", "cpu", 8, local_world_size=4)


def test_nccl_without_nccl_build_stops() -> None:
    if torch.distributed.is_nccl_available():
        pytest.skip("this torch has NCCL")
    with pytest.raises(UsageError, match="backend nccl is not available"):
        validate("nccl", "cpu", 2)


def test_cli_exit_2_for_nccl_without_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.device_count() >= 2:
        pytest.skip("enough GPUs here")
    from ddp_conformance.cli import main

    assert main(["run", "--backend", "nccl", "--world-size", "2", "--report-dir", "/tmp/unused"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nccl" in err[0]


@pytest.mark.gpu
def test_gloo_with_cuda_tensors_shares_one_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    assert validate("gloo", "cuda", 4) == "cuda"


@pytest.mark.gpu
def test_nccl_run_on_gpus() -> None:
    if torch.cuda.device_count() < 2 or not torch.distributed.is_nccl_available():
        pytest.skip("needs 2 GPUs and NCCL")
    from ddp_conformance.cli import main

    assert main(["run", "--backend", "nccl", "--world-size", "2", "-k", "gradients",
                 "--report-dir", "/tmp/ddpc-nccl"]) == 0
