"""``fairscale-sharded``: fairscale's ``ShardedDataParallel`` with its ``OSS`` sharded optimizer.

What fairscale's ShardedDDP does (fairscale 0.4.13, ``fairscale.nn.data_parallel``): ``OSS``
assigns every parameter whole to one rank of the group (greedily, by size) and keeps the
wrapped optimizer's state only for this rank's parameters (ZeRO stage 1); ``OSS.step``
updates this rank's parameters and then broadcasts each rank's shard (a flat buffer the
parameters are views of) from its owner to every rank. ``ShardedDataParallel`` needs that
optimizer at construction: it reads the partition from it, broadcasts rank 0's
``state_dict`` (parameters *and* buffers) when built (``sync_models_at_startup``), and
registers a hook on every trainable parameter's gradient accumulator that scales the
gradient by ``1/world_size`` and *reduces* it (``dist.reduce``, not an allreduce) to the
rank that owns it; every other rank then frees its copy (``grad = None``). Small
gradients are packed into one gradient bucket per owner rank (``reduce_buffer_size``
elements at most; the gradients become views of it, created as zeros at the first
forward), reduced when all its gradients are in or flushed at the end of backward.
``broadcast_buffers`` broadcasts rank 0's buffers at each forward outside ``no_sync()``;
``no_sync()`` skips the reductions, so gradients accumulate locally.

How the contract maps onto it: ``set_optimizer`` calls the scenario's optimizer factory
once on the module's parameters to learn the optimizer class, its ``defaults`` and its
parameter groups (every option filled in), builds ``OSS(param_groups, optim=<that class>,
group=process_group, **defaults)`` and then ``ShardedDataParallel(module, sharded_optimizer=oss,
process_group=..., broadcast_buffers=..., sync_models_at_startup=init_sync,
reduce_buffer_size=...)`` (``bucket_cap_mb`` becomes ``reduce_buffer_size`` in elements of
the model's dtype; fairscale's default, 2**23 elements, otherwise). Forward is the
wrapper's forward, backward is plain ``loss.backward()``, ``step`` is ``OSS.step`` (whose
broadcast makes parameters full and equal on every rank), ``zero_grad`` is
ShardedDDP's own (it keeps bucketed gradients as views of their bucket), ``no_sync`` is
ShardedDDP's. After backward only the owner of a parameter holds its reduced gradient,
so ``gradients`` gathers them: one allreduce of per-parameter flags ("the owner has a
gradient") so every rank agrees on which are ``None``, then one broadcast of each
existing gradient from its owner, in the same order on every rank (the harness's own
collectives, issued while it reads state, never in forward or backward).

Options honoured: ``broadcast_buffers``, ``bucket_cap_mb`` (as above) and ``init_sync``
(``sync_models_at_startup``). Not claimed: ``find_unused_parameters`` (ShardedDDP has no
unused-parameter bookkeeping; a parameter unused on some ranks only makes the ranks'
reduces disagree and hang), ``gradient_as_bucket_view`` and ``static_graph`` (no
counterparts), comm hooks and Join (ShardedDDP has neither), Composer's sync strategies.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddp_conformance.builtins._common import (
    OptionPolicy,
    bucket_elements,
    expectations_file,
    honoured,
    require,
    static_capabilities,
    unknown_options,
    version,
)
from ddp_conformance.contract.adapter import Adapter, OptimizerFactory, dense
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability

NAME = "fairscale-sharded"
#: ShardedDDP's keywords that are DDP's options under other names.
POLICY: OptionPolicy = {"broadcast_buffers": None, "bucket_cap_mb": None, "init_sync": None}
FEATURES = (Capability.NO_SYNC,)
#: fairscale's default ``reduce_buffer_size`` (elements).
DEFAULT_REDUCE_BUFFER_SIZE = 2**23


def _optimizer_spec(probe: torch.optim.Optimizer) -> tuple[type[torch.optim.Optimizer], dict[str, Any],
                                                         list[dict[str, Any]]]:
    """The optimizer class to shard, its defaults, and the parameter groups it was given
    (every option filled in). A ``ZeroRedundancyOptimizer`` (already sharded) is unwrapped
    to the class it shards."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    cls: type[torch.optim.Optimizer] = type(probe)
    defaults = dict(probe.defaults)
    if isinstance(probe, ZeroRedundancyOptimizer):
        cls = probe._optim_constructor  # type: ignore[attr-defined]
        defaults = dict(probe._optim_defaults)  # type: ignore[attr-defined]
    groups = [dict(group, params=list(group["params"])) for group in probe.param_groups]
    return cls, defaults, groups


def _reduce_buffer_size(module: nn.Module, bucket_cap_mb: float | None) -> int:
    if bucket_cap_mb is None:
        return DEFAULT_REDUCE_BUFFER_SIZE
    return max(0, bucket_elements(module, bucket_cap_mb))


class FairscaleShardedAdapter(Adapter):
    def __init__(self, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        unknown_options(ddp_options)
        self.module = module
        self.device = device
        self.process_group: Any = process_group if process_group is not None else dist.group.WORLD
        self.options = ddp_options
        self.oss: Any = None
        self.sdp: Any = None
        self.capabilities = honoured(POLICY, ddp_options, *FEATURES)

    def set_optimizer(self, factory: OptimizerFactory) -> None:
        from fairscale.nn.data_parallel import ShardedDataParallel
        from fairscale.optim import OSS

        cls, defaults, groups = _optimizer_spec(factory(self.module.parameters()))
        self.oss = OSS(groups, optim=cls, group=self.process_group, **defaults)
        self.sdp = ShardedDataParallel(
            self.module, sharded_optimizer=self.oss, process_group=self.process_group,
            broadcast_buffers=self.options.get("broadcast_buffers", True),
            sync_models_at_startup=self.options.get("init_sync", True),
            reduce_buffer_size=_reduce_buffer_size(self.module, self.options.get("bucket_cap_mb")))

    def forward(self, *inputs: Any) -> Any:
        return self.sdp(*inputs)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.oss.step()

    def zero_grad(self, set_to_none: bool) -> None:
        self.sdp.zero_grad(set_to_none=set_to_none)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.sdp.no_sync()  # type: ignore[no-any-return]

    def gradients(self) -> dict[str, Tensor | None]:
        """Every parameter's reduced gradient, broadcast from the rank that owns it."""
        named = list(self.module.named_parameters())
        owner: dict[Tensor, int] = self.oss._param_to_rank
        me = dist.get_rank(self.process_group)
        flags = torch.tensor([int(owner.get(p, -1) == me and p.grad is not None) for _, p in named],
                             dtype=torch.int32, device=self.device)
        dist.all_reduce(flags, group=self.process_group)
        out: dict[str, Tensor | None] = {}
        for (name, param), has_grad in zip(named, flags.tolist(), strict=True):
            if not has_grad:
                out[name] = None
                continue
            src = owner[param]
            grad = dense(param.grad) if src == me and param.grad is not None else torch.empty_like(param)
            dist.broadcast(grad, src=dist.get_global_rank(self.process_group, src),
                           group=self.process_group)
            out[name] = grad
        return out


def candidate() -> Candidate:
    require(NAME, "fairscale", "fairscale")
    return Candidate(
        name=NAME, wrap=FairscaleShardedAdapter, capabilities=static_capabilities(POLICY, *FEATURES),
        version=version("fairscale"),
        description="fairscale ShardedDataParallel + OSS: gradients reduced to their owner rank",
        expectations=expectations_file(NAME))
