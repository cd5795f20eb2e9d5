"""``accelerate``: Hugging Face Accelerate's ``Accelerator`` preparing model and optimizer.

``Accelerator(cpu=..., kwargs_handlers=[DistributedDataParallelKwargs(**ddp_options)])``
picks up the process group the harness started (Accelerate only ever uses the default
group: it reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``, which the adapter sets from that
group when absent, and skips ``init_process_group`` when one exists);
``accelerator.prepare_model`` wraps the module in ``DistributedDataParallel``,
``prepare_optimizer`` wraps the optimizer (``AcceleratedOptimizer``, which skips steps
while gradients are not synced); backward is ``accelerator.backward``; gradient
accumulation windows are ``accelerator.no_sync(model)``, the API Accelerate documents
for manual accumulation (``accumulate()`` is the same context, chosen by a step counter).
Accelerate's singletons (``PartialState``, ``AcceleratorState``, ``GradientState``) are
reset before each wrap, since the harness reuses its rank processes across scenarios.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ddp_conformance.builtins._common import (
    OptionPolicy,
    expectations_file,
    honoured,
    require,
    set_launcher_env,
    static_capabilities,
    version,
)
from ddp_conformance.contract.adapter import Adapter, OptimizerFactory
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability
from ddp_conformance.contract.refusal import Unsupported

NAME = "accelerate"
POLICY: OptionPolicy = {o: None for o in (
    "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters", "gradient_as_bucket_view",
    "static_graph")}
FEATURES = (Capability.NO_SYNC,)


class AccelerateAdapter(Adapter):
    def __init__(self, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState, PartialState
        from accelerate.utils import DistributedDataParallelKwargs

        if process_group not in (None, dist.group.WORLD):
            raise Unsupported("Accelerate wraps with the default process group only")
        set_launcher_env(device, LOCAL_WORLD_SIZE=str(dist.get_world_size()),
                         MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS=str(torch.get_num_threads()))
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        PartialState._reset_state()
        self.accelerator = Accelerator(
            cpu=device.type == "cpu",
            kwargs_handlers=[DistributedDataParallelKwargs(**ddp_options)])
        self.module = module
        self.model = self.accelerator.prepare_model(module)
        self.optimizer: Any = None
        self.capabilities = honoured(POLICY, ddp_options, *FEATURES)

    def set_optimizer(self, factory: OptimizerFactory) -> None:
        self.optimizer = self.accelerator.prepare_optimizer(factory(self.model.parameters()))

    def forward(self, *inputs: Any) -> Any:
        return self.model(*inputs)

    def backward(self, loss: Tensor) -> None:
        self.accelerator.backward(loss)

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.accelerator.no_sync(self.model)  # type: ignore[no-any-return]


def candidate() -> Candidate:
    require(NAME, "accelerate", "accelerate")
    return Candidate(
        name=NAME, wrap=AccelerateAdapter, capabilities=static_capabilities(POLICY, *FEATURES),
        version=version("accelerate"),
        description="accelerate.Accelerator: prepare_model/prepare_optimizer, backward, no_sync",
        expectations=expectations_file(NAME))
