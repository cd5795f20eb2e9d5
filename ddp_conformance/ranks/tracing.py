"""The collective trace: every collective a rank issues, seen at the process-group level.

:class:`TracingProcessGroup` is a Python ``ProcessGroup`` that forwards every collective to
a real Gloo (or NCCL) group and logs it into a :class:`Tracer`. Every collective reaches
it, whether issued from Python (``dist.all_reduce``, a candidate's own code, a comm hook)
or from C++ (torch's DDP reducer, its bucket rebuild broadcast). It wraps either

- a backend object: the rank's process groups are created with a registered backend
  ``traced_<backend>`` (:func:`traced_backend`) whose groups are tracing groups over a
  fresh ``ProcessGroupGloo``/``ProcessGroupNCCL`` (or what a custom backend's creator
  returns), logging into the process-wide :data:`TRACER` that the conformance checks
  read, on the default group and on every subgroup; or
- an existing ``ProcessGroup`` (``dist.new_group(backend="gloo")``, the default group):
  what the bench and the reference DDP's tests do, each with a :class:`Tracer` of its own.

Each call is logged as a :class:`Collective` (kind, dtype, element count, bytes, group
size, launch time) with the phase the tracer was in (step, microbatch, stage), so the
checks can say "rank 1, step 2, backward: an allreduce of 310 float32 elements that rank
0 never issued"; with ``Tracer.completions`` on, also when the collective completed
(polled, see :meth:`Tracer.watch`), for the bench's overlap figures.

**The candidate cannot see the trace.** Every public query answers what it would without
the harness: torch's world maps record each traced group under the real backend's name
(``dist.get_backend``, ``dist.get_backend_config``; see :func:`_install`, which also makes
``new_group()`` with or without ``backend=`` trace its group), and the group answers
``name()``, ``_get_backend_name()``, ``rank()`` and ``size()`` as ``inner`` does, C++ and
Python alike; its device types and ``_get_backend(device)`` are ``inner``'s. Nothing is
asked of a work the candidate did not ask (no ``get_future()``: completion is polled).
What still shows: ``type(group)`` is this class (an ``isinstance`` check against the
backend's own class fails), and groups a candidate builds itself (``split_group``, a
``ProcessGroup`` over a backend object it made) are untraced, as before.

A group created through :func:`traced_backend` also knows its id and global ranks (the
same on every rank) and numbers its collectives; with ``Tracer.flight`` set (the pool's
ranks set it) each is streamed to the parent as it is launched and completed, which is how
a hang is diagnosed while it happens (:mod:`ddp_conformance.ranks.flight`).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import Backend as C10dBackend

from ddp_conformance.contract.backend import capability
from ddp_conformance.ranks.communicator import COMMUNICATORS, CommState
from ddp_conformance.ranks.flight import POLLER, FlightRecorder
from ddp_conformance.script.collective import REDUCING, Collective
from ddp_conformance.script.extents import BOOK, reduced_memory

#: How finely ``Tracer.completions`` stamps completion times (see :meth:`Tracer.watch`).
COMPLETION_FLOOR_S = 0.00005
COMPLETION_CAP_S = 0.002

#: Stages the engine marks; collectives in ``record`` come from the harness reading state;
#: ``eval`` is the forward under ``no_grad`` between steps (``Scenario.eval_between_steps``).
STAGES = ("wrap", "eval", "zero_grad", "forward", "backward", "optimizer", "join", "record")


class Tracer:
    """A trace: the current phase and the collectives logged so far.

    ``completions``: stamp each collective's completion time (polled through
    ``work.is_completed()`` by :data:`~ddp_conformance.ranks.flight.POLLER`, never through
    the work's future; costs a few queries per collective, so off unless asked for).
    """

    def __init__(self, completions: bool = False) -> None:
        self.log: list[Collective] = []
        self.step = -1
        self.microbatch = -1
        self.stage = "wrap"
        self.completions = completions
        #: Where launches and completions are streamed to the parent (None: nowhere).
        self.flight: FlightRecorder | None = None

    def phase(self, stage: str, step: int = -1, microbatch: int = -1) -> None:
        assert stage in STAGES, stage
        self.stage, self.step, self.microbatch = stage, step, microbatch

    def take(self) -> list[Collective]:
        log, self.log = self.log, []
        return log

    def record(self, kind: str, tensor: torch.Tensor | None, numel: int, group_size: int) -> Collective:
        """Log a collective launched now, of ``numel`` elements of ``tensor``'s dtype."""
        dtype = str(tensor.dtype).removeprefix("torch.") if tensor is not None else "-"
        nbytes = numel * tensor.element_size() if tensor is not None else 0
        entry = Collective(self.step, self.microbatch, self.stage, kind, dtype, numel, group_size,
                           nbytes, time.perf_counter())
        self.log.append(entry)
        return entry

    def watch(self, entry: Collective, work: Any) -> None:
        """Stamp ``entry.done`` when ``work`` completes (seen by the poller's thread within
        :data:`COMPLETION_FLOOR_S` of it for a short collective, within a quarter of its
        duration or :data:`COMPLETION_CAP_S` for a longer one; a work that cannot say, none).
        """
        def done(when: float, _error: bool) -> None:
            entry.done = when

        POLLER.watch(work, done, COMPLETION_FLOOR_S, COMPLETION_CAP_S)


#: The process's trace, read by the conformance checks (groups of :func:`traced_backend`).
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
    # torch 2.13's public API calls these (all_gather_into_tensor, reduce_scatter_tensor,
    # all_to_all_single and their coalesced forms); the older names above stay for callers
    # that still use them.
    "all_gather_single": lambda a: (_first(a[1]), _total(a[1])),
    "all_gather_single_coalesced": lambda a: (_first(a[1]), _total(a[1])),
    "reduce_scatter_single": lambda a: (_first(a[1]), _total(a[1])),
    "reduce_scatter_single_coalesced": lambda a: (_first(a[1]), _total(a[1])),
    "all_to_all_single": lambda a: (_first(a[1]), _total(a[1])),
    "alltoall": lambda a: (_first(a[1]), _total(a[1])),
    "gather": lambda a: (_first(a[1]), _total(a[1])),
    "scatter": lambda a: (_first(a[0]), _total(a[0])),
    "send": lambda a: (_first(a[0]), _total(a[0])),
    "recv": lambda a: (_first(a[0]), _total(a[0])),
    "barrier": lambda a: (None, 0),
}

def _traced(name: str) -> Callable[..., Any]:
    measure = _MEASURE[name]

    def call(self: TracingProcessGroup, *args: Any, **kwargs: Any) -> Any:
        tensor, numel = measure(args) if args else (None, 0)
        tracer = self.tracer
        entry = tracer.record(name, tensor, numel, self.size())
        entry.extents, entry.again, entry.blocks = reduced_memory(tracer, name, args, REDUCING)
        self.seq += 1
        # Not every operation is bound on a backend object (ProcessGroupGloo lacks the
        # coalesced ones): those take the generic c10d path of a plain group over it.
        target = self.inner if hasattr(self.inner, name) else self.plain
        work = getattr(target, name)(*args, **kwargs)
        BOOK.bind(work)
        if self.pooled and work is not None:
            self.in_flight.append(work)
        if tracer.completions:
            tracer.watch(entry, work)
        if tracer.flight is not None and self.group_key:
            tracer.flight.launched(self.group_key, self.seq, name, entry.dtype, numel,
                                   entry.stage, entry.step, entry.microbatch, work)
        return work

    call.__name__ = name
    return call


#: How long :meth:`TracingProcessGroup.state` waits for matched work to complete (an
#: unmatched collective never does; the parent then starts a new communicator).
STATE_SETTLE_S = 0.1

_BT = dist.ProcessGroup.BackendType
_BUILTIN_TYPES = {"gloo": _BT.GLOO, "nccl": _BT.NCCL}


def device_backends(backend: str) -> tuple[tuple[str, Any], ...]:
    """(device type, c10d backend type) pairs that ``backend`` serves: the device types of
    :func:`~ddp_conformance.contract.backend.capability`, typed as c10d types them (a
    registered backend is ``CUSTOM``)."""
    kind = _BUILTIN_TYPES.get(backend, _BT.CUSTOM)
    return tuple((device, kind) for device in capability(backend))


def cpp_rank_size(group: dist.ProcessGroup | C10dBackend) -> tuple[int, int]:
    """``group``'s rank and size as C++ holds them: what torch's DDP and every C++ caller
    read, whatever a Python subclass's own ``rank()``/``size()`` answer (the base class's
    binding, called on ``group``, bypasses them)."""
    base: Any = dist.ProcessGroup if isinstance(group, dist.ProcessGroup) else C10dBackend
    return int(base.rank(group)), int(base.size(group))


class TracingProcessGroup(dist.ProcessGroup):
    """A process group that logs every collective into ``tracer`` and forwards it to ``inner``.

    ``inner``: a backend object (``ProcessGroupGloo``, ``ProcessGroupNCCL``, a custom
    backend's) or a ``ProcessGroup`` (a Python process group a custom backend creates).
    ``backend_name``: what ``getBackendName`` (so ``name()`` and ``_get_backend_name()``)
    answers; default: what ``inner`` answers, as the candidate would see without the
    harness. ``real``: the name ``inner``'s backend is registered under (default: what it
    calls itself), which says the device types it serves. ``tracer``: default
    :data:`TRACER`. ``group_key`` and ``ranks``: the group's id and global ranks, the same
    on every rank (given by :func:`traced_backend`; without them the group's collectives
    are not streamed to the flight recorder).

    The group is what torch sees of ``inner``: its C++ rank and size are ``inner``'s C++
    ones (what torch's DDP and every C++ caller read, even where a Python ``rank()`` or
    ``size()`` of ``inner`` says otherwise), and its Python ``rank()``/``size()`` are
    ``inner``'s Python ones. It issues nothing on ``inner`` the candidate did not ask for:
    completion is polled (``is_completed()``), never asked of the work's future.
    """

    def __init__(self, inner: dist.ProcessGroup | C10dBackend, backend_name: str | None = None,
                 tracer: Tracer | None = None, group_key: str = "",
                 ranks: Sequence[int] = (), real: str | None = None) -> None:
        rank, size = cpp_rank_size(inner)
        super().__init__(rank, size)  # type: ignore[call-arg]
        self.inner = inner
        self.tracer = TRACER if tracer is None else tracer
        self.group_key = group_key
        #: How many collectives this rank issued on the group so far.
        self.seq = 0
        #: ``inner`` outlives this group (a kept communicator, see
        #: :mod:`~ddp_conformance.ranks.communicator`): the group neither shuts it down
        #: nor lets it go, and it tracks the work it launched there (:meth:`state`).
        self.pooled = False
        self.in_flight: list[Any] = []
        if group_key and self.tracer.flight is not None:
            self.tracer.flight.group(group_key, tuple(ranks))
        if isinstance(inner, dist.ProcessGroup):
            real = real or inner.name()
            #: What serves the operations ``inner`` does not bind in Python: itself here.
            self.plain = inner
            # C++ callers that look a backend up by device (functional collectives,
            # DeviceMesh, FSDP, object collectives) find the real one: they work, untraced;
            # Python-level calls and the C++ group's collectives (DDP's reducer) are traced.
            for device, kind in device_backends(real):
                if torch.device(device) in inner._device_types:
                    self._register_backend(torch.device(device), kind,
                                           inner._get_backend(torch.device(device)))
        else:
            real = real or inner.name()
            #: A plain c10d group over the same backend, for operations the backend object
            #: does not bind in Python (calling the base class on ``self`` would recurse).
            self.plain = dist.ProcessGroup(rank, size)  # type: ignore[call-arg]
            served = device_backends(real)
            for device, kind in served:
                for group in (self, self.plain):
                    group._register_backend(torch.device(device), kind, inner)
            if served:
                self.plain._set_default_backend(served[0][1])
        #: The name ``inner``'s backend is registered under.
        self.real = real
        self.backend_name = backend_name
        if group_key and callable(getattr(inner, "new_group", None)):
            # torch 2.13 hands subgroup creation to a default group that has a new_group
            # (a Python process group's own way): so it does here, as it would to inner.
            self.new_group = self._new_group

    def _new_group(self, ranks: list[int], **kwargs: Any) -> TracingProcessGroup | None:
        """``inner.new_group``, its group traced (None: this rank is not in it)."""
        inner: Any = self.inner
        sub = inner.new_group(ranks, **kwargs)
        if sub is None:
            return None
        return TracingProcessGroup(sub, tracer=self.tracer, ranks=ranks, real=self.real,
                                   group_key=str(kwargs.get("group_name") or ""))

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """What the group torch would have made answers (or ``backend_name``): ``inner``'s
        name for a process group; for a backend object, what a c10d group over it answers
        (``gloo``, ``nccl``; ``custom`` for a registered backend's object: torch's DDP
        logger looks the backend up by that name). ``name()``, ``_get_backend_name()`` and
        C++ callers see the real backend, not the harness."""
        if self.backend_name:
            return self.backend_name
        named = self.inner if isinstance(self.inner, dist.ProcessGroup) else self.plain
        return str(named.name())

    @property
    def group_name(self) -> Any:
        """``inner``'s (a Python process group may keep its own: torch names ``inner`` as it
        would untraced, see :func:`_install`); over a backend object, this group's."""
        if isinstance(self.inner, dist.ProcessGroup):
            return self.inner.group_name
        return super().group_name

    @property
    def group_desc(self) -> str:
        """As :attr:`group_name`."""
        if isinstance(self.inner, dist.ProcessGroup):
            return str(self.inner.group_desc)
        return str(super().group_desc)

    def rank(self) -> int:
        """``inner``'s answer (a Python process group may answer other than its C++ rank)."""
        return int(self.inner.rank())

    def size(self) -> int:
        """``inner``'s answer (a Python process group may answer other than its C++ size)."""
        return int(self.inner.size())

    def shutdown(self) -> None:
        """What ``destroy_process_group`` calls: shuts the backend down (NCCL aborts its
        communicator), unless it is a kept one that the next job reuses."""
        if not self.pooled:
            super().shutdown()

    def state(self, settle_s: float = STATE_SETTLE_S) -> CommState:
        """Collectives issued on this group so far, and whether every one completed, after
        waiting up to ``settle_s`` for those still in flight. (Gloo completes a work's
        future, which releases its waiter, a moment before it marks the work completed:
        the last allreduce of a step is often still "in flight" for some microseconds.)"""
        deadline = time.monotonic() + settle_s
        while True:
            self.in_flight = [w for w in self.in_flight if not w.is_completed()]
            if not self.in_flight or time.monotonic() >= deadline:
                return CommState(self.seq, not self.in_flight)
            time.sleep(0.0002)


for _name in _MEASURE:
    setattr(TracingProcessGroup, _name, _traced(_name))


def create_inner(backend: str, opts: Any, backend_options: Any) -> Any:
    """The real group a tracing group forwards to: what ``init_process_group(backend)``
    would create for these options (a registered backend through its own creator, called
    the way c10d calls it)."""
    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        options.global_ranks_in_group = list(opts.global_ranks_in_group)
        options.group_name = opts.group_id
        return dist.ProcessGroupNCCL(store, rank, size, options)
    if backend == "gloo":
        gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        gloo.options.global_ranks_in_group = list(opts.global_ranks_in_group)
        gloo.options.group_name = opts.group_id
        return gloo
    plugin = dist.Backend._plugins[backend.upper()]
    if plugin.extended_api:
        return plugin.creator_fn(opts, backend_options)
    return plugin.creator_fn(store, rank, size, timeout)


def traced_backend(backend: str) -> str:
    """Register (once) and return the name of the tracing variant of ``backend`` (gloo,
    nccl, or a backend registered with ``Backend.register_backend``), and make torch's
    group creation invisible-traced (:func:`_install`): ``init_process_group`` with the
    returned name creates a default group that every public query takes for ``backend``."""
    name = f"traced_{backend}"
    _install()
    if hasattr(dist.Backend, name.upper()):
        return name

    def create(opts: Any, backend_options: Any) -> dist.ProcessGroup:
        # The extended creator: it is told the group's id and global ranks (an empty list
        # for the default group), which name the group alike on every rank.
        def fresh() -> Any:
            return create_inner(backend, opts, backend_options)

        default = not opts.global_ranks_in_group
        inner = COMMUNICATORS.default_backend(fresh) if default else fresh()
        ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
        group = TracingProcessGroup(inner, group_key=str(opts.group_id), ranks=ranks,
                                    real=backend)
        group.pooled = default and COMMUNICATORS.keeps(inner)
        return group

    devices = [device for device, _ in device_backends(backend)]
    dist.Backend.register_backend(name, create, extended_api=True, devices=devices)
    _TRACED[name] = backend
    return name


#: Registered tracing variants: ``traced_<real>`` -> ``<real>``.
_TRACED: dict[str, str] = {}


def _traced_world() -> str | None:
    """The real backend of the default group when it is a tracing group of
    :func:`traced_backend` (None: no default group, or an untraced one)."""
    if not dist.is_initialized():
        return None
    world = c10d._get_default_group()
    if isinstance(world, TracingProcessGroup) and world.group_key:
        return world.real
    return None


def _install() -> None:
    """Wrap ``torch.distributed.distributed_c10d._new_process_group_helper`` (once per
    process), through which ``init_process_group``, ``new_group`` and
    ``new_subgroups`` create every group, so that the trace is invisible:

    - a group asked for as ``traced_<real>`` is created by the tracing backend, and then
      recorded in torch's world maps (``_world.pg_map``, which ``dist.get_backend`` reads;
      ``_world.pg_backend_config``, which ``dist.get_backend_config`` reads) under
      ``<real>``, as ``init_process_group(<real>)`` would have recorded it;
    - while the default group is such a group, a group asked for as ``<real>`` (what
      ``new_group()`` reads from the world map, or names with ``backend=``) is created by
      the tracing backend all the same, and recorded as ``<real>``.

    Any other request (no traced default group, another backend) passes through unchanged:
    an untraced job (``--no-trace``) creates its groups exactly as torch does. (The wrapper
    stays installed once a traced job ran in the process; it then only passes through.)
    """
    original = c10d._new_process_group_helper
    if getattr(original, "_ddp_conformance", False):
        return

    def helper(group_size: int, group_rank: int, global_ranks_in_group: list[int],
               backend: Any, store: Any, group_name: Any, *args: Any,
               **kwargs: Any) -> tuple[Any, Any]:
        asked = str(backend)
        real = _TRACED.get(asked)
        if real is None and asked == _traced_world():
            real, backend = asked, f"traced_{asked}"
        pg, pg_store = original(group_size, group_rank, global_ranks_in_group, backend, store,
                                group_name, *args, **kwargs)
        if real is not None and isinstance(pg, TracingProcessGroup):
            c10d._world.pg_map[pg] = (real, pg_store)
            c10d._world.pg_backend_config[pg] = str(c10d.BackendConfig(dist.Backend(real)))
            if isinstance(pg.inner, dist.ProcessGroup):  # named as torch names what it returns
                pg.inner._set_group_name(group_name)
                pg.inner._set_group_desc(kwargs.get("group_desc") or "undefined")
        return pg, pg_store

    helper._ddp_conformance = True  # type: ignore[attr-defined]
    c10d._new_process_group_helper = helper
