"""Backends with one deliberate, realistic defect each, for the harness to catch.

Importing this module registers each class below under its ``backend_name``, usable as
``--backend tests.backends.defective:<name>``:

* ``last_unreduced``: all-reduce leaves the last element of tensors of 1024 or more elements
  unreduced (each rank keeps its own input there), whatever the reduce op;
* ``sum_averages``: all-reduce SUM averages instead (integer dtypes: floor division);
* ``broadcast_ignores_root``: broadcast always sends from the group's last rank;
* ``no_alltoall``: all-to-all is not offered, and says so with ``NotImplementedError`` (an
  honest, declared gap, not a defect: the harness reports it as not applicable).

Defects that alter results do so in :meth:`ExampleProcessGroup._then`, after the real
operation completes, so asynchronous work, ``get_future()`` and ``then`` all see them.
"""

from __future__ import annotations

import torch
from torch._C._distributed_c10d import AllreduceOptions, AllToAllOptions, BroadcastOptions
from torch.distributed import ReduceOp, Work

from tests.backends.example import ExampleProcessGroup, register


class LastUnreduced(ExampleProcessGroup):
    backend_name = "last_unreduced"

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions) -> Work:
        kept = [(t, t[(-1,) * t.dim()].clone()) for t in tensors if t.numel() >= 1024]

        def restore() -> None:
            for tensor, own in kept:
                tensor[(-1,) * tensor.dim()] = own

        return self._then(super().allreduce(tensors, opts), tensors, restore)


class SumAverages(ExampleProcessGroup):
    backend_name = "sum_averages"

    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions) -> Work:
        work = super().allreduce(tensors, opts)
        if opts.reduceOp != ReduceOp.SUM:
            return work
        size = self.size()

        def average() -> None:
            for tensor in tensors:
                if tensor.is_floating_point() or tensor.is_complex():
                    tensor.div_(size)
                elif tensor.dtype != torch.bool:
                    tensor.copy_(tensor.div(size, rounding_mode="floor"))

        return self._then(work, tensors, average)


class BroadcastIgnoresRoot(ExampleProcessGroup):
    backend_name = "broadcast_ignores_root"

    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions) -> Work:
        last = BroadcastOptions()
        last.rootRank = self.size() - 1
        last.rootTensor = opts.rootTensor
        last.timeout = opts.timeout
        last.asyncOp = opts.asyncOp
        return super().broadcast(tensors, last)


class NoAlltoall(ExampleProcessGroup):
    backend_name = "no_alltoall"

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllToAllOptions
    ) -> Work:
        raise NotImplementedError("example: alltoall is not implemented")

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: AllToAllOptions,
    ) -> Work:
        raise NotImplementedError("example: alltoall is not implemented")


for _cls in (LastUnreduced, SumAverages, BroadcastIgnoresRoot, NoAlltoall):
    register(_cls)

last_unreduced = LastUnreduced.backend_name
sum_averages = SumAverages.backend_name
broadcast_ignores_root = BroadcastIgnoresRoot.backend_name
no_alltoall = NoAlltoall.backend_name
