"""Which device each rank uses: one rule for the rank pool and for torchrun.

A rank's GPU is its *local* rank (its index among the ranks of its machine: the rank itself
in the pool, ``LOCAL_RANK`` under torchrun) modulo the GPUs it sees. With NCCL,
:func:`~ddp_conformance.ranks.environment.validate` has already required one visible GPU
per local rank, so the modulo never wraps and every rank of a machine has a GPU of its own
(8 ranks per node on 8 GPUs: ``cuda:0`` to ``cuda:7`` on every node). With Gloo on CUDA
(``--device cuda``) ranks may share: 2 ranks on 1 GPU both use ``cuda:0``. A rank pins its
device (``torch.cuda.set_device``) before anything touches CUDA, so its context, NCCL's
communicator and DDP's ``device_ids`` all agree.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def cuda_index(local_rank: int, visible_gpus: int) -> int:
    """The GPU of the rank with ``local_rank`` on a machine where it sees ``visible_gpus``."""
    if visible_gpus < 1:
        raise ValueError("no CUDA device is visible")
    return local_rank % visible_gpus


def pin_device(device: str, local_rank: int) -> torch.device:
    """This rank's device, pinned now if it is a GPU (see the module docstring)."""
    if device != "cuda":
        return torch.device("cpu")
    index = cuda_index(local_rank, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


@dataclass(frozen=True)
class Placement:
    rank: int
    node: int
    local_rank: int
    device: str


def plan(world_size: int, ranks_per_node: int, gpus_per_node: int, device: str) -> list[Placement]:
    """Where every rank of a job runs, when torchrun starts ``ranks_per_node`` ranks on each
    node (ranks numbered node by node, as torchrun's static rendezvous does)."""
    out = []
    for rank in range(world_size):
        node, local = divmod(rank, ranks_per_node)
        where = f"cuda:{cuda_index(local, gpus_per_node)}" if device == "cuda" else "cpu"
        out.append(Placement(rank, node, local, where))
    return out
