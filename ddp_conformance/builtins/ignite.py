"""``ignite``: pytorch-ignite's ``ignite.distributed.auto_model``, as an ignite user calls it.

``idist.auto_model(model, **kwargs)`` (pytorch-ignite 0.5.5, ``ignite/distributed/auto.py``)
moves the model to ``idist.device()`` and, when ``idist.get_world_size() > 1`` and
``idist.backend()`` is one of ``nccl``, ``gloo`` or ``mpi``, wraps it in torch's
``DistributedDataParallel(model, **kwargs)`` (``device_ids=[local_rank]`` added on CUDA);
under any other backend name it returns the model unwrapped. ``idist.auto_optim`` changes
nothing for native torch distributed (it wraps only for Horovod), so the training loop is
torch's own: ``loss.backward(); optimizer.step()``. The scenario's DDP options and process
group go through ``auto_model``'s ``**kwargs`` to torch's DDP, as a user passes them.

ignite keeps its own view of the distributed context (``idist`` computation model), made
once per process from the live default group; its docs ask for ``idist.sync()`` "when the
distributed context is manually created or destroyed", which the harness does for every
case. The adapter therefore calls ``idist.sync()`` before every wrap over the whole world
(its first computation costs ignite one ``all_reduce`` on a new Gloo group of every rank,
for ``nproc_per_node``); under a scenario's subgroup (where some rank may be idle and never
wrap) it syncs only if this process never has. ``LOCAL_RANK`` is set from the group (one
machine) where absent, so ignite need not guess it from host names.

What is judged is what ``auto_model`` returned: torch's DDP (every capability torch's DDP
has, read from the instance) or, where ignite declined to wrap, the bare model, whose
missing ``no_sync`` and hooks make those scenarios N/A and whose gradients are judged as
they are.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ddp_conformance.builtins._common import expectations_file, require, set_launcher_env, version
from ddp_conformance.contract.adapter import Adapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.ddp_like import DDPLikeAdapter, _accepted_options

NAME = "ignite"


def _sync_context(process_group: Any) -> None:
    """``idist.sync()`` as ignite documents it, bounded to the cases every rank wraps."""
    import ignite.distributed as idist
    from ignite.distributed.comp_models.native import _NativeDistModel

    whole_world = process_group is None or process_group == dist.group.WORLD
    if whole_world or not isinstance(idist.utils._model, _NativeDistModel):
        idist.sync()


def wrap(module: nn.Module, process_group: Any, device: torch.device, **ddp_options: Any) -> Adapter:
    """``idist.auto_model(module, process_group=..., **ddp_options)``, driven as torch's DDP."""
    import ignite.distributed as idist

    set_launcher_env(device)
    _sync_context(process_group)
    kwargs = dict(ddp_options)
    if process_group is not None and "device_mesh" not in kwargs:
        kwargs["process_group"] = process_group
    model = idist.auto_model(module, **kwargs)
    return DDPLikeAdapter(model, module, _options())


def _options() -> frozenset[str]:
    """The options ``auto_model`` passes on: torch's DDP constructor keywords."""
    from torch.nn.parallel import DistributedDataParallel

    return _accepted_options(DistributedDataParallel)[0]


def candidate() -> Candidate:
    require(NAME, "ignite.distributed", "pytorch-ignite", extra="ignite")
    return Candidate(
        name=NAME, wrap=wrap, capabilities=_options(), version=version("pytorch-ignite"),
        description="ignite.distributed.auto_model: torch's DDP when the backend is nccl/gloo/mpi",
        expectations=expectations_file(NAME), late_capabilities=True)
