"""Mutants of the Join protocol (uneven inputs)."""
from __future__ import annotations

from typing import Any

import torch
from ddp_reference import collectives
from ddp_reference.join import DDPJoinHook
from torch.distributed.algorithms.join import JoinHook

from ._base import MutantDDP


class JoinHookShadowsNothing(MutantDDP):
    """Its join hook shadows none of the active ranks' collectives: the active ranks wait for a joined rank
    that never answers (a Joinable whose hook was left empty)."""

    def join_hook(self, **kwargs: Any) -> JoinHook:
        self._divide_by_initial_world_size = kwargs.get("divide_by_initial_world_size", True)
        return JoinHook()


class JoinIgnoresDivideByInitialWorldSize(MutantDDP):
    """Ignores divide_by_initial_world_size=False: always divides by the initial world size, never by the
    number of ranks still active."""

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return DDPJoinHook(self, True)


class _NoFinalSyncHook(DDPJoinHook):
    def post_hook(self, is_last_joiner: bool) -> None:
        pass


class JoinSkipsFinalModelSync(MutantDDP):
    """Skips the final parameter broadcast from the last joiner when Join exits: ranks that joined early keep
    stale weights."""

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _NoFinalSyncHook(self, kwargs.get("divide_by_initial_world_size", True))


class JoinBroadcastsBuffersFromRankZero(MutantDDP):
    """Under Join, broadcasts buffers from rank 0 instead of the highest active rank (torch's authoritative
    rank): the rank-0 habit kept where ranks may have left."""

    def _sync_buffers(self) -> None:
        if not self._join_config.enable:
            super()._sync_buffers()
            return
        with torch.no_grad():
            collectives.find_common_rank(self.process_group, self.device,
                                         self._distributed_rank, True)  # agreed, then ignored
            self._assign_modules_buffers()
            with torch.autograd._unsafe_preserve_version_counter(tuple(self.modules_buffers)):
                collectives.broadcast_coalesced(self.process_group, self.modules_buffers, 0)
