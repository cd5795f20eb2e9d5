"""``torch-python-reducer``: torch's DDP with the C++ reducer switched off.

``torch._dynamo.config.optimize_ddp = "python_reducer"`` makes
``DistributedDataParallel.__init__`` set ``_use_python_reducer``: the forward skips the
C++ reducer's ``prepare_for_forward``/``prepare_for_backward`` (so the reducer's autograd
hooks never fire) and every parameter gets a post-accumulate-grad hook that divides its
gradient by the group size and all-reduces it with ``torch.distributed._functional_collectives``
(one collective per parameter, no buckets). The mode is meant for compiled autograd, where
those per-parameter collectives are traced and fused; torch 2.13 still runs it eagerly,
outside compiled autograd, and that eager path is what this candidate tests. The switch is
read only in the constructor, so the adapter sets it around construction and restores it.

What the eager path does not do, by construction of torch's code (so those scenarios are
N/A rather than run with the option silently ignored): no buffer broadcast in forward
(``broadcast_buffers=True``), no unused-parameter search (``find_unused_parameters=True``:
a parameter without a gradient gets no hook call, so ranks would issue different
collectives), no Join (the join hook drives the C++ reducer), and comm hooks are called
per parameter as ``hook(state, (grad, param))``, not with DDP's ``GradBucket``.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ddp_conformance.builtins._common import OptionPolicy, expectations_file, honoured, static_capabilities
from ddp_conformance.contract.adapter import Adapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability
from ddp_conformance.contract.ddp_like import DDPLikeAdapter

NAME = "torch-python-reducer"
POLICY: OptionPolicy = {
    "broadcast_buffers": lambda v: not v,
    "find_unused_parameters": lambda v: not v,
    "bucket_cap_mb": None, "gradient_as_bucket_view": None, "static_graph": None,
    "init_sync": None,
}
FEATURES = (Capability.NO_SYNC,)


def python_reducer_ddp(module: nn.Module, ddp_class: type[nn.Module] | None = None,
                       **kwargs: Any) -> nn.Module:
    """``DistributedDataParallel(module, **kwargs)`` built in python-reducer mode
    (``ddp_class``: a class of the same constructor to build instead, such as a mutant's)."""
    import torch._dynamo.config as dynamo_config
    from torch.nn.parallel import DistributedDataParallel

    saved = dynamo_config.optimize_ddp
    dynamo_config.optimize_ddp = "python_reducer"
    try:
        ddp = (ddp_class or DistributedDataParallel)(module, **kwargs)
    finally:
        dynamo_config.optimize_ddp = saved
    if not getattr(ddp, "_use_python_reducer", False):
        raise RuntimeError(f"torch {torch.__version__} did not switch DDP to its Python reducer")
    return ddp


def wrap(module: nn.Module, process_group: Any, device: torch.device, **ddp_options: Any) -> Adapter:
    kwargs: dict[str, Any] = dict(ddp_options, process_group=process_group)
    if device.type == "cuda":
        kwargs["device_ids"] = [device]
    adapter = DDPLikeAdapter(python_reducer_ddp(module, **kwargs), module, frozenset())
    adapter.capabilities = honoured(POLICY, ddp_options, *FEATURES)
    return adapter


def candidate() -> Candidate:
    return Candidate(
        name=NAME, wrap=wrap, capabilities=static_capabilities(POLICY, *FEATURES),
        version=torch.__version__,
        description="torch DDP with optimize_ddp='python_reducer' (per-parameter Python "
                    "all-reduce hooks, eager)",
        expectations=expectations_file(NAME))
