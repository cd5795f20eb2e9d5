"""The buffers the candidate's model saw at the start of each forward of a step.

A forward pre-hook on the unwrapped model takes them (after any broadcast the candidate
did in its own forward). Under ``torch.compile`` the model's hooks are traced into the
candidate's graph, this one with them, and dynamo guards on the Python state the hook
touches: a hook that appended to the step's growing list made every forward of a step
after the first a new compilation (``len(at_forward) == 1``, ``== 2``, ...). The hook
therefore appends to a list that is empty whenever a forward starts: each forward the
harness makes (:meth:`BuffersAtForward.forward`) moves what the hook took to
:attr:`BuffersAtForward.taken` when it returns or raises, so dynamo sees the same state at
every forward and compiles the model once, as it would without the harness.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ddp_conformance.contract.adapter import Adapter
from ddp_conformance.ranks.records import Tensors


def snapshot(tensors: Any) -> Tensors:
    """Detached copies of ``tensors`` (``(name, tensor)`` pairs), by name."""
    return {n: t.detach().clone() for n, t in tensors}


class BuffersAtForward:
    """The step's buffers at forward, in order (:attr:`taken`; the engine empties it after
    each step)."""

    def __init__(self) -> None:
        self.taken: list[Tensors] = []
        #: What the hook took in the forward now running; empty between forwards.
        self._pending: list[Tensors] = []

    def watch(self, module: torch.nn.Module) -> Any:
        """Hook ``module``'s forwards; the hook's handle."""
        pending = self._pending
        return module.register_forward_pre_hook(
            lambda mod, args: pending.append(snapshot(mod.named_buffers())))

    def settle(self) -> None:
        """Move what the hook took to :attr:`taken` (also a forward the model made on its
        own, outside :meth:`forward`: a recomputation in backward)."""
        self.taken += self._pending
        self._pending.clear()

    def forward(self, adapter: Adapter) -> Callable[..., Any]:
        """``adapter.forward``, settling what the hook took when it returns or raises."""
        def run(*inputs: Any) -> Any:
            try:
                return adapter.forward(*inputs)
            finally:
                self.settle()

        return run
