"""Timing on the GPU timeline: step phases by CUDA events, and the overlap of gradient
communication with backward from the device kernels the profiler recorded.

Contract:

- :class:`PhaseTimer` marks phase boundaries of one step. On CUDA each mark records a
  ``torch.cuda.Event(enable_timing=True)`` on the current stream and nothing waits
  between phases; :meth:`PhaseTimer.end` synchronises the device once, so the step total
  is host time to completion, and :meth:`PhaseTimer.phases` are the events' elapsed
  times (device clock). On any other device every mark is ``time.perf_counter()`` (the
  host clock), exactly as the bench timed CPU steps before.
- :func:`gpu_overlap` is pure arithmetic over :class:`KernelSpan` records (no torch,
  no GPU): how long communication kernels ran (the union of their intervals), how much of
  that compute kernels ran at the same time (union intersected with union), and the
  span of the compute kernels.
- :func:`kernel_spans` turns a finished ``torch.profiler.profile`` into
  :class:`KernelSpan` records: device kernels only (memcpy, memset and GPU-side user
  annotations are left out), a kernel is communication when its name contains
  ``nccl`` (any case). A profile without device activity (a CPU run) gives ``[]``.
- :func:`capture_kernels` profiles a block of code on CUDA and collects those spans.
"""
from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

HOST = "host"
CUDA_EVENTS = "cuda_events"
CLOCK_LABELS = {HOST: "host clock", CUDA_EVENTS: "CUDA events"}

#: Device activity that is not a kernel (``FunctionEvent.activity_type``, Kineto's names).
NOT_KERNELS = ("gpu_memcpy", "gpu_memset", "gpu_user_annotation")


def now(device: torch.device) -> float:
    """``time.perf_counter()``, after the device's queued work finished (CUDA runs
    asynchronously: without the synchronisation a step would time its launches only)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


# -- phases -----------------------------------------------------------------------------------

class PhaseTimer:
    """Phase boundaries of one step: ``begin()``, ``mark()`` per inner boundary, ``end()``.

    ``begin`` and ``end`` return host times (``time.perf_counter()``); on CUDA ``begin``
    synchronises first (earlier work is not this step's) and ``end`` synchronises once after
    recording its event (the step is timed to its completion). :meth:`phases` is the
    seconds between consecutive boundaries: CUDA events' ``elapsed_time`` on CUDA, host
    time differences elsewhere. :attr:`clock` says which (:data:`CUDA_EVENTS` or :data:`HOST`).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.clock = CUDA_EVENTS if device.type == "cuda" else HOST
        self._host: list[float] = []
        self._events: list[Any] = []  # torch.cuda.Event

    def _record(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # on the current stream
        self._events.append(event)

    def begin(self) -> float:
        self._host, self._events = [], []
        t = now(self.device)  # earlier work is not this step's
        if self.clock == CUDA_EVENTS:
            self._record()
        else:
            self._host.append(t)
        return t

    def mark(self) -> None:
        if self.clock == CUDA_EVENTS:
            self._record()
        else:
            self._host.append(time.perf_counter())

    def end(self) -> float:
        if self.clock == CUDA_EVENTS:
            self._record()
        t = now(self.device)  # the step is timed to its completion
        if self.clock == HOST:
            self._host.append(t)
        return t

    def phases(self) -> list[float]:
        """Seconds between consecutive boundaries (after :meth:`end`)."""
        if self.clock == CUDA_EVENTS:
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self._events, self._events[1:], strict=False)]
        return [b - a for a, b in zip(self._host, self._host[1:], strict=False)]


# -- overlap on the GPU timeline ----------------------------------------------------------------

@dataclass(frozen=True)
class KernelSpan:
    """One device kernel: name, start and end in seconds (any common origin), the stream
    (device resource id) it ran on, and whether it is communication."""
    name: str
    start_s: float
    end_s: float
    stream: int
    comm: bool


def is_comm_kernel(name: str) -> bool:
    """A communication kernel: NCCL's (``ncclDevKernel_...``, ``ncclKernel_...``)."""
    return "nccl" in name.lower()


def merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``[start, end]`` intervals as disjoint sorted intervals."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(end - start for start, end in intervals)


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intersection of two disjoint sorted interval lists (as :func:`merged` returns)."""
    out: list[tuple[float, float]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


@dataclass(frozen=True)
class GpuOverlap:
    """Communication against compute on the device timeline (seconds).

    ``comm_busy_s``: the union of communication kernels' intervals; ``comm_overlapped_s``:
    the part of it during which some compute kernel ran (on any stream);
    ``comm_exposed_s`` = busy - overlapped; ``compute_busy_s``: the union of compute
    kernels' intervals; ``compute_span_s``: first compute kernel's start to the last one's
    end (0 without compute kernels); ``comm_streams``: streams communication ran on.
    """
    comm_kernels: int
    compute_kernels: int
    comm_busy_s: float
    comm_overlapped_s: float
    comm_exposed_s: float
    compute_busy_s: float
    compute_span_s: float
    comm_streams: tuple[int, ...] = field(default=())

    @property
    def overlap_share(self) -> float:
        """Overlapped over busy communication time; NaN without communication kernels."""
        return self.comm_overlapped_s / self.comm_busy_s if self.comm_busy_s > 0 else float("nan")

    def figures(self) -> dict[str, float]:
        """The numbers only (JSON-safe: no NaN), as a probe step records them."""
        d = asdict(self)
        d.pop("comm_streams")
        return {k: float(v) for k, v in d.items()}


def gpu_overlap(spans: Iterable[KernelSpan]) -> GpuOverlap:
    """Overlap of communication kernels with compute kernels (see :class:`GpuOverlap`).

    E.g. communication [0, 4] and compute [2, 6]: busy 4, overlapped 2, share 0.5.
    """
    spans = list(spans)
    comm = [s for s in spans if s.comm]
    compute = [s for s in spans if not s.comm]
    comm_u = merged((s.start_s, s.end_s) for s in comm)
    compute_u = merged((s.start_s, s.end_s) for s in compute)
    busy = length(comm_u)
    overlapped = length(intersection(comm_u, compute_u))
    span = (max(s.end_s for s in compute) - min(s.start_s for s in compute)) if compute else 0.0
    return GpuOverlap(comm_kernels=len(comm), compute_kernels=len(compute), comm_busy_s=busy,
                      comm_overlapped_s=overlapped, comm_exposed_s=busy - overlapped,
                      compute_busy_s=length(compute_u), compute_span_s=span,
                      comm_streams=tuple(sorted({s.stream for s in comm})))


# -- from the profiler --------------------------------------------------------------------------

def _is_kernel(event: Any) -> bool:
    kind = getattr(event, "activity_type", None)
    if isinstance(kind, str) and kind:
        return kind == "kernel"
    # no activity type (an older torch): leave out what is evidently not a kernel
    name = str(getattr(event, "name", ""))
    return not (getattr(event, "is_user_annotation", False)
                or name.startswith(("Memcpy", "Memset", "cudaMemcpy", "cudaMemset")))


def spans_from_events(events: Iterable[Any]) -> list[KernelSpan]:
    """:class:`KernelSpan` records of the CUDA kernels among ``FunctionEvent``-like objects
    (``device_type``, ``name``, ``time_range.start`` / ``.end`` in microseconds,
    ``device_resource_id`` = stream, ``activity_type``); anything else, or an event
    lacking these, is skipped."""
    from torch.autograd import DeviceType

    out = []
    for e in events:
        if getattr(e, "device_type", None) != DeviceType.CUDA or not _is_kernel(e):
            continue
        time_range = getattr(e, "time_range", None)
        start, end = getattr(time_range, "start", None), getattr(time_range, "end", None)
        if not isinstance(start, int | float) or not isinstance(end, int | float) or end < start:
            continue
        name = str(getattr(e, "name", ""))
        stream = getattr(e, "device_resource_id", -1)
        out.append(KernelSpan(name, start / 1e6, end / 1e6, stream if isinstance(stream, int) else -1,
                              is_comm_kernel(name)))
    return sorted(out, key=lambda s: (s.start_s, s.end_s))


def kernel_spans(prof: Any) -> list[KernelSpan]:
    """The device kernels of a finished ``torch.profiler.profile`` (through its documented
    ``events()``: the unaggregated ``FunctionEvent`` list, kernels among them with
    ``device_type`` CUDA). ``[]`` when it recorded no device activity."""
    return spans_from_events(prof.events() or [])


def cuda_tracing_available() -> bool:
    """Whether the profiler can trace CUDA kernels here (CUDA and CUPTI present)."""
    from torch.profiler import ProfilerActivity, supported_activities

    return torch.cuda.is_available() and ProfilerActivity.CUDA in supported_activities()


@dataclass
class Capture:
    """What :func:`capture_kernels` collected: the kernel spans, or why there are none."""
    spans: list[KernelSpan] = field(default_factory=list)
    unavailable: str | None = None


@contextmanager
def capture_kernels(device: torch.device, cuda: bool = True) -> Iterator[Capture]:
    """Profile the block (CPU activity, and CUDA kernels when ``cuda`` and available);
    on leaving, synchronise ``device`` (CUDA) so that every kernel the block queued has run,
    then fill the yielded :class:`Capture`. Without CUDA tracing the spans are ``[]``
    (``unavailable`` says why when CUDA was asked for)."""
    from torch.profiler import ProfilerActivity, profile

    capture = Capture()
    activities = [ProfilerActivity.CPU]
    if cuda:
        if cuda_tracing_available():
            activities.append(ProfilerActivity.CUDA)
        else:
            capture.unavailable = "the profiler cannot trace CUDA kernels here (no CUDA or no CUPTI)"
    with profile(activities=activities) as prof:
        yield capture
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    capture.spans = kernel_spans(prof)
