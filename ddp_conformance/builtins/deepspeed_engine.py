"""``deepspeed-zero0``, ``deepspeed-zero1``, ``deepspeed-zero2``: the DeepSpeed engine on Gloo.

``deepspeed.initialize(model=module, optimizer=<the scenario's torch optimizer>,
config={"zero_optimization": {"stage": N}, ...}, dist_init_required=False)`` builds the
engine over the process group the harness started (DeepSpeed's communication layer
wraps ``torch.distributed``; its CPU accelerator picks Gloo when oneCCL is absent). The
engine is built in ``set_optimizer``, because DeepSpeed takes the optimizer at
construction; that is also when it broadcasts rank 0's parameters (``_broadcast_model``;
buffers are never broadcast, neither at init nor in forward).

Each step is DeepSpeed's own: ``engine(*inputs)``, ``engine.backward(loss)`` (which
reduces: stage 0 one flat all-reduce of every gradient at the accumulation boundary,
stage 1 the ZeRO optimizer's reduction into its partitions, stage 2 reduce-scatter of
gradient buckets as backward produces them) and ``engine.step()``, which also zeroes the
gradients. ``gradient_accumulation_steps`` is 1 and every backward is a boundary, so no
loss is scaled. ``gradient_clipping`` is set to 0: DeepSpeed 0.19.8 clips the global
gradient norm to 1.0 unless told otherwise (``GRADIENT_CLIPPING_DEFAULT``), which DDP
never does; left on, every SGD update was scaled by the clip factor (0.07 in a probe).
Gradient accumulation without communication is ``engine.no_sync()``, which DeepSpeed
allows for stages 0 and 1 only (stage 2 partitions gradients as they are reduced, so it
has no ``no_sync`` and those scenarios are N/A).

Full gradients for the checks come from ``deepspeed.utils.safe_get_full_grad``, the API
DeepSpeed documents for reading a gradient after backward and before step: the gradient
itself at stage 0, gathered from the owning partitions at stages 1 and 2 (a collective,
called by every rank in parameter order). Parameters stay whole on every rank at these
stages (the ZeRO optimizer all-gathers the updated partitions after each step).

Options: ``bucket_cap_mb`` maps to ZeRO's ``reduce_bucket_size`` (elements, so MiB
times 2**20 over the element size) at stages 1 and 2; stage 0 reduces everything in one
fixed-size fallback buffer and does not honour it. Parameters without gradients are
handled natively (``find_unused_parameters`` either way). Only ``broadcast_buffers=False``
and ``init_sync=True`` are what DeepSpeed does. No Join, no comm hooks, no process group
other than the world (DeepSpeed takes groups through a model-parallel unit, not a group).

DeepSpeed keeps process-wide state (its communication backend and cached groups in
``deepspeed.utils.groups``); the cached groups belong to the previous scenario's process
group, so they are reset before each engine is built, as a new process would start.
DeepSpeed JIT-compiles a small shared-memory communication op the first time its
communication layer starts (about a minute here, cached in ``TORCH_EXTENSIONS_DIR``):
the candidate builds it once in the calling process when resolved, so no rank compiles
under a scenario's deadline.
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
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
    set_launcher_env,
    static_capabilities,
    version,
)
from ddp_conformance.contract.adapter import Adapter, OptimizerFactory, dense
from ddp_conformance.contract.candidate import Candidate
from ddp_conformance.contract.capability import Capability
from ddp_conformance.contract.refusal import Unsupported
from ddp_conformance.errors import UsageError

#: A build lock older than this was left by a killed build: no build takes this long here.
STALE_LOCK_S = 900.0


def _policy(stage: int) -> OptionPolicy:
    policy: dict[str, Any] = {
        "broadcast_buffers": lambda v: not v,
        "find_unused_parameters": None,
        "init_sync": lambda v: bool(v),
    }
    if stage >= 1:
        policy["bucket_cap_mb"] = None
    return policy


def _features(stage: int) -> tuple[Capability, ...]:
    return (Capability.NO_SYNC,) if stage < 2 else ()


def _reset_process_state() -> None:
    """Forget the groups DeepSpeed cached for the previous scenario's process group."""
    from deepspeed.utils import groups

    for name in ("_WORLD_GROUP", "_ZERO_PARAM_INTRA_PARALLEL_GROUP", "mpu", "mesh_device",
                 "_TENSOR_MODEL_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP",
                 "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE", "_MPU_TENSOR_MODEL_PARALLEL_RANK"):
        if hasattr(groups, name):
            setattr(groups, name, None)
    for name in ("_EXPERT_PARALLEL_GROUP", "_EXPERT_PARALLEL_GROUP_RANKS",
                 "_EXPERT_DATA_PARALLEL_GROUP", "_EXPERT_DATA_PARALLEL_GROUP_RANKS",
                 "_ALL_TO_ALL_GROUP"):
        cached = getattr(groups, name, None)
        if isinstance(cached, dict):
            cached.clear()


class DeepSpeedAdapter(Adapter):
    def __init__(self, stage: int, module: nn.Module, process_group: Any, device: torch.device,
                 **ddp_options: Any) -> None:
        if process_group not in (None, dist.group.WORLD):
            raise Unsupported("DeepSpeed data parallelism spans the world group only")
        self.stage = stage
        self.module = module
        self.device = device
        self.ddp_options = ddp_options
        self.engine: Any = None
        self.capabilities = honoured(_policy(stage), ddp_options, *_features(stage))

    def _config(self) -> dict[str, Any]:
        zero: dict[str, Any] = {"stage": self.stage}
        cap_mb = self.ddp_options.get("bucket_cap_mb")
        if cap_mb is not None and self.stage >= 1:
            zero["reduce_bucket_size"] = max(1, bucket_elements(self.module, cap_mb))
        return {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                "zero_optimization": zero, "zero_allow_untested_optimizer": True,
                "gradient_clipping": 0.0,
                "steps_per_print": 2**31 - 1, "wall_clock_breakdown": False}

    def set_optimizer(self, factory: OptimizerFactory) -> None:
        import deepspeed

        set_launcher_env(self.device)
        _reset_process_state()
        self.engine, _, _, _ = deepspeed.initialize(
            model=self.module, optimizer=factory(self.module.parameters()),
            config=self._config(), dist_init_required=False)

    def forward(self, *inputs: Any) -> Any:
        return self.engine(*inputs)

    def backward(self, loss: Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> None:
        self.engine.step()

    def zero_grad(self, set_to_none: bool) -> None:
        """Nothing to do: DeepSpeed's ``step`` zeroes the gradients it owns."""

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        return self.engine.no_sync()  # type: ignore[no-any-return]

    def gradients(self) -> dict[str, Tensor | None]:
        from deepspeed.utils import safe_get_full_grad

        grads: dict[str, Tensor | None] = {}
        for name, param in self.module.named_parameters():
            grad = safe_get_full_grad(param)
            grads[name] = None if grad is None else dense(grad)
        return grads


def _prebuild_comm_op() -> None:
    """Compile DeepSpeed's shared-memory op here, once, rather than in every rank under a
    deadline; a lock left by a killed build would make every later build wait forever."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None:
        return
    import deepspeed.ops

    if not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return
    from torch.utils.cpp_extension import _get_build_directory

    lock = os.path.join(_get_build_directory(builder.NAME, verbose=False), "lock")
    if os.path.exists(lock) and time.time() - os.path.getmtime(lock) > STALE_LOCK_S:
        os.remove(lock)
    try:
        builder.load(verbose=False)
    except Exception as exc:  # noqa: BLE001 - one line, whatever the compiler said
        raise UsageError(f"deepspeed could not build its communication op "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                         f"set TORCH_EXTENSIONS_DIR to a writable directory") from None


def _candidate(stage: int) -> Candidate:
    name = f"deepspeed-zero{stage}"
    require(name, "deepspeed", "deepspeed")
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    _prebuild_comm_op()

    def wrap(module: nn.Module, process_group: Any, device: torch.device, **ddp_options: Any) -> Adapter:
        return DeepSpeedAdapter(stage, module, process_group, device, **ddp_options)

    kinds = {0: "no ZeRO: one flat all-reduce at the boundary",
             1: "ZeRO-1: optimizer states partitioned",
             2: "ZeRO-2: gradients reduce-scattered and partitioned"}
    return Candidate(
        name=name, wrap=wrap, capabilities=static_capabilities(_policy(stage), *_features(stage)),
        version=version("deepspeed"),
        description=f"deepspeed.initialize, stage {stage} ({kinds[stage]}); engine backward/step",
        expectations=expectations_file(name))


def zero0() -> Candidate:
    return _candidate(0)


def zero1() -> Candidate:
    return _candidate(1)


def zero2() -> Candidate:
    return _candidate(2)
