"""``megatron-core``: Megatron-Core's local DDP, driven as Megatron's training loop drives it.

What runs (megatron-core 0.16.1, ``megatron.core.distributed``):
``DistributedDataParallel(config, DistributedDataParallelConfig(...), module,
pg_collection=...)``. It keeps every trainable parameter's gradient in a contiguous
per-dtype buffer (``param.main_grad``, a view of it): a hook on each parameter's gradient
accumulator adds ``param.grad`` into ``main_grad`` and frees ``param.grad``. Without
``overlap_grad_reduce`` (its default) the whole buffer is scaled by ``1/dp_size`` and
all-reduced in ``finish_grad_sync()``; with it (what ``bucket_cap_mb`` maps to:
``bucket_size`` in elements) each bucket is all-reduced from the hooks as soon as all its
parameters' gradients are in, and ``finish_grad_sync()`` waits for them. ``no_sync()`` marks
the microbatches before the last one, whose reduction is skipped.

How Megatron's loop is followed (``megatron/core/pipeline_parallel/schedules.py``,
``forward_backward_no_pipelining``, and ``finalize_model_grads``): every microbatch's
backward is ``loss.backward()``; the last one, outside ``no_sync()``, is followed by
``finish_grad_sync()`` (a backward outside ``no_sync`` is a synced one, as in DDP).
The optimizer is the scenario's torch optimizer driven as Megatron's ``FP32Optimizer``
drives it (``megatron/core/optimizer/optimizer.py``; the class itself cannot be built on a
CPU: it allocates its loss scale with ``device='cuda'``): ``zero_grad`` is
``model.zero_grad_buffer()`` then ``_zero_grad_group_helper`` on the optimizer's
parameters, ``step`` sets ``param.grad = param.main_grad`` (``prepare_grads``) and steps
(``clip_grad`` off: DDP never clips). The gradients judged are the ``main_grad`` buffers
the optimizer then steps with (``None`` for a frozen parameter, which has no buffer).

Groups: the scenario's process group is the data-parallel group (``pg_collection.dp``),
tensor, pipeline and expert parallel groups are each rank's own one-rank group (sizes 1,
made with ``use_local_synchronization`` so no other rank takes part): what
``parallel_state.initialize_model_parallel(1, 1)`` gives, without its global state.
``init_sync`` is ``model.broadcast_params()`` (Megatron broadcasts parameters from data
parallel rank 0 when initialisation differs per rank; it never broadcasts buffers, so only
``broadcast_buffers=False`` is honoured). ``find_unused_parameters`` is accepted either
way without ``bucket_cap_mb`` (the buffer holds every trainable parameter, used or not, and
is reduced whole: a parameter without a gradient gets a zero one where DDP leaves
``None``), and not as True with it: the overlapped reduction needs every parameter's
gradient in every backward (a rank-dependent set of used parameters made the ranks issue
different bucket all-reduces).

**One CUDA-only line bypassed.** ``_ParamAndGradBuffer.__init__``
(``param_and_grad_buffer.py``) allocates the gradient buffer with
``device=torch.cuda.current_device()``, which raises on a machine without CUDA. While the
DDP is built, ``torch.cuda.current_device`` answers the module's device; nothing else in
construction calls it on this configuration (the other calls are behind
``nccl_ub``, MXFP8 parameters and ``num_distributed_optimizer_instances > 1``, all off).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

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
    sync_through_no_sync,
    unknown_options,
    version,
)
from ddp_conformance.contract.adapter import Adapter, OptimizerFactory, dense
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capabilities, Capability

NAME = "megatron-core"
POLICY: OptionPolicy = {"bucket_cap_mb": None, "init_sync": None, "find_unused_parameters": None,
                        "broadcast_buffers": lambda v: not v}
FEATURES = (Capability.NO_SYNC, Capability.SYNC_STRATEGY)


@contextlib.contextmanager
def cuda_device_bypass(device: torch.device) -> Iterator[None]:
    """``torch.cuda.current_device()`` answers ``device`` (the one CUDA-only call in
    building Megatron's gradient buffer); on a CUDA device nothing is changed."""
    if device.type == "cuda":
        yield
        return
    with mock.patch.object(torch.cuda, "current_device", lambda: device):
        yield


def _one_rank_group() -> Any:
    """This rank's own group of one (tensor/pipeline/expert parallel size 1)."""
    return dist.new_group([dist.get_rank()], use_local_synchronization=True)


def _pg_collection(process_group: Any) -> Any:
    from megatron.core.process_groups_config import ProcessGroupCollection

    pgs = ProcessGroupCollection()
    own = _one_rank_group()
    pgs.dp = process_group
    pgs.tp = pgs.pp = pgs.ep = pgs.expt_dp = own
    return pgs


def _capabilities(ddp_options: dict[str, Any]) -> Capabilities:
    """The honoured options; ``find_unused_parameters=True`` is not, with ``bucket_cap_mb``
    (Megatron's overlapped reduction dispatches a bucket when all its parameters' gradients
    are in, and asserts every parameter gets one each backward)."""
    caps = set(honoured(POLICY, ddp_options, *FEATURES))
    if ddp_options.get("bucket_cap_mb") is not None and ddp_options.get("find_unused_parameters"):
        unused = Capability.option("find_unused_parameters")
        caps.discard(unused)
        return Capabilities(caps, {unused: "with bucket_cap_mb, i.e. Megatron's overlap_grad_reduce, "
                                           "every parameter must get a gradient in every backward"})
    return Capabilities(caps)


class MegatronCoreAdapter(Adapter):
    def __init__(self, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.transformer.transformer_config import TransformerConfig

        unknown_options(ddp_options)
        group = process_group if process_group is not None else dist.group.WORLD
        bucket_cap_mb = ddp_options.get("bucket_cap_mb")
        ddp_config = DistributedDataParallelConfig(
            overlap_grad_reduce=bucket_cap_mb is not None,
            bucket_size=None if bucket_cap_mb is None else max(1, bucket_elements(module, bucket_cap_mb)))
        # The model config: only what DDP reads of it (per-token loss off, no CUDA graphs).
        config = TransformerConfig(num_layers=1, hidden_size=1, num_attention_heads=1)
        with cuda_device_bypass(device):
            self.ddp = DistributedDataParallel(config, ddp_config, module,
                                               pg_collection=_pg_collection(group))
        if ddp_options.get("init_sync", True):
            self.ddp.broadcast_params()
        self.module = module
        self.group = group
        self.optimizer: torch.optim.Optimizer | None = None
        self._synced = True
        self.capabilities = _capabilities(ddp_options)

    def set_optimizer(self, factory: OptimizerFactory) -> None:
        self.optimizer = factory(self.ddp.parameters())

    def forward(self, *inputs: Any) -> Any:
        return self.ddp(*inputs)

    def backward(self, loss: Tensor) -> None:
        loss.backward()
        if self._synced:
            self.ddp.finish_grad_sync()

    def train(self, mode: bool) -> None:
        self.ddp.train(mode)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Megatron's ``no_sync()``, and no ``finish_grad_sync()`` after a backward inside
        it; leaving it restores the state it found (a window nested in another stays
        unsynced: it is the outer one that ends accumulation)."""
        outer = self._synced
        self._synced = False
        try:
            with self.ddp.no_sync():
                yield
        finally:
            self._synced = outer

    def sync_context(self, is_final_microbatch: bool, strategy: str
                     ) -> contextlib.AbstractContextManager[None]:
        """Composer's sync strategies through :meth:`no_sync`; ``forced_sync`` averages the
        ``main_grad`` buffers the optimizer steps with."""
        def grads() -> list[Tensor]:
            return [p.main_grad for p in self.ddp.parameters() if hasattr(p, "main_grad")]

        return sync_through_no_sync(self.no_sync, grads, self.group, is_final_microbatch,
                                    strategy)

    def zero_grad(self, set_to_none: bool) -> None:
        from megatron.core.optimizer.optimizer import _zero_grad_group_helper

        assert self.optimizer is not None, "set_optimizer first"
        self.ddp.zero_grad_buffer()
        for group in self.optimizer.param_groups:
            _zero_grad_group_helper(group["params"], set_to_none)

    def step(self) -> None:
        assert self.optimizer is not None, "set_optimizer first"
        with torch.no_grad():  # FP32Optimizer.prepare_grads
            for group in self.optimizer.param_groups:
                for param in group["params"]:
                    if hasattr(param, "main_grad"):
                        param.grad = param.main_grad
        self.optimizer.step()

    def gradients(self) -> dict[str, Tensor | None]:
        """The gradients the optimizer steps with: each parameter's ``main_grad``."""
        out: dict[str, Tensor | None] = {}
        for name, param in self.module.named_parameters():
            grad = getattr(param, "main_grad", None)
            if grad is None:
                grad = param.grad
            out[name] = None if grad is None else dense(grad)
        return out


def candidate() -> Candidate:
    require(NAME, "megatron.core.distributed", "megatron-core", extra="megatron-core")
    return Candidate(
        name=NAME, wrap=MegatronCoreAdapter, capabilities=static_capabilities(POLICY, *FEATURES),
        version=version("megatron-core"),
        description="megatron.core.distributed.DistributedDataParallel: contiguous main_grad "
                    "buffers, finish_grad_sync after the last microbatch (CUDA-only buffer "
                    "allocation bypassed on CPU)",
        expectations=expectations_file(NAME))
