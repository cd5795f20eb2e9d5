"""``lightning``: pytorch-lightning's ``DDPStrategy``, driven the way its Trainer drives it.

The module is put inside a ``LightningModule`` whose ``training_step`` runs it; the
strategy is connected to it, moves it to the root device and wraps it with
``configure_ddp()`` (which builds ``DistributedDataParallel(lightning_module,
device_ids=..., **ddp_kwargs)`` and registers its comm hooks), exactly as
``DDPStrategy.setup`` does when fitting. Each forward is ``strategy.training_step``, which
redirects ``training_step`` through the DDP wrapper (``_DDPForwardRedirection``) as the
fit loop does; backward runs the strategy's ``pre_backward``/``post_backward`` around
``loss.backward()`` (the precision plugin is left out: full precision); gradient
accumulation blocks sync through ``strategy.block_backward_sync()``, which is what the fit
loop's ``_block_parallel_sync_behavior`` enters for every accumulating batch. No Trainer
object is built: it would insist on launching its own processes.
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import Tensor, nn

from ddp_conformance.builtins._common import (
    OptionPolicy,
    expectations_file,
    honoured,
    require,
    static_capabilities,
    version,
)
from ddp_conformance.contract.adapter import OptimizerFactory, WrappedModuleAdapter
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability

NAME = "lightning"
POLICY: OptionPolicy = {o: None for o in (
    "broadcast_buffers", "bucket_cap_mb", "find_unused_parameters", "gradient_as_bucket_view",
    "static_graph", "init_sync")}
FEATURES = (Capability.NO_SYNC,)


class LightningAdapter(WrappedModuleAdapter):
    def __init__(self, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        import pytorch_lightning as pl
        from pytorch_lightning.accelerators import CPUAccelerator, CUDAAccelerator
        from pytorch_lightning.strategies import DDPStrategy

        class ConformanceModule(pl.LightningModule):
            def __init__(self, net: nn.Module) -> None:
                super().__init__()
                self.net = net

            def forward(self, *inputs: Any) -> Any:
                return self.net(*inputs)

            def training_step(self, inputs: tuple[Any, ...], batch_idx: int) -> Any:
                return self.net(*inputs)

        self.module = module
        self.lightning_module = ConformanceModule(module)
        accelerator = CUDAAccelerator() if device.type == "cuda" else CPUAccelerator()
        backend = torch.distributed.get_backend(process_group)
        self.strategy = DDPStrategy(accelerator=accelerator, parallel_devices=[device],
                                    process_group_backend=str(backend),
                                    process_group=process_group, **ddp_options)
        self.strategy.connect(self.lightning_module)
        self.strategy.model_to_device()
        self.strategy.configure_ddp()
        self.wrapped = self.lightning_module
        self._batch = 0
        self.capabilities = honoured(POLICY, ddp_options, *FEATURES)

    def set_optimizer(self, factory: OptimizerFactory) -> None:
        super().set_optimizer(factory)
        assert self.optimizer is not None
        self.strategy.optimizers = [self.optimizer]

    def forward(self, *inputs: Any) -> Any:
        self._batch += 1
        return self.strategy.training_step(inputs, self._batch)

    def backward(self, loss: Tensor) -> None:
        self.strategy.pre_backward(loss)
        loss.backward()
        self.strategy.post_backward(loss)

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.strategy.block_backward_sync()  # type: ignore[no-any-return]


def candidate() -> Candidate:
    require(NAME, "pytorch_lightning", "pytorch-lightning")
    return Candidate(
        name=NAME, wrap=LightningAdapter, capabilities=static_capabilities(POLICY, *FEATURES),
        version=version("pytorch-lightning"),
        description="pytorch_lightning.strategies.DDPStrategy (configure_ddp, training_step "
                    "redirection, block_backward_sync)",
        expectations=expectations_file(NAME))
