"""The collective trace: every collective a rank issues, seen at the process-group level.

The rank's process groups are created with a registered backend ``traced_<backend>``
whose groups are :class:`TracingProcessGroup`: a Python ``ProcessGroup`` wrapping the real
Gloo (or NCCL) group. Every collective reaches it, whether issued from Python
(``dist.all_reduce``, a candidate's own code, a comm hook) or from C++ (torch's DDP
reducer, its bucket rebuild broadcast), on the default group and on every subgroup.

Each call is logged as a :class:`Collective` (kind, dtype, element count, group size) with
the phase the engine was in (step, microbatch, stage), so the checks can say "rank 1, step
2, backward: an allreduce of 310 float32 elements that rank 0 never issued".
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

#: Stages the engine marks; collectives in ``record`` come from the harness reading state.
STAGES = ("wrap", "zero_grad", "forward", "backward", "optimizer", "join", "record")


@dataclass(frozen=True)
class Collective:
    step: int
    microbatch: int
    stage: str
    kind: str
    dtype: str
    numel: int
    group_size: int

    def signature(self) -> tuple[str, str, int, int]:
        """What must match across ranks: kind, dtype, element count, group size."""
        return (self.kind, self.dtype, self.numel, self.group_size)

    def describe(self) -> str:
        return f"{self.kind}({self.numel} x {self.dtype}, group of {self.group_size})"


class Tracer:
    """The process's trace: the current phase and the collectives logged so far."""

    def __init__(self) -> None:
        self.log: list[Collective] = []
        self.step = -1
        self.microbatch = -1
        self.stage = "wrap"

    def phase(self, stage: str, step: int = -1, microbatch: int = -1) -> None:
        assert stage in STAGES, stage
        self.stage, self.step, self.microbatch = stage, step, microbatch

    def take(self) -> list[Collective]:
        log, self.log = self.log, []
        return log

    def record(self, kind: str, tensor: torch.Tensor | None, numel: int, group_size: int) -> None:
        dtype = str(tensor.dtype).removeprefix("torch.") if tensor is not None else "-"
        self.log.append(Collective(self.step, self.microbatch, self.stage, kind, dtype, numel,
                                   group_size))


TRACER = Tracer()


def _first(x: Any) -> torch.Tensor | None:
    """The first tensor of a (nested) argument."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)) and x:
        return _first(x[0])
    return None


def _total(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel()
    if isinstance(x, (list, tuple)):
        return sum(_total(t) for t in x)
    return 0


# Which argument holds the data a collective moves or reduces, per operation.
_MEASURE: dict[str, Callable[[Sequence[Any]], tuple[torch.Tensor | None, int]]] = {
    "allreduce": lambda a: (_first(a[0]), _total(a[0])),
    "allreduce_coalesced": lambda a: (_first(a[0]), _total(a[0])),
    "broadcast": lambda a: (_first(a[0]), _total(a[0])),
    "reduce": lambda a: (_first(a[0]), _total(a[0])),
    "allgather": lambda a: (_first(a[1]), _total(a[1])),
    "allgather_coalesced": lambda a: (_first(a[1]), _total(a[1])),
    "_allgather_base": lambda a: (_first(a[1]), _total(a[1])),
    "allgather_into_tensor_coalesced": lambda a: (_first(a[1]), _total(a[1])),
    "reduce_scatter": lambda a: (_first(a[1]), _total(a[1])),
    "_reduce_scatter_base": lambda a: (_first(a[1]), _total(a[1])),
    "reduce_scatter_tensor_coalesced": lambda a: (_first(a[1]), _total(a[1])),
    "alltoall_base": lambda a: (_first(a[1]), _total(a[1])),
    "alltoall": lambda a: (_first(a[1]), _total(a[1])),
    "gather": lambda a: (_first(a[1]), _total(a[1])),
    "scatter": lambda a: (_first(a[0]), _total(a[0])),
    "send": lambda a: (_first(a[0]), _total(a[0])),
    "recv": lambda a: (_first(a[0]), _total(a[0])),
    "barrier": lambda a: (None, 0),
}

#: Collectives that reduce (sum) data across ranks: what gradient synchronisation uses.
REDUCING = frozenset({"allreduce", "allreduce_coalesced", "reduce", "reduce_scatter",
                      "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"})


def _traced(name: str) -> Callable[..., Any]:
    measure = _MEASURE[name]

    def call(self: TracingProcessGroup, *args: Any, **kwargs: Any) -> Any:
        tensor, numel = measure(args) if args else (None, 0)
        TRACER.record(name, tensor, numel, self.size())
        # Not every operation is bound on the backend object (ProcessGroupGloo lacks the
        # coalesced ones): those take the generic c10d path of a plain group over it.
        target = self.inner if hasattr(self.inner, name) else self.plain
        return getattr(target, name)(*args, **kwargs)

    call.__name__ = name
    return call


_BT = dist.ProcessGroup.BackendType
_DEVICE_BACKENDS = {"gloo": (("cpu", _BT.GLOO), ("cuda", _BT.GLOO)), "nccl": (("cuda", _BT.NCCL),)}


class TracingProcessGroup(dist.ProcessGroup):
    """A process group that logs every collective to :data:`TRACER` and forwards it."""

    def __init__(self, inner: dist.ProcessGroup, backend_name: str) -> None:
        super().__init__(inner.rank(), inner.size())  # type: ignore[call-arg]
        self.inner = inner
        self.backend_name = backend_name
        # C++ callers that look a backend up by device (functional collectives, DeviceMesh,
        # FSDP) find the real one: they work, untraced; Python-level calls are traced.
        #: A plain c10d group over the same backend, for operations the backend object does
        #: not bind in Python (calling the base class on ``self`` would recurse into us).
        self.plain = dist.ProcessGroup(inner.rank(), inner.size())  # type: ignore[call-arg]
        for device, kind in _DEVICE_BACKENDS.get(backend_name.removeprefix("traced_"), ()):
            for group in (self, self.plain):
                group._register_backend(torch.device(device), kind, inner)  # type: ignore[arg-type]
        if backend_name.removeprefix("traced_") in _DEVICE_BACKENDS:
            self.plain._set_default_backend(_DEVICE_BACKENDS[backend_name.removeprefix("traced_")][0][1])

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return self.backend_name  # the registered name: torch looks the backend up by it


for _name in _MEASURE:
    setattr(TracingProcessGroup, _name, _traced(_name))


def traced_backend(backend: str) -> str:
    """Register (once) and return the name of the tracing variant of ``backend``."""
    name = f"traced_{backend}"
    if hasattr(dist.Backend, name.upper()):
        return name

    def create(store: Any, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
        inner: Any
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            inner = dist.ProcessGroupNCCL(store, rank, size, options)
        else:
            inner = dist.ProcessGroupGloo(store, rank, size, timeout)
        return TracingProcessGroup(inner, name)

    devices = ["cuda"] if backend == "nccl" else ["cpu", "cuda"]
    dist.Backend.register_backend(name, create, devices=devices)
    return name
