"""Mutants of what DDP synchronises outside the gradients: no_sync, buffers, init sync."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from ddp_reference import collectives

from ._base import MutantDDP

# --- no_sync ----------------------------------------------------------------------------------


class NoSyncIgnored(MutantDDP):
    """Its no_sync() is a no-op: every microbatch synchronises anyway (values right, traffic wasted: wrappers
    that accept no_sync for API compatibility only)."""

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        yield


class NoSyncLeaks(MutantDDP):
    """no_sync() disables gradient sync and never restores the flag, so the microbatch meant to sync does not
    (a context manager without the restore)."""

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        self.require_backward_grad_sync = False
        yield


# --- buffers ----------------------------------------------------------------------------------


class NeverBroadcastsBuffers(MutantDDP):
    """Accepts broadcast_buffers=True and never broadcasts: BatchNorm statistics drift apart per rank."""

    def will_sync_module_buffers(self) -> bool:
        return False


class BroadcastsBuffersFromLastRank(MutantDDP):
    """Broadcasts buffers from the last rank instead of rank 0 (a root rank taken as world_size - 1, or a
    global rank used where a group rank is meant)."""

    def _sync_buffers(self) -> None:
        if self._join_config.enable:
            super()._sync_buffers()
            return
        with torch.no_grad():
            self._assign_modules_buffers()
            with torch.autograd._unsafe_preserve_version_counter(tuple(self.modules_buffers)):
                collectives.broadcast_coalesced(self.process_group, self.modules_buffers,
                                                self.process_group.size() - 1)


class BroadcastsBuffersAtEveryForward(MutantDDP):
    """Broadcasts buffers before every forward, also after a no_sync forward (DDP skips it there: it decides
    from the previous forward's sync)."""

    def will_sync_module_buffers(self) -> bool:
        return self.broadcast_buffers and len(self.modules_buffers) > 0


class IgnoresBroadcastBuffersFalse(MutantDDP):
    """Ignores broadcast_buffers=False and broadcasts rank 0's buffers anyway (an option accepted and
    dropped)."""

    @classmethod
    def options(cls, opts: dict[str, Any]) -> dict[str, Any]:
        return dict(opts, broadcast_buffers=True)


# --- init sync --------------------------------------------------------------------------------


class NoInitSync(MutantDDP):
    """Skips the initial broadcast of parameters: ranks keep their own random initial weights (wrappers that
    assume every rank seeded identically)."""

    @classmethod
    def options(cls, opts: dict[str, Any]) -> dict[str, Any]:
        return dict(opts, init_sync=False)


class InitSyncFromLastRank(MutantDDP):
    """Broadcasts the initial parameters from the last rank instead of rank 0 (a wrong root in the
    constructor's sync)."""

    def _sync_module_states(self, src: int, with_buffers: bool) -> None:
        if getattr(self, "_constructing", False):
            src = self.process_group.size() - 1
        super()._sync_module_states(src, with_buffers)
