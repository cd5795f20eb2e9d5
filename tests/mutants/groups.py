"""Mutants of the process group a DDP communicates on."""
from __future__ import annotations

import torch.distributed as dist

from ._base import MutantDDP


class ReducesOnWorldGroup(MutantDDP):
    """Reduces gradients on the default (world) group instead of the process_group it was given (collectives
    called without group=, world size from dist.get_world_size())."""

    def mutate(self) -> None:
        self.reducer.process_group = dist.distributed_c10d._get_default_group()
