"""Checks of what the machine can run, before any rank starts (exit 2 on failure)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_conformance.contract.backend import resolve_backend
from ddp_conformance.errors import UsageError

DEVICES = ("cpu", "cuda")


def validate(backend: str, device: str, world_size: int,
             local_world_size: int | None = None) -> str:
    """Raise :class:`UsageError` unless ``world_size`` ranks can run here; return the device.

    ``--backend nccl`` puts rank r on ``cuda:r`` (``cuda:LOCAL_RANK`` under torchrun) and
    so needs one GPU per rank *on this machine*: ``local_world_size`` of them under
    torchrun (``LOCAL_WORLD_SIZE``), all ``world_size`` otherwise. Gloo with
    ``--device cuda`` lets ranks share one GPU. A custom backend (``MODULE:NAME``, see
    :mod:`ddp_conformance.contract.backend`) runs on the device types it registered: one
    that serves CUDA only implies ``--device cuda``, as NCCL does.
    """
    if world_size < 1:
        raise UsageError(f"--world-size must be at least 1, got {world_size}")
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if not dist.is_available():
        raise UsageError("this torch build has no torch.distributed support")
    spec = resolve_backend(backend)
    if spec.custom:
        if device not in spec.devices and device == "cpu" and "cuda" in spec.devices:
            device = "cuda"
        if device not in spec.devices:
            raise UsageError(f"backend {spec.name} does not serve --device {device} (it "
                             f"registered devices: {', '.join(spec.devices) or 'none'})")
    backend = spec.name
    if backend == "nccl":
        device = "cuda"
        if not dist.is_nccl_available():
            raise UsageError("backend nccl is not available: this torch build has no NCCL "
                             f"(torch {torch.__version__}, CUDA available: "
                             f"{torch.cuda.is_available()})")
        gpus = torch.cuda.device_count()
        local = world_size if local_world_size is None else local_world_size
        if gpus < local:
            where = "" if local_world_size is None else " on this node"
            raise UsageError(f"backend nccl needs one GPU per rank: {local} ranks{where}, "
                             f"{gpus} GPU(s) visible")
    elif backend == "gloo" and not dist.is_gloo_available():
        raise UsageError("backend gloo is not available in this torch build")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available on this machine")
    return device
