"""The pass-through autograd node DDP puts on its outputs (torch's ``_DDPSink``).

Used with dynamic ``find_unused_parameters`` and for the first iteration of a static
graph. Every output tensor with a ``grad_fn`` goes through one node, so that an output
left out of the loss still runs its part of the graph backward with undefined gradients
(``set_materialize_grads(False)``): the hooks of the parameters behind it fire and the
reduction completes without touching their ``.grad``. In a static graph's first
iteration its backward queues the delayed all-at-once reduction.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class DDPSink(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, on_backward: Callable[[], None], clone: bool,  # type: ignore[override]
                *inputs: Any) -> tuple[Any, ...]:
        ctx.set_materialize_grads(False)
        ctx.on_backward = on_backward
        # Outputs are cloned unless ``_set_ddp_sink_clone(False)`` (torch's default
        # ``_ddp_sink_clone``) so that in-place edits of the returned tensors do not trip
        # the view/in-place checks.
        if not clone:
            return inputs
        return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in inputs)

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Any) -> tuple[Any, ...]:  # type: ignore[override]
        ctx.on_backward()
        return (None, None, *grad_outputs)

