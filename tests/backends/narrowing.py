"""A backend that sends float64 through float32 on the wire, for the harness to catch.

Importing this module registers ``float64_as_float32`` (``--backend
tests.backends.narrowing:float64_as_float32``): the example backend (Gloo underneath),
except that in allreduce, reduce, broadcast and allgather (into a list or one tensor), the
operations DDP uses, a float64 tensor travels as float32, as a backend whose transport or
reduction kernel has no 64-bit float path might do silently. A receiver gets the float32
value back in its float64 tensor; a reduction adds float32 values. Every other dtype, and
a sender's own copy (a broadcast's root), is untouched.

The defect is a loss of precision only: data that fits in 24 significant bits (small
integers, powers of two) passes through unchanged, which is why the collective checks use
values that need every bit of their dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._C._distributed_c10d import AllgatherOptions, AllreduceOptions, BroadcastOptions, ReduceOptions
from torch.distributed import Work

from tests.backends.example import ExampleProcessGroup, register


def _wire(t: torch.Tensor) -> torch.Tensor:
    """What travels for ``t``: a float32 copy of a float64 tensor, else ``t`` itself."""
    return t.to(torch.float32) if t.dtype == torch.float64 else t


class Float64AsFloat32(ExampleProcessGroup):
    backend_name = "float64_as_float32"

    def _narrowed(self, tensors: list[torch.Tensor], start: Callable[[list[torch.Tensor]], Work]) -> Work:
        """``start`` on the tensors as they travel; the results copied back on completion."""
        wire = [_wire(t) for t in tensors]
        if all(w is t for w, t in zip(wire, tensors, strict=True)):
            return start(tensors)

        def widen() -> None:
            for tensor, sent in zip(tensors, wire, strict=True):
                if sent is not tensor:
                    tensor.copy_(sent)

        return self._then(start(wire), tensors, widen)

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions) -> Work:
        return self._narrowed(tensors, lambda ts: ExampleProcessGroup.allreduce(self, ts, opts))

    def reduce(self, tensors: list[torch.Tensor], opts: ReduceOptions) -> Work:
        return self._narrowed(tensors, lambda ts: ExampleProcessGroup.reduce(self, ts, opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions) -> Work:
        if self.rank() == opts.rootRank:  # the root keeps its own values
            return ExampleProcessGroup.broadcast(self, [_wire(t) for t in tensors], opts)
        return self._narrowed(tensors, lambda ts: ExampleProcessGroup.broadcast(self, ts, opts))

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: AllgatherOptions
    ) -> Work:
        flat = [t for out in outputs for t in out]
        wire = [[_wire(t) for t in out] for out in outputs]
        if all(w is t for w, t in zip([t for out in wire for t in out], flat, strict=True)):
            return ExampleProcessGroup.allgather(self, outputs, inputs, opts)

        def widen() -> None:
            for out, sent in zip(outputs, wire, strict=True):
                for tensor, got in zip(out, sent, strict=True):
                    tensor.copy_(got)

        work = ExampleProcessGroup.allgather(self, wire, [_wire(t) for t in inputs], opts)
        return self._then(work, flat, widen)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions) -> Work:
        if output.dtype != torch.float64:
            return ExampleProcessGroup.all_gather_single(self, output, input, opts)
        wire = _wire(output)
        work = ExampleProcessGroup.all_gather_single(self, wire, _wire(input), opts)
        return self._then(work, [output], lambda: output.copy_(wire))


register(Float64AsFloat32)
float64_as_float32 = Float64AsFloat32.backend_name
