"""Checks of what the machine can run, before any rank starts (exit 2 on failure)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .errors import UsageError

BACKENDS = ("gloo", "nccl")
DEVICES = ("cpu", "cuda")


def validate(backend: str, device: str, world_size: int) -> str:
    """Raise :class:`UsageError` unless ``world_size`` ranks can run here; return the device.

    ``--backend nccl`` puts rank r on ``cuda:r`` and so needs one GPU per rank; Gloo with
    ``--device cuda`` lets ranks share one GPU.
    """
    if world_size < 1:
        raise UsageError(f"--world-size must be at least 1, got {world_size}")
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if not dist.is_available():
        raise UsageError("this torch build has no torch.distributed support")
    if backend == "nccl":
        device = "cuda"
        if not dist.is_nccl_available():
            raise UsageError("backend nccl is not available: this torch build has no NCCL "
                             f"(torch {torch.__version__}, CUDA available: "
                             f"{torch.cuda.is_available()})")
        gpus = torch.cuda.device_count()
        if gpus < world_size:
            raise UsageError(f"backend nccl needs one GPU per rank: {world_size} ranks, "
                             f"{gpus} GPU(s) visible")
    elif not dist.is_gloo_available():
        raise UsageError("backend gloo is not available in this torch build")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available on this machine")
    return device
