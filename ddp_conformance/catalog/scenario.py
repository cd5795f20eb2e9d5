"""A scenario is data: which model, which data, which DDP options, which procedure.

Everything a rank or the oracle needs to rebuild any rank's batch is in the scenario and
the (rank, step, microbatch) coordinates, so a scenario pickles to a few hundred bytes and
every process derives the same tensors from it. What a scenario needs from a candidate
(``no_sync``, Join, comm hooks, constructor options) is derived from what it does, not
listed by hand, so it cannot drift.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ddp_conformance.contract.capability import DDP_OPTIONS, Capability
from ddp_conformance.contract.capability import missing_capabilities as _missing


class StringEnum(str, enum.Enum):
    """A string-valued choice (Composer's ``StringEnum``): scenarios may name a member by
    its value, and the value is converted, and checked, when the scenario is built."""

    @classmethod
    def convert(cls, value: str | StringEnum, field_name: str, scenario_id: str) -> Any:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"scenario {scenario_id!r}: {field_name}={value!r} is not one of "
                             f"{choices}") from None

    def __str__(self) -> str:
        return str(self.value)


class Accumulate(StringEnum):
    """How the microbatches of one optimizer step are reduced.

    ``SYNC_EACH``: every microbatch's backward synchronises (DDP without ``no_sync``; the
    reduced gradients accumulate). ``NO_SYNC``: all but the last microbatch run inside
    ``no_sync()`` and accumulate locally; the last one's backward reduces the sum.
    ``NESTED_NO_SYNC``: the same, all but the last microbatch inside one ``no_sync()``, and
    every other one of them inside a second, nested ``no_sync()`` as well: leaving the
    inner one must restore "no sync", not switch synchronisation back on (torch's
    ``no_sync`` restores the previous ``require_backward_grad_sync``).
    """

    SYNC_EACH = "sync_each"
    NO_SYNC = "no_sync"
    NESTED_NO_SYNC = "nested_no_sync"


class Optimizer(StringEnum):
    """The scenario's optimizer (``catalog.procedure.make_optimizer``)."""

    SGD = "sgd"
    SGD_MOMENTUM = "sgd_momentum"
    ADAM = "adam"
    #: SGD sharded by ``ZeroRedundancyOptimizer`` (plain SGD for the oracle).
    ZERO_SGD = "zero_sgd"
    #: SGD registered with torch's ``_register_fused_optim``: each parameter is stepped in
    #: backward, right after its bucket is reduced (plain SGD for the oracle).
    FUSED_SGD = "fused_sgd"
    #: SGD applied in backward to the module before wrapping
    #: (``torch.distributed.optim._apply_optimizer_in_backward``): DDP must run it after
    #: each gradient's reduction, not on the local gradient (plain SGD for the oracle).
    IN_BACKWARD_SGD = "in_backward_sgd"


class Init(StringEnum):
    """How ranks build their initial weights: identical, or each its own (only DDP's init
    sync makes them equal)."""

    SAME = "same"
    PER_RANK = "per_rank"


class SyncStrategy(StringEnum):
    """Composer's gradient-accumulation sync strategies (``ddp_reference.SyncStrategy``)."""

    SINGLE_AUTO_SYNC = "single_auto_sync"
    MULTI_AUTO_SYNC = "multi_auto_sync"
    FORCED_SYNC = "forced_sync"


class CommHook(StringEnum):
    """torch's comm hooks a scenario may register (``catalog.procedure.make_comm_hook``)."""

    ALLREDUCE = "allreduce"
    FP16_COMPRESS = "fp16_compress"
    #: An allreduce whose future returns a new tensor (DDP must copy what it returns).
    ALLREDUCE_TO_NEW_TENSOR = "allreduce_to_new_tensor"
    POWERSGD = "powersgd"
    #: An allreduce that relies on the bucket's position (``index()``, ``is_last()``), as
    #: PowerSGD's iteration count does: it counts an iteration's buckets itself and scales
    #: a bucket by a power of two when the position the DDP reports differs.
    BUCKET_POSITION = "bucket_position"
    #: ``fp16_compress_wrapper(allreduce_hook)``: the allreduce hook on a float16 bucket.
    FP16_COMPRESS_WRAPPER = "fp16_compress_wrapper"
    #: PowerSGD at rank 4 with torch's defaults: small tensors left uncompressed, Q kept
    #: from the previous step (warm start), tensors of one shape batched.
    POWERSGD_WARM_START = "powersgd_warm_start"
    #: PowerSGD at rank 4 compressing from the first step, without error feedback or warm
    #: start (the configuration in which ``start_powerSGD_iter=1`` is allowed).
    POWERSGD_FROM_START = "powersgd_from_start"
    #: PowerSGD at rank 2 (Gram-Schmidt orthogonalization) with a tiny orthogonalization
    #: epsilon, warm-started, batched by shape.
    POWERSGD_RANK2 = "powersgd_rank2"
    #: PowerSGD over the whole bucket as one square matrix (``batched_powerSGD_hook``).
    BATCHED_POWERSGD = "batched_powersgd"
    #: ``post_localSGD_hook`` whose local subgroup is the whole DDP group: a global
    #: allreduce before ``start_localSGD_iter``, the subgroup's after; the same values.
    POST_LOCAL_SGD = "post_local_sgd"
    #: ``post_localSGD_hook`` with single-rank local subgroups, before its
    #: ``start_localSGD_iter``: the global allreduce every step.
    POST_LOCAL_SGD_BEFORE_START = "post_local_sgd_before_start"
    #: torch's C++ hooks, registered with ``_register_builtin_comm_hook``.
    BUILTIN_ALLREDUCE = "builtin_allreduce"
    BUILTIN_FP16_COMPRESS = "builtin_fp16_compress"
    #: ``debugging_hooks.noop_hook``: no communication, the local gradient stays (judged
    #: on data that is the same on every rank).
    NOOP = "noop"
    #: ``bf16_compress_hook``: a bfloat16 reduction (torch needs CUDA and NCCL for it).
    BF16_COMPRESS = "bf16_compress"
    #: An allreduce hook whose ``bucket`` is annotated as something else than
    #: ``dist.GradBucket``, and one whose return annotation is not
    #: ``torch.futures.Future[torch.Tensor]``: DDP refuses both at registration.
    MISANNOTATED_BUCKET = "misannotated_bucket"
    MISANNOTATED_RETURN = "misannotated_return"

    @property
    def builtin(self) -> bool:
        """Registered with ``_register_builtin_comm_hook``, not ``register_comm_hook``."""
        return self.value.startswith("builtin_")


class BufferHook(StringEnum):
    """Buffer comm hooks (``_register_buffer_comm_hook``,
    ``catalog.procedure.make_buffer_hook``)."""

    #: Broadcast every buffer from group rank 0 where DDP would (``PRE_FORWARD``): the same
    #: values as DDP's own broadcast, through the hook.
    BROADCAST_PRE_FORWARD = "broadcast_pre_forward"


class WrapperCopy(StringEnum):
    """How the wrapper is copied mid-run (torch's ``__getstate__``/``__setstate__``)."""

    PICKLE = "pickle"
    DEEPCOPY = "deepcopy"
    TORCH_SAVE = "torch_save"


@dataclass(frozen=True)
class JoinSpec:
    """Uneven inputs under ``torch.distributed.algorithms.Join``.

    Rank ``r`` runs ``max(1, steps - r * fewer_steps_per_rank)`` steps, so higher ranks
    run out of data first and join early; the keywords go to every joinable's hook.
    """

    fewer_steps_per_rank: int = 1
    divide_by_initial_world_size: bool = True
    throw_on_early_termination: bool = False

    def steps_for(self, rank: int, steps: int) -> int:
        return max(1, steps - rank * self.fewer_steps_per_rank)


@dataclass(frozen=True)
class Scenario:
    """One conformance scenario.

    ``model`` names a builder in :mod:`ddp_conformance.catalog.models`; ``init`` is ``"same"``
    (every rank builds identical weights) or ``"per_rank"`` (each rank seeds its own, so
    only DDP's init sync makes them equal). ``ddp_options`` go to the candidate's
    constructor. ``exact`` demands bitwise equality with the oracle (data chosen so every
    sum is exact in any order).
    """

    id: str
    model: str
    description: str = ""
    #: The DDP rule the scenario checks, in torch's semantics (one or two sentences): what
    #: a candidate that fails it must do. Printed with every failure of the scenario and in
    #: ``list``; every catalog scenario has one (``tests/test_rules.py``).
    rule: str = ""
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    steps: int = 3
    batch_size: int = 4
    microbatches: int = 1
    accumulate: Accumulate = Accumulate.SYNC_EACH
    optimizer: Optimizer = Optimizer.SGD
    lr: float = 0.05
    zero_grad_set_to_none: bool = True
    ddp_options: dict[str, Any] = field(default_factory=dict)
    init: Init = Init.SAME
    join: JoinSpec | None = None
    exact: bool = False
    seed: int = 1234
    min_world_size: int = 1
    #: Exact world sizes the scenario is defined for (process-group scenarios), if any.
    world_sizes: tuple[int, ...] | None = None
    #: Backends on which torch itself can run the scenario reliably, if not all (the
    #: reason is written next to the scenario).
    backends: tuple[str, ...] | None = None
    #: Device types the scenario means something on, if not all (the reason is written
    #: next to the scenario): ``("cpu",)`` for what DDP refuses of a CPU module.
    devices: tuple[str, ...] | None = None
    #: DDP process groups as global rank lists, created with ``new_group`` on every rank;
    #: each rank trains in the group holding it (idle if none). None: the world.
    groups: tuple[tuple[int, ...], ...] | None = None
    #: Check that each synced backward reduces every gradient element once (off for
    #: compressing comm hooks such as PowerSGD, and for sparse gradients).
    trace_volume: bool = True
    #: Composer's gradient-accumulation strategy driving the microbatches
    #: (``single_auto_sync``, ``multi_auto_sync``, ``forced_sync``), instead of ``accumulate``.
    sync_strategy: SyncStrategy | None = None
    #: A torch comm hook registered after wrapping: ``allreduce``, ``fp16_compress``,
    #: ``powersgd``.
    comm_hook: CommHook | None = None
    #: How many times the comm hook is registered (2: DDP must refuse the second).
    comm_hook_registrations: int = 1
    #: Tolerance override (norm-wise rtol) where the scenario changes the arithmetic, with
    #: the argument written next to the scenario.
    rtol: float | None = None
    #: Compare with the oracle after a rank has joined (off only where the procedure
    #: legitimately leaves the single-process trajectory then, said next to the scenario;
    #: the reference and replica checks still apply).
    oracle_after_join: bool = True
    #: An API contract whose behaviour IS a refusal (a comm hook registered twice, models
    #: that differ across ranks, a module without parameters, ``_set_static_graph`` after
    #: training): every rank must raise a clear error (one with a message), no hang, and no
    #: value check runs (the step that raised may have left its reduction unfinished). The
    #: value is torch's "Type: message" as a regular expression, demanded of the error only
    #: under ``--strict-messages``.
    expect_error: str | None = None
    #: A limit of torch's own implementation, not of DDP's semantics (a regular expression
    #: on torch's "Type: message"): here a candidate may refuse, as torch does (a clear
    #: error on every rank, no hang: "refused, like torch"; torch's text only under
    #: ``--strict-messages``), or go on and be judged on its values against the oracle,
    #: every rank and step, like any scenario ("beyond torch").
    torch_limit: str | None = None
    #: Rank ``r`` trains on ``batch_size + r * batch_size_step`` samples: uneven per-rank
    #: batches. DDP averages the per-rank *means* (each rank's loss is its own mean), which
    #: is not the sample-weighted mean over the global batch; the oracle computes DDP's.
    batch_size_step: int = 0
    #: Forwards per backward: the losses of ``forwards`` forwards (each on its own batch)
    #: are summed and one backward runs through all of them.
    forwards: int = 1
    #: Before every step but the first, one forward under ``torch.no_grad()`` with the
    #: model in ``eval()`` (BatchNorm on running statistics), as a validation pass does.
    eval_between_steps: bool = False
    #: Training forwards under ``torch.autocast`` with this dtype ("bfloat16"); the
    #: parameters (the master weights) stay in their dtype.
    autocast: str | None = None
    #: A buffer comm hook registered after wrapping (``_register_buffer_comm_hook``).
    buffer_comm_hook: BufferHook | None = None
    #: Before this step's ``zero_grad``, ``_update_process_group`` to a new group of the
    #: same ranks (created with ``new_group`` on every rank); training goes on over it.
    update_process_group_at: int | None = None
    #: Before step ``copy_wrapper_at`` the wrapper is copied this way and training goes on
    #: with the copy (a new module; the optimizer, plain SGD, is rebuilt over it).
    copy_wrapper: WrapperCopy | None = None
    copy_wrapper_at: int = 1
    #: Before this step's ``zero_grad``, ``wrapper.broadcast_buffers = False`` (torch's
    #: property: it sets ``forward_sync_buffers``): no buffer broadcast from this step's
    #: forwards on (``procedure.broadcasts``).
    broadcast_buffers_off_at: int | None = None
    #: After every backward, ``dist.barrier`` on the DDP group: the synchronisation a Gloo
    #: user needs before reading what ``delay_all_reduce_named_params`` reduces (torch's
    #: DDP launches that all-reduce and never waits for it; on NCCL the stream orders it,
    #: and Gloo's barrier waits for every earlier collective of the group).
    barrier_after_backward: bool = False
    #: Each microbatch's loss is back-propagated this many times before the step,
    #: ``retain_graph=True`` on all but the last (the local gradients accumulate).
    backwards: int = 1
    #: Before every step's microbatches, one forward inside ``no_sync()`` raises (the
    #: model's own forward, given a batch with one feature too many); the procedure catches
    #: the error outside the context and trains on. torch's ``no_sync`` restores
    #: synchronisation in a ``finally``: the step's backward reduces.
    raise_in_no_sync: bool = False
    #: The scenario costs seconds, not tens of milliseconds: N/A unless the run asks for the
    #: slow scenarios (``--slow``; the yardstick, benchmarks/torch_coverage.py, does).
    slow: bool = False
    #: The upstream bugs the scenario guards (``owner/repo#N``: a DDP that still has one
    #: fails the scenario), from ``catalog/history.py``; shown by ``list`` and in the reports.
    guards: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Convert the enum fields given by value, and refuse what cannot run."""
        convert: dict[str, type[StringEnum]] = {
            "accumulate": Accumulate, "optimizer": Optimizer, "init": Init,
            "sync_strategy": SyncStrategy, "comm_hook": CommHook,
            "buffer_comm_hook": BufferHook, "copy_wrapper": WrapperCopy}
        for name, enum_type in convert.items():
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, enum_type.convert(value, name, self.id))
        unknown = sorted(set(self.ddp_options) - set(DDP_OPTIONS))
        if unknown:
            raise ValueError(f"scenario {self.id!r}: unknown DDP options {unknown}; known: "
                             f"{', '.join(DDP_OPTIONS)}")
        for name, value, least in (("steps", self.steps, 1), ("batch_size", self.batch_size, 1),
                                   ("microbatches", self.microbatches, 1),
                                   ("min_world_size", self.min_world_size, 1),
                                   ("comm_hook_registrations", self.comm_hook_registrations, 1),
                                   ("forwards", self.forwards, 1),
                                   ("backwards", self.backwards, 1),
                                   ("batch_size_step", self.batch_size_step, 0)):
            if value < least:
                raise ValueError(f"scenario {self.id!r}: {name} must be at least {least}, "
                                 f"got {value}")
        if self.autocast not in (None, "bfloat16", "float16"):
            raise ValueError(f"scenario {self.id!r}: autocast={self.autocast!r} is not one of "
                             f"None, 'bfloat16', 'float16'")
        if self.copy_wrapper is not None and self.optimizer != Optimizer.SGD:
            raise ValueError(f"scenario {self.id!r}: copy_wrapper rebuilds the optimizer, so "
                             f"it needs the stateless optimizer 'sgd'")
        if self.expect_error is not None and self.torch_limit is not None:
            raise ValueError(f"scenario {self.id!r}: expect_error (every rank must raise) and "
                             f"torch_limit (a candidate may refuse or go on) exclude each other")
        bad = [g for g in self.guards if not _is_ref(g)]
        if bad:
            raise ValueError(f"scenario {self.id!r}: guards {bad} are not 'owner/repo#N'")
        if self.broadcast_buffers_off_at is not None and self.join is not None:
            raise ValueError(f"scenario {self.id!r}: broadcast_buffers_off_at under Join is not "
                             f"modelled (a joined rank's shadow forwards sync buffers too)")
        if self.eval_between_steps and self.join is not None:
            raise ValueError(f"scenario {self.id!r}: eval_between_steps under Join is not "
                             f"modelled (joined ranks shadow no eval forward)")

    @property
    def may_raise(self) -> bool:
        """Whether a rank's error is part of the scenario (expected, or a torch limit)
        rather than the candidate's ERROR."""
        return self.expect_error is not None or self.torch_limit is not None

    def batch_size_for(self, rank: int) -> int:
        """The batch size of ``rank`` (``batch_size_step`` makes it grow with the rank)."""
        return self.batch_size + rank * self.batch_size_step

    @property
    def needs(self) -> frozenset[str]:
        needs: set[str] = {Capability.option(name) for name in self.ddp_options}
        if self.accumulate is not Accumulate.SYNC_EACH and self.microbatches > 1:
            needs.add(Capability.NO_SYNC.value)
        if self.raise_in_no_sync:
            needs.add(Capability.NO_SYNC.value)
        if self.backwards > 1:
            needs.add(Capability.RETAIN_GRAPH.value)
        if self.join is not None:
            needs.add(Capability.JOIN.value)
        if self.sync_strategy is not None:
            needs.add(Capability.SYNC_STRATEGY.value)
        if self.comm_hook is not None:
            needs.add((Capability.BUILTIN_COMM_HOOK if self.comm_hook.builtin
                       else Capability.COMM_HOOK).value)
        if self.buffer_comm_hook is not None:
            needs.add(Capability.BUFFER_COMM_HOOK.value)
        if self.optimizer is Optimizer.FUSED_SGD:
            needs.add(Capability.FUSED_OPTIM.value)
        if self.update_process_group_at is not None:
            needs.add(Capability.UPDATE_PROCESS_GROUP.value)
        if self.copy_wrapper is not None:
            needs.add(Capability.PICKLE.value)
        if self.broadcast_buffers_off_at is not None:
            needs.add(Capability.SET_BROADCAST_BUFFERS.value)
        return frozenset(needs)

    def steps_for(self, group_rank: int) -> int:
        """How many optimizer steps the group's rank runs (fewer on high ranks under Join)."""
        return self.join.steps_for(group_rank, self.steps) if self.join else self.steps

    def groups_for(self, world_size: int) -> list[list[int]]:
        """The DDP groups (global ranks) at ``world_size``."""
        return [list(g) for g in self.groups] if self.groups else [list(range(world_size))]

    def unsupported_backend(self, backend: str) -> str:
        """Why the scenario cannot run on ``backend`` ('' if it can)."""
        if self.backends is not None and backend not in self.backends:
            return f"needs backend {' or '.join(self.backends)} (torch cannot run it on {backend})"
        return ""

    def unsupported_device(self, device: str) -> str:
        """Why the scenario means nothing on ``device`` (a device type; '' if it does)."""
        if self.devices is not None and device not in self.devices:
            return f"defined for {' or '.join(self.devices)} modules, not {device}"
        return ""

    def unsupported_world_size(self, world_size: int) -> str:
        """Why the scenario means nothing at ``world_size`` ('' if it does)."""
        if self.world_sizes is not None and world_size not in self.world_sizes:
            return f"defined for world size {' or '.join(map(str, self.world_sizes))}"
        if world_size < self.min_world_size:
            return f"needs world size >= {self.min_world_size}"
        return ""

    def broadcasts_buffers(self) -> bool:
        """Whether DDP broadcasts buffers before forwards (torch 2.13: ``forward_sync_buffers``
        wins over the deprecated ``broadcast_buffers``; both default to True)."""
        if self.ddp_options.get("forward_sync_buffers") is not None:
            return bool(self.ddp_options["forward_sync_buffers"])
        return self._broadcast_buffers()

    def init_syncs_buffers(self) -> bool:
        """Whether the constructor broadcasts rank 0's buffers: always when
        ``forward_sync_buffers`` is given, else as ``broadcast_buffers`` (torch 2.13's
        ``init_sync_buffers``), and never without ``init_sync``."""
        if not self.ddp_options.get("init_sync", True):
            return False
        if self.ddp_options.get("forward_sync_buffers") is not None:
            return True
        return self._broadcast_buffers()

    def _broadcast_buffers(self) -> bool:
        """The deprecated ``broadcast_buffers`` as torch 2.13 reads it (None: True)."""
        return self.ddp_options.get("broadcast_buffers") in (None, True)

    def init_seed(self, rank: int) -> int:
        """Seed of the model's initial weights on ``rank``."""
        return self.seed + (7919 * rank if self.init is Init.PER_RANK else 0)

    def data_seed(self, rank: int, step: int, microbatch: int) -> int:
        """Seed of one rank's batch: every process rebuilds any rank's batch from it."""
        return (self.seed * 1_000_003 + rank * 10_007 + step * 101 + microbatch + 1) % (2**63)


def _is_ref(ref: str) -> bool:
    """Whether ``ref`` reads ``owner/repo#N`` (an issue or pull request)."""
    repo, _, number = ref.partition("#")
    return repo.count("/") == 1 and all(repo.split("/")) and number.isdigit()


def missing_capabilities(scenario: Scenario, capabilities: frozenset[str]) -> str:
    """The N/A reason, or '' when the candidate has everything the scenario needs."""
    return _missing(scenario.needs, capabilities)
