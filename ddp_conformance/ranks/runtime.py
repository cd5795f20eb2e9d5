"""The one procedure a rank follows for a job, whichever transport brought the job.

The rank pool's worker (:mod:`ddp_conformance.ranks.worker`) and torchrun mode
(:mod:`ddp_conformance.ranks.torchrun`) both hand each job to :meth:`RankRuntime.execute`
and only carry the answer back. Per job:

1. **reset**: seeded RNGs, grad mode on, float32 default dtype;
2. **groups**: a fresh default process group over the transport's store, under a
   job-unique prefix, through the tracing backend when the job asks for it; its backend
   (the communicator) is the previous job's when the parent names the same generation
   (:mod:`~ddp_conformance.ranks.communicator`);
3. **run**: call the job's function, or run the scenario with the candidate (resolved
   once per process);
4. **collect, then destroy**: the job's objects are collected while its groups still
   live (a candidate object that still holds work on a group, replicate's reducer, must be
   finalised while its peers can complete it), the default group's state is read (for
   the parent's decision to keep the communicator), then the groups are destroyed, and kept
   referenced until the next job's cleanup (see :meth:`RankRuntime.cleanup`), which hands
   them to a background thread that lets them go
   (:class:`~ddp_conformance.ranks.reaper.GroupReaper`).

The cleanup is part of the job, done before answering, so a finalizer that hangs or
aborts is charged to the job that left it, within its deadline. When the job raised, the
caller decides: a rank whose failure only echoes a peer's cleans up and stays; one that
failed itself leaves the pool (its exit closes its connections, releasing peers blocked
in a collective with it), or, under torchrun, cleans up as best it can.
"""
from __future__ import annotations

import gc
import importlib
import random
import traceback
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ddp_conformance.ranks.communicator import COMMUNICATORS, CommState
from ddp_conformance.ranks.messages import Answer, Done, Job, Raised
from ddp_conformance.ranks.reaper import GroupReaper
from ddp_conformance.ranks.tracing import TracingProcessGroup, traced_backend


def resolve_function(ref: str) -> Callable[..., Any]:
    """``package.module:qualname`` to the function it names."""
    module_name, _, qualname = ref.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj  # type: ignore[no-any-return]


class RankRuntime:
    """One rank's state across jobs: where it is, the store, resolved candidates."""

    def __init__(self, rank: int, world_size: int, backend: str, device: torch.device,
                 store: dist.Store) -> None:
        from ddp_conformance.contract.backend import resolve_backend

        self.rank = rank
        self.world_size = world_size
        #: The registered name (``MODULE:NAME`` imports MODULE here, which registers it).
        self.backend = resolve_backend(backend).name
        self.device = device
        self.store = store
        self.candidates: dict[str, Any] = {}
        self._retired_groups: list[Any] = []
        self._reaper = GroupReaper()

    def execute(self, job: Job) -> Answer:
        """Run ``job`` on this rank (steps 1-4 of the module docstring).

        On success the job's groups are already destroyed; on :class:`Raised` they are
        not (the caller decides, see the module docstring).
        """
        self.reset(job.seed)
        try:
            self._reaper.retire([COMMUNICATORS.arm(job.communicator, self.backend,
                                                   job.collective_timeout_s)], shut_down=True)
            dist.init_process_group(
                traced_backend(self.backend) if job.trace else self.backend,
                store=dist.PrefixStore(job.store_prefix, self.store), rank=self.rank,
                world_size=self.world_size, timeout=timedelta(seconds=job.collective_timeout_s))
            result = self.run(job)
            state = self.cleanup()
        except BaseException:  # noqa: BLE001 - every failure is reported, none kills the rank
            return Raised(self.rank, traceback.format_exc())
        return Done(self.rank, result, state if job.communicator else None)

    @staticmethod
    def reset(seed: int) -> None:
        random.seed(seed)
        torch.manual_seed(seed)
        torch.set_grad_enabled(True)
        torch.set_default_dtype(torch.float32)

    def preload(self, specs: list[str]) -> None:
        """Resolve ``specs`` now, before any job (importing a framework takes seconds:
        ``pytorch_lightning`` 2.5-3.3 s here), so that no case's deadline pays it. A
        candidate that fails to resolve is left to fail in its job, with its traceback."""
        from ddp_conformance.contract.registry import resolve_candidate

        for spec in specs:
            try:
                self.candidates[spec] = resolve_candidate(spec)
            except Exception:  # noqa: BLE001 - reported by the job that needs it
                pass

    def run(self, job: Job) -> Any:
        """What a rank does for one job, in the default group already initialised: call the
        function, or run the scenario with the candidate (resolved once per process)."""
        if job.kind == "call":
            return resolve_function(job.function)(self.rank, self.world_size, *job.args)
        from ddp_conformance.contract.registry import resolve_candidate
        from ddp_conformance.ranks.engine import run_scenario

        candidate = self.candidates.get(job.candidate)
        if candidate is None:
            candidate = self.candidates[job.candidate] = resolve_candidate(job.candidate)
        assert job.scenario is not None
        return run_scenario(job.scenario, candidate, self.rank, self.world_size, self.device,
                            dist.group.WORLD)

    def cleanup(self) -> CommState | None:
        """Collect the job's objects while its groups still live, then destroy the groups;
        return the default group's state if it is a tracing group over a kept communicator.

        The destroyed groups are kept until the next job's cleanup. A future callback
        (PowerSGD's hook captures its group) is released by the Gloo thread that ran it,
        a moment after the future completed; were that the group's last reference, the
        group would be destroyed on its own worker thread, which joins itself and aborts
        the process ("Resource deadlock avoided", 1 job in 7 of the PowerSGD tests).
        Held here for a job, the last reference is then dropped on the reaper's thread,
        never a backend's, while the next job runs.
        """
        gc.collect(1)
        self._reaper.retire(self._retired_groups)
        self._retired_groups = []
        state = None
        if dist.is_initialized():
            world = dist.group.WORLD
            if isinstance(world, TracingProcessGroup) and world.pooled:
                state = world.state()
            self._retired_groups = list(dist.distributed_c10d._world.pg_map)
            dist.destroy_process_group()
        return state

    def cleaned_up(self) -> bool:
        """:meth:`cleanup`, for a caller that wants to know it finished: True."""
        self.cleanup()
        return True

    def release(self) -> bool:
        """After this rank raised: destroy the job's groups *and* let them go, so that their
        connections close and peers blocked in a collective with this rank are released at
        once (Gloo's ``abort`` does not close them; the last reference going does, measured
        on torch 2.13). True when every group is gone; False when something still holds one
        (it is then kept, as :meth:`cleanup` keeps them, and the rank should leave the pool:
        its exit closes the connections instead).

        Only for a rank with no collective in flight: then no future callback can hold a
        group on a backend thread (see :meth:`cleanup`), and a group seen alive after a
        full collection is held by something else, and kept.
        """
        self._reaper.drain()
        groups = list(dist.distributed_c10d._world.pg_map) if dist.is_initialized() else []
        kept = COMMUNICATORS.drop()  # the parent starts a new generation after a failure
        refs = [weakref.ref(g) for g in [*groups, *self._retired_groups, kept] if g is not None]
        del groups, kept
        self._retired_groups = []
        if dist.is_initialized():
            dist.destroy_process_group()
        gc.collect()
        alive = [g for g in (r() for r in refs) if g is not None]
        self._retired_groups = alive
        return not alive

    def reaper_thread(self) -> int | None:
        """The ident of the thread that destroys groups (the harness's, not a job's)."""
        return self._reaper.ident

    def close(self) -> bool:
        """Before the process exits: wait for the groups being destroyed in the background
        (a process that exits while a destructor runs on another thread aborts in C++).
        True when they went within the reaper's deadline; the groups still held go at exit,
        on the main thread, as they always did."""
        self._reaper.retire([COMMUNICATORS.drop()], shut_down=True)
        return self._reaper.drain()
