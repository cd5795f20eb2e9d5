"""Built-in adapters for the ecosystem's data-parallel implementations.

``ADAPTERS`` maps a built-in candidate name (``--candidate NAME``) to a function returning
its :class:`~ddp_conformance.contract.candidate.Candidate`; the function raises
:class:`~ddp_conformance.errors.UsageError` with one line when the package it needs is
not installed. Each adapter module imports its package only inside that function, so
listing the built-ins costs nothing. Shipped expectations files are in ``expectations/``.
"""
from __future__ import annotations

from collections.abc import Callable

from ddp_conformance.builtins import (
    accelerate,
    deepspeed_engine,
    fairscale_sharded,
    fsdp,
    ignite,
    lightning,
    megatron_core,
    replicate,
    torch_compile,
    torch_python_reducer,
    torchft_ddp,
)
from ddp_conformance.contract.candidate import Candidate

ADAPTERS: dict[str, Callable[[], Candidate]] = {
    "torch-python-reducer": torch_python_reducer.candidate,
    "replicate": replicate.candidate,
    "fsdp-no-shard": fsdp.fsdp_no_shard,
    "fsdp-full-shard": fsdp.fsdp_full_shard,
    "fsdp2": fsdp.fsdp2,
    "lightning": lightning.candidate,
    "accelerate": accelerate.candidate,
    "deepspeed-zero0": deepspeed_engine.zero0,
    "deepspeed-zero1": deepspeed_engine.zero1,
    "deepspeed-zero2": deepspeed_engine.zero2,
    "fairscale-sharded": fairscale_sharded.candidate,
    "torch-compile": torch_compile.torch_compile,
    "torch-compile-split": torch_compile.torch_compile_split,
    "torch-compile-inductor": torch_compile.torch_compile_inductor,
    "torch-compile-ca": torch_compile.torch_compile_ca,
    "ignite": ignite.candidate,
    "megatron-core": megatron_core.candidate,
    "torchft": torchft_ddp.candidate,
}
