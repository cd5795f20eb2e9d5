"""An example c10d backend: a Python ``ProcessGroup`` that forwards every operation to Gloo.

Importing this module registers the backend name ``example_backend``; then::

    dist.init_process_group("example_backend", store=store, rank=rank, world_size=world_size)

and torch's ``DistributedDataParallel``, ``dist.new_group`` and every public collective run
on it. Point the harness at it with ``--backend tests.backends.example:example_backend``.

The contract a backend author has to meet, and which this class shows:

* the creator registered with ``dist.Backend.register_backend`` takes ``(store, rank,
  world_size, timeout)`` and returns a ``dist.ProcessGroup`` (here, a subclass of it);
* every collective is a method that takes the tensors and the options object c10d builds,
  starts the operation and returns a ``Work``; in-place collectives write their results
  into the tensors they were given;
* the ``Work`` must honour ``wait()``, and ``get_future()`` must yield a future whose value
  holds the result tensors (DDP's gradient reduction chains on it);
* a non-contiguous tensor is read and written through its strides (Gloo itself ignores
  them, pytorch/pytorch#192920, so this class stages such tensors through contiguous
  copies);
* an operation the backend does not offer raises ``NotImplementedError``;
* ``getBackendName()`` returns the registered name;
* the group keeps the name c10d gives it (``_set_group_name``, read back as
  ``group_name``): a Python process group has no backend object for torch to store it
  in, and ``DeviceMesh.from_group`` (DDP's ``device_mesh``) needs it.

Methods that C++ calls (DDP's reducer, its initial broadcast and its shape check) go through
the same Python methods: ``allreduce``, ``broadcast``, ``allgather`` and the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import ClassVar

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    _create_work_from_future,
)
from torch.distributed import Store, Work


class ExampleProcessGroup(dist.ProcessGroup):
    """A process group that forwards each operation to a real Gloo backend.

    Each method is one collective: a subclass overrides a single method to change (or break)
    that collective alone, and may use :meth:`_then` to post-process results asynchronously.
    """

    backend_name: ClassVar[str] = "example_backend"
    #: The name c10d gives the group (``_set_group_name``); "" until it does.
    _group_name: str = ""

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        # Some operations are bound only on ProcessGroup, not on the Gloo backend object:
        # a plain ProcessGroup with the same Gloo backend registered serves those.
        self._pg = dist.ProcessGroup(rank, size)
        self._pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        self._pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)

    def getBackendName(self) -> str:  # the name C++ looks up
        return self.backend_name

    def _set_group_name(self, name: str) -> None:  # called by dist.new_group and init
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    @staticmethod
    def _then(work: Work, outputs: list[torch.Tensor], fix: Callable[[], None]) -> Work:
        """Return a ``Work`` that completes once ``work`` has and ``fix()`` has then run.

        Its future's value is ``outputs``, so ``wait()``, ``get_future()`` and ``then`` all
        see the tensors as ``fix`` left them; nothing blocks the caller (except for a work
        without a future, Gloo's send and recv: that one is waited for here).
        """

        def finish(fut: torch.futures.Future) -> list[torch.Tensor]:
            fut.value()  # re-raises a failure of the underlying work
            fix()
            return outputs

        try:
            future = work.get_future()
        except RuntimeError:  # Gloo's point-to-point work has no future: complete it here
            work.wait()
            fix()
            done: torch.futures.Future = torch.futures.Future()
            done.set_result(outputs)
            return _create_work_from_future(done)
        return _create_work_from_future(future.then(finish))

    def _in_place(self, tensors: list[torch.Tensor], start: Callable[[list[torch.Tensor]], Work]) -> Work:
        """``start(tensors)``, with contiguous copies of non-contiguous tensors in their place,
        whose results are copied back once the work completes."""
        if not any(_strided(t) for t in tensors):
            return start(tensors)
        staged = [t.contiguous() if _strided(t) else t for t in tensors]

        def copy_back() -> None:
            for tensor, copy in zip(tensors, staged, strict=True):
                if copy is not tensor:
                    tensor.copy_(copy)

        return self._then(start(staged), tensors, copy_back)

    # Reductions.

    def allreduce(self, tensors: list[torch.Tensor] | torch.Tensor,
                  opts: AllreduceOptions | None = None) -> Work:
        """c10d calls ``allreduce(tensors, opts)``; torch 2.13's DDP join hook
        (``_match_unused_params_allreduce``) calls ``process_group.allreduce(tensor)``, the
        shortcut only torch's C++ groups bind: a Python group must accept it too
        (tests/standalone/ddp_join_python_process_group.py)."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        options = AllreduceOptions() if opts is None else opts
        return self._in_place(tensors, lambda ts: self._gloo.allreduce(ts, options))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: AllreduceCoalescedOptions) -> Work:
        return self._gloo.allreduce_coalesced(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: ReduceOptions) -> Work:
        return self._in_place(tensors, lambda ts: self._gloo.reduce(ts, opts))

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: ReduceScatterOptions
    ) -> Work:
        return self._gloo.reduce_scatter(outputs, inputs, opts)

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: ReduceScatterOptions
    ) -> Work:
        """``dist.reduce_scatter_tensor``."""
        return self._gloo._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: ReduceScatterOptions
    ) -> Work:
        return self._pg.reduce_scatter_single_coalesced(outputs, inputs, opts)

    # Data movement.

    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions) -> Work:
        return self._in_place(tensors, lambda ts: self._gloo.broadcast(ts, opts))

    def allgather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: AllgatherOptions
    ) -> Work:
        return self._gloo.allgather(outputs, [_dense(t) for t in inputs], opts)

    def allgather_coalesced(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: AllgatherOptions
    ) -> Work:
        return self._gloo.allgather_coalesced(outputs, inputs, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions) -> Work:
        """``dist.all_gather_into_tensor``."""
        return self._gloo._allgather_base(output, input, opts)

    def all_gather_single_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllgatherOptions
    ) -> Work:
        return self._pg.all_gather_single_coalesced(outputs, inputs, opts)

    def gather(
        self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: GatherOptions
    ) -> Work:
        return self._gloo.gather(outputs, [_dense(t) for t in inputs], opts)

    def scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: ScatterOptions
    ) -> Work:
        return self._in_place(outputs, lambda ts: self._gloo.scatter(ts, inputs, opts))

    def alltoall(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllToAllOptions
    ) -> Work:
        return self._gloo.alltoall(outputs, inputs, opts)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: AllToAllOptions,
    ) -> Work:
        """``dist.all_to_all_single``."""
        return self._gloo.alltoall_base(output, input, output_splits, input_splits, opts)

    # Point to point and synchronisation.

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Work:
        return self._gloo.send([_dense(t) for t in tensors], dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Work:
        return self._in_place(tensors, lambda ts: self._gloo.recv(ts, src, tag))

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Work:
        return self._in_place(tensors, lambda ts: self._gloo.recv_anysource(ts, tag))

    def barrier(self, opts: BarrierOptions) -> Work:
        return self._gloo.barrier(opts)

    # Names older torch releases (and older callers) use: they route to the methods above,
    # so a subclass overrides only the current name.

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: AllgatherOptions) -> Work:
        return self.all_gather_single(output, input, opts)

    def _reduce_scatter_base(
        self, output: torch.Tensor, input: torch.Tensor, opts: ReduceScatterOptions
    ) -> Work:
        return self.reduce_scatter_single(output, input, opts)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: AllToAllOptions,
    ) -> Work:
        return self.all_to_all_single(output, input, output_splits, input_splits, opts)

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: AllgatherOptions
    ) -> Work:
        return self.all_gather_single_coalesced(outputs, inputs, opts)

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: ReduceScatterOptions
    ) -> Work:
        return self.reduce_scatter_single_coalesced(outputs, inputs, opts)


def _strided(t: torch.Tensor) -> bool:
    """A dense tensor whose elements are not packed: Gloo would misread it."""
    return t.layout == torch.strided and not t.is_contiguous()


def _dense(t: torch.Tensor) -> torch.Tensor:
    """An input as Gloo can read it (a copy only when it is not contiguous)."""
    return t.contiguous() if _strided(t) else t


def register(cls: type[ExampleProcessGroup]) -> None:
    """Register ``cls`` as the c10d backend ``cls.backend_name`` for CPU tensors, once per process."""
    name = cls.backend_name
    if hasattr(dist.Backend, name.upper()):
        return

    def create(store: Store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
        return cls(store, rank, size, timeout)

    dist.Backend.register_backend(name, create, extended_api=False, devices=["cpu"])


register(ExampleProcessGroup)
example_backend = ExampleProcessGroup.backend_name
