"""Generated scenarios: hypothesis strategies over the catalog's models, options, procedures.

:func:`scenarios` draws a :class:`~ddp_conformance.catalog.scenario.Scenario` for one world
size: a model of the catalog, steps, batch size, microbatches under ``no_sync`` or a sync
strategy, optimizer, ``zero_grad`` both ways, per-rank initial weights, DDP process
groups (a group leaving a rank idle, groups side by side), every DDP option
(bucket caps down to tiny, ``gradient_as_bucket_view``, ``static_graph``,
``find_unused_parameters``, ``broadcast_buffers``), a comm hook, Join with uneven inputs and
both divisors. Every choice is ordered simplest first, so hypothesis shrinks a failing
scenario towards the plain one (an MLP, one step, no options) and what remains in the
shrunk scenario is what the failure needs.

A generated scenario is judged only where torch's own DDP passes it (``fuzz``): the
strategy may draw combinations torch refuses; they are set aside and counted, not filtered
here (what torch refuses is worth knowing).

Imported only by the fuzz command: hypothesis is not loaded for a conformance run.
"""
from __future__ import annotations

import hashlib
import random
from typing import Any

from hypothesis import strategies as st

# The blocks of the ``composed`` model (simplest first): a generated one chains 1 to 4.
from ddp_conformance.catalog.models.composed import BLOCKS
from ddp_conformance.catalog.scenario import (
    Accumulate,
    CommHook,
    Init,
    JoinSpec,
    Optimizer,
    Scenario,
    SyncStrategy,
)
from ddp_conformance.contract.capability import Capability

#: Models a generated scenario may use, simplest first, with the least world size each
#: needs to mean something (a parameter unused on rank 1 needs a rank 1).
MODELS: tuple[tuple[str, int], ...] = (
    ("mlp", 1), ("frozen", 1), ("tied", 1), ("used_twice", 1), ("many_tiny", 1),
    ("one_large", 1), ("mixed_dtypes", 1), ("conv_bn", 1), ("embedding", 1),
    ("nested_outputs", 1), ("unused_always_and_alternate", 1), ("unused_on_rank1", 2),
    ("unused_first_on_rank1", 2), ("random_buffer", 1), ("sparse_embedding", 1),
    ("dyadic", 1), ("fp16_overflow", 2), ("composed", 1), ("lstm", 1),
    ("resnet_channels_last", 1), ("moe", 1), ("freeze_mid_run", 1), ("gpt", 1),
    # The values real training meets (catalog/models/value_models.py). ``non_finite_grad`` puts
    # its inf and NaN in the last rank's batch, so it means something at every size.
    ("buffer_kinds", 1), ("mlp_float64", 1), ("complex", 1), ("mlp_bfloat16", 1),
    ("mlp_float16", 1), ("huge_tensor", 1), ("late_use", 1), ("non_finite_grad", 1),
    ("buffers_replaced", 1),
)
#: Models wholly in one low-precision dtype (not autocast). Their tolerance (the dtype's
#: rtol, judge/tolerance.py) holds for SGD and momentum, not for Adam, which scales the
#: rounding noise of a near-zero gradient up to a full step (measured there); a lossy hook's
#: float16 rtol would be tighter than bfloat16's, and autocast would make them mixed.
WHOLE_DTYPE_MODELS = frozenset({"mlp_float64", "mlp_bfloat16", "mlp_float16"})
LOW_PRECISION_MODELS = frozenset({"mlp_bfloat16", "mlp_float16"})
#: Complex parameters: float16 compression (``buffer.to(float16)``) would drop the
#: imaginary part of a complex bucket, and autocast leaves complex matmuls alone while
#: casting the float32 head: neither is drawn for them.
COMPLEX_MODELS = frozenset({"complex"})
#: A model whose step with non-finite gradients is undone by its ``after_step`` (the
#: parameters restored): optimizer state (momentum, Adam) would stay poisoned, and a lossy
#: hook could overflow a finite gradient to inf where the oracle has none. Plain SGD, no
#: lossy hook.
NON_FINITE_MODELS = frozenset({"non_finite_grad"})
#: ``gpt``'s activation checkpointing, none first.
CHECKPOINTS: tuple[str | None, ...] = (None, "non_reentrant", "reentrant")
#: Exact-valued models (every sum exact in any order: the candidate must match the oracle
#: bitwise) and the learning rate that keeps their updates exact, as in the catalog
#: (suites/test_gradients.py). They train with plain SGD and no compressing hook: momentum,
#: Adam and float16 compression leave the dyadic numbers.
EXACT_LR: dict[str, float] = {"dyadic": 0.0625, "fp16_overflow": 2.0**-16}
#: Models with a parameter unused on some iteration or rank: torch's DDP refuses them without
#: ``find_unused_parameters`` or ``static_graph`` by design ("Expected to have finished
#: reduction"; the catalog's errors/ scenarios check that), so a generated one sets one of
#: the two. Sparse gradients take plain SGD (torch's Adam refuses them, by design too).
UNUSED_MODELS = frozenset({"unused_always_and_alternate", "unused_on_rank1",
                           "unused_first_on_rank1", "moe", "freeze_mid_run", "late_use"})
SPARSE_MODELS = frozenset({"sparse_embedding"})
#: Models whose ranks leave different parameters without a gradient. Composer's
#: ``forced_sync`` allreduces each ``p.grad`` that is not None, so on these the ranks issue
#: different allreduces and desync, by Composer's design (its ``ddp_sync_context``): the
#: generator gives them the other strategies.
RANK_DEPENDENT_USE = frozenset({"unused_on_rank1", "unused_first_on_rank1", "moe"})
#: ``bucket_cap_mb`` values: torch's default (not passed), 1 MB, and tiny (a bucket per
#: parameter or smaller).
BUCKET_CAPS: tuple[float | None, ...] = (None, 1.0, 0.0001)
#: Comm hooks and the tolerance each needs (the catalog's argument, suites/test_comm_hooks.py:
#: fp16_compress reduces in float16, u = 2**-11, so float16's rtol). PowerSGD is left out: it
#: needs its own tolerance story per model, and torch hangs with it on tiny buckets on Gloo.
HOOKS: tuple[tuple[CommHook | None, float | None], ...] = (
    (None, None), (CommHook.ALLREDUCE, None), (CommHook.ALLREDUCE_TO_NEW_TENSOR, None),
    (CommHook.FP16_COMPRESS, 4e-3), (CommHook.BUILTIN_ALLREDUCE, None),
    (CommHook.POST_LOCAL_SGD, None), (CommHook.BUILTIN_FP16_COMPRESS, 4e-3),
    (CommHook.FP16_COMPRESS_WRAPPER, 4e-3), (CommHook.BUCKET_POSITION, None),
)
#: DDP's constructor options a generated scenario may pass.
DRAWN_OPTIONS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph",
                 "find_unused_parameters", "broadcast_buffers", "forward_sync_buffers",
                 "batched_grad_copy", "bucket_cap_mb_list")
#: Per-bucket caps (``bucket_cap_mb_list``, torch 2.13), tiny first.
BUCKET_CAP_LISTS: tuple[tuple[float, ...] | None, ...] = (None, (0.0001, 1.0), (0.0005, 0.0001))

#: DDP process groups a generated scenario may train in, per world size (None: the world):
#: a group that leaves a rank idle, and groups side by side (``new_group`` on every rank).
GROUPS: dict[int, tuple[tuple[tuple[int, ...], ...] | None, ...]] = {
    2: (None, ((1,),), ((0,),)),
    3: (None, ((1, 2),), ((0, 1),)),
    4: (None, ((0, 1), (2, 3)), ((1, 2, 3),)),
}


#: What DDP raises on a second ``register_comm_hook`` (the catalog's errors/ scenario).
TWICE_ERROR = r"can only be called once"


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """None (option not passed: torch's default) first, then the values."""
    return st.one_of(st.none(), value)


def admitted_models(world_size: int, capabilities: frozenset[str] | None = None) -> list[str]:
    """The models a scenario may use at ``world_size`` for a candidate with
    ``capabilities`` (None: every capability): a model with unused parameters needs
    ``find_unused_parameters`` or ``static_graph``."""
    unused_ok = capabilities is None or bool(
        {Capability.option("find_unused_parameters"), Capability.option("static_graph")}
        & capabilities)
    return [m for m, least in MODELS
            if least <= world_size and (unused_ok or m not in UNUSED_MODELS)]


@st.composite
def scenarios(draw: st.DrawFn, world_size: int,
              capabilities: frozenset[str] | None = None) -> Scenario:
    """One generated scenario that means something at ``world_size``, using only what a
    candidate with ``capabilities`` has (None: everything; :func:`fit`)."""
    model = draw(st.sampled_from(admitted_models(world_size, capabilities)))
    steps = draw(st.integers(1, 4))
    batch_size = draw(st.integers(1, 5))
    microbatches = draw(st.integers(1, 3))
    # Every choice is drawn whether it is used or not, so that the draws keep their places
    # when another one shrinks (the shrinker then reaches the simplest scenario). The
    # helpers below draw in this function's order.
    accumulate, sync_strategy = _draw_accumulation(draw, model, microbatches)
    exact = model in EXACT_LR
    optimizer = _draw_optimizer(draw, model, exact)
    options = _draw_options(draw, model)
    hook, rtol = draw(st.sampled_from(HOOKS))
    if exact and rtol is not None:  # a compressing hook leaves the exact numbers
        hook, rtol = None, None
    # Now and then the hook is registered twice: DDP must refuse the second on every rank
    # (torch: "register_comm_hook must only be called once"), as errors/ checks.
    twice = draw(st.integers(0, 3)) == 3 and hook is not None
    groups = draw(st.sampled_from(GROUPS.get(world_size, (None,))))
    newer = _draw_newer(draw)
    model_kwargs = _model_kwargs(model, newer, options)
    if rtol is not None and (model in LOW_PRECISION_MODELS | COMPLEX_MODELS | NON_FINITE_MODELS):
        hook, rtol = None, None
    optimizer, autocast = _settle_precision(model, exact, optimizer, rtol, newer)
    join = None
    if newer["uneven"] and world_size > 1 and steps > 1 and microbatches == 1:
        join = JoinSpec(fewer_steps_per_rank=newer["fewer"],
                        divide_by_initial_world_size=not newer["divide"])
    optimizer, surface = _draw_surface(draw, steps, microbatches, optimizer, hook is None,
                                       groups is None, join, exact)
    fields: dict[str, Any] = dict(
        model=model, steps=steps, batch_size=batch_size, microbatches=microbatches,
        accumulate=accumulate, sync_strategy=sync_strategy, optimizer=optimizer,
        zero_grad_set_to_none=not draw(st.booleans()), ddp_options=options,
        init=draw(st.sampled_from([Init.SAME, Init.PER_RANK])), join=join, comm_hook=hook,
        rtol=rtol, seed=draw(st.integers(0, 2**16)), groups=groups, model_kwargs=model_kwargs,
        # Join shadows one forward per iteration (its allreduce of the active ranks): torch
        # desyncs with several forwards per backward under Join, by design.
        forwards=newer["forwards"] if join is None else 1,
        eval_between_steps=newer["eval_between"] and join is None, autocast=autocast,
        batch_size_step=newer["batch_step"], **surface)
    if twice and hook is not None:  # the hook may have been dropped for the model since
        fields.update(comm_hook_registrations=2, expect_error=TWICE_ERROR)
    if exact:
        fields.update(exact=True, lr=EXACT_LR[model])
    if capabilities is not None:
        fields = fit(fields, capabilities)
    return Scenario(id=generated_id(fields), **fields)


def fit(fields: dict[str, Any], capabilities: frozenset[str]) -> dict[str, Any]:
    """The drawn ``fields`` without what a candidate with ``capabilities`` lacks, each
    feature put back to torch's default (an option not passed, no ``no_sync``, no sync
    strategy, Join, comm hook, buffer hook, fused optimizer, process-group update or copy):
    every choice is still drawn, so hypothesis shrinks as before, and the scenario is one
    the candidate can run rather than an N/A that costs torch's run all the same."""
    fields = dict(fields)
    fields["ddp_options"] = {k: v for k, v in fields["ddp_options"].items()
                             if Capability.option(k) in capabilities}
    lacks = {c for c in Capability if c.value not in capabilities}
    if Capability.NO_SYNC in lacks and fields["accumulate"] is Accumulate.NO_SYNC:
        fields["accumulate"] = Accumulate.SYNC_EACH
    if Capability.SYNC_STRATEGY in lacks:
        fields["sync_strategy"] = None
    if Capability.JOIN in lacks:
        fields["join"] = None
    hook = fields["comm_hook"]
    if hook is not None and (Capability.BUILTIN_COMM_HOOK if hook.builtin
                             else Capability.COMM_HOOK) in lacks:
        fields.update(comm_hook=None, rtol=None)
        if fields.pop("comm_hook_registrations", None):
            fields.pop("expect_error")
    for capability, names in ((Capability.BUFFER_COMM_HOOK, ("buffer_comm_hook",)),
                              (Capability.UPDATE_PROCESS_GROUP, ("update_process_group_at",)),
                              (Capability.PICKLE, ("copy_wrapper", "copy_wrapper_at"))):
        if capability in lacks:
            for name in names:
                fields.pop(name, None)
    if Capability.FUSED_OPTIM in lacks and fields["optimizer"] is Optimizer.FUSED_SGD:
        fields["optimizer"] = Optimizer.SGD
    return fields


#: The capabilities whose features the generator draws (besides the options).
DRAWN_CAPABILITIES = (Capability.NO_SYNC, Capability.SYNC_STRATEGY, Capability.JOIN,
                      Capability.COMM_HOOK, Capability.BUILTIN_COMM_HOOK,
                      Capability.BUFFER_COMM_HOOK, Capability.UPDATE_PROCESS_GROUP,
                      Capability.PICKLE, Capability.FUSED_OPTIM)
#: Every feature the generator draws, as capabilities (:func:`fit` keeps what is in a set).
DRAWN_FEATURES = frozenset({c.value for c in DRAWN_CAPABILITIES}
                           | {Capability.option(o) for o in DRAWN_OPTIONS})


def swarm(capabilities: frozenset[str] | None, rng: random.Random) -> frozenset[str]:
    """Swarm testing (Groce et al., ISSTA 2012): the capabilities a round draws with, each
    feature of :data:`DRAWN_FEATURES` that ``capabilities`` has (None: all of them) kept
    with probability 1/2. A round without some features draws the others more often and
    in more combinations (a rare pair meets sooner), and each seed gets its own rounds."""
    base = DRAWN_FEATURES if capabilities is None else capabilities
    return frozenset(c for c in base if c not in DRAWN_FEATURES or rng.random() < 0.5)


def excluded(world_size: int, capabilities: frozenset[str]) -> list[str]:
    """What :func:`scenarios` leaves out for a candidate with ``capabilities``, in words
    (the capabilities it lacks that the generator draws, and the models that need them)."""
    words = sorted(c.value for c in DRAWN_CAPABILITIES if c.value not in capabilities)
    options = sorted(o for o in DRAWN_OPTIONS if Capability.option(o) not in capabilities)
    if options:
        words.append("options " + ", ".join(options))
    models = sorted(set(admitted_models(world_size)) - set(admitted_models(world_size,
                                                                            capabilities)))
    if models:
        words.append("models " + ", ".join(models))
    return words


def _draw_accumulation(draw: st.DrawFn, model: str,
                       microbatches: int) -> tuple[Accumulate, SyncStrategy | None]:
    """How the microbatches accumulate: each synced, under ``no_sync``, or a sync
    strategy (forced_sync only where every rank uses the same parameters)."""
    how = draw(st.sampled_from(["sync_each", "no_sync", *(s.value for s in SyncStrategy)]))
    accumulate, sync_strategy = Accumulate.SYNC_EACH, None
    if microbatches > 1 and how == "no_sync":
        accumulate = Accumulate.NO_SYNC
    elif microbatches > 1 and how != "sync_each":
        sync_strategy = SyncStrategy(how)
        if sync_strategy == SyncStrategy.FORCED_SYNC and model in RANK_DEPENDENT_USE:
            sync_strategy = SyncStrategy.MULTI_AUTO_SYNC
    return accumulate, sync_strategy


def _draw_optimizer(draw: st.DrawFn, model: str, exact: bool) -> Optimizer:
    """The optimizer, plain SGD where the model needs it (exact numbers, sparse or
    non-finite gradients), no Adam on a low-precision model."""
    optimizer = draw(st.sampled_from([Optimizer.SGD, Optimizer.SGD_MOMENTUM, Optimizer.ADAM]))
    if exact or model in SPARSE_MODELS or model in NON_FINITE_MODELS:
        optimizer = Optimizer.SGD
    if optimizer is Optimizer.ADAM and model in LOW_PRECISION_MODELS:
        optimizer = Optimizer.SGD_MOMENTUM
    return optimizer


def _draw_options(draw: st.DrawFn, model: str) -> dict[str, Any]:
    """DDP's constructor options (those not drawn are not passed: torch's defaults)."""
    options: dict[str, Any] = {}
    cap = draw(st.sampled_from(BUCKET_CAPS))
    if cap is not None:
        options["bucket_cap_mb"] = cap
    for name in DRAWN_OPTIONS[1:-1]:
        value = draw(_maybe(st.booleans()))
        if value is not None:
            options[name] = value
    cap_list = draw(st.sampled_from(BUCKET_CAP_LISTS))
    if cap_list is not None:
        options["bucket_cap_mb_list"] = list(cap_list)
    if model in UNUSED_MODELS and not options.get("static_graph"):
        options["find_unused_parameters"] = True
    return options


def _draw_newer(draw: st.DrawFn) -> dict[str, Any]:
    """The model's own choices and the procedure's newer ones (drawn always, see
    :func:`scenarios`), by name."""
    return dict(
        blocks=tuple(draw(st.lists(st.sampled_from(list(BLOCKS)), min_size=1, max_size=4))),
        checkpoint=draw(st.sampled_from(CHECKPOINTS)), forwards=draw(st.integers(1, 2)),
        eval_between=draw(st.booleans()), autocast=draw(st.sampled_from([None, "bfloat16"])),
        batch_step=draw(st.integers(0, 2)), uneven=draw(st.booleans()),
        fewer=draw(st.integers(1, 2)), divide=draw(st.booleans()),
        # ``late_use``: the step its late layer joins the forward (within the 1 to 4 steps).
        first_use=draw(st.integers(0, 3)))


def _model_kwargs(model: str, newer: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The model's keyword arguments from the drawn choices (a reentrant checkpoint drops
    ``find_unused_parameters`` from ``options``)."""
    model_kwargs: dict[str, Any] = {}
    if model == "composed":
        model_kwargs["blocks"] = newer["blocks"]
    elif model == "gpt" and newer["checkpoint"] is not None:
        model_kwargs["checkpoint"] = newer["checkpoint"]
        if newer["checkpoint"] == "reentrant":  # torch refuses it with find_unused_parameters
            options.pop("find_unused_parameters", None)
    if model == "late_use":
        model_kwargs["first_use"] = newer["first_use"]
    return model_kwargs


def _settle_precision(model: str, exact: bool, optimizer: Optimizer, rtol: float | None,
                      newer: dict[str, Any]) -> tuple[Optimizer, str | None]:
    """The optimizer and autocast once the hook's rounding and the model's dtypes are
    known: what would make the oracle's tolerance meaningless is set aside."""
    autocast = newer["autocast"]
    if rtol is not None and optimizer is Optimizer.ADAM:
        # Adam divides by sqrt(v): where a gradient element is small, a lossy hook's
        # relative rounding (float16's u on the summed magnitude) becomes an O(u / |g|)
        # change of the update, past any rtol argued from u (set aside by torch's DDP
        # itself in fuzz runs); momentum SGD keeps the update linear in the gradient.
        optimizer = Optimizer.SGD_MOMENTUM
    if model in WHOLE_DTYPE_MODELS | COMPLEX_MODELS:
        autocast = None
    if exact:  # autocast leaves the exact numbers; several forwards keep them
        autocast = None
    if rtol is not None:
        # No autocast with a lossy hook: the hook's rounding (float16's u, 2**-11) moves
        # the parameters enough to flip the bfloat16 rounding autocast gives many weights in
        # the next forward; on a BatchNorm model with small batches the free-running
        # trajectories then part chaotically (measured, torch and the reference alike, on
        # the channels_last ResNet at batch 1: 1.6% norm-wise at step 1, 20% at step 2), so
        # no tolerance would tell a defect from it.
        autocast = None
    if optimizer is Optimizer.ADAM and model == "composed" and "float16" in newer["blocks"]:
        # Adam's eps (1e-8) is 0 in float16: a gradient element that is exactly 0 gives
        # 0/0 = NaN in a float16 parameter, in torch and the oracle alike. Real training
        # keeps float32 master weights for that; the generator keeps SGD.
        optimizer = Optimizer.SGD_MOMENTUM
    return optimizer, autocast


def _draw_surface(draw: st.DrawFn, steps: int, microbatches: int, optimizer: Optimizer,
                  no_hook: bool, world_group: bool, join: JoinSpec | None,
                  exact: bool) -> tuple[Optimizer, dict[str, Any]]:
    """torch 2.13's surface beyond the options (drawn always, used where they compose):
    a buffer comm hook (it broadcasts from rank 0, not Join's authoritative rank), the
    fused optimizer (torch: no accumulation, no comm hook with it), a process-group
    update at a step, a copy of the wrapper (default group only; torch's copy keeps no
    comm hook, so none is drawn with it). ``no_hook``: the scenario registers no comm
    hook; ``world_group``: it trains in the default group."""
    buffer_hook = draw(st.booleans())
    fused = draw(st.booleans())
    update_at = draw(_maybe(st.integers(0, 3)))
    copy_how, copy_at = draw(_maybe(st.sampled_from(["pickle", "deepcopy", "torch_save"]))), \
        draw(st.integers(1, 3))
    surface: dict[str, Any] = {}
    if buffer_hook and join is None:
        surface["buffer_comm_hook"] = "broadcast_pre_forward"
    if fused and optimizer is Optimizer.SGD and microbatches == 1 and no_hook \
            and join is None and not exact:
        optimizer = Optimizer.FUSED_SGD
    if update_at is not None and update_at < steps and join is None:
        surface["update_process_group_at"] = update_at
    if copy_how is not None and copy_at < steps and optimizer is Optimizer.SGD \
            and no_hook and join is None and world_group and not surface:
        surface.update(copy_wrapper=copy_how, copy_wrapper_at=copy_at)
    return optimizer, surface


def generated_id(fields: dict[str, Any]) -> str:
    """``fuzz/<digest>``: the same fields, the same id (the runner caches by id)."""
    digest = hashlib.sha1(repr(sorted(fields.items())).encode()).hexdigest()[:10]
    return f"fuzz/{fields['model']}-{digest}"


#: Scenario fields as the catalog writes them, in that order; a field at its default is
#: left out of the literal.
_LITERAL_ORDER = ("model", "model_kwargs", "exact", "lr", "steps", "batch_size",
                  "batch_size_step", "microbatches", "forwards", "backwards",
                  "raise_in_no_sync", "eval_between_steps",
                  "autocast", "accumulate",
                  "sync_strategy", "optimizer", "zero_grad_set_to_none", "ddp_options", "init",
                  "join", "comm_hook", "comm_hook_registrations", "expect_error", "rtol",
                  "trace_volume",
                  "buffer_comm_hook", "update_process_group_at", "copy_wrapper",
                  "copy_wrapper_at", "broadcast_buffers_off_at", "barrier_after_backward",
                  "torch_limit", "groups", "seed")


def scenario_literal(scenario: Scenario, scenario_id: str = "") -> str:
    """The ``Scenario(...)`` to paste into a ``suites/`` file (fields at their defaults
    left out; enum fields by value, as the catalog writes them)."""
    defaults = Scenario("x", "mlp")
    args = [repr(scenario_id or scenario.id)]
    for name in _LITERAL_ORDER:
        value = getattr(scenario, name)
        if name != "model" and value == getattr(defaults, name):
            continue
        if hasattr(value, "value") and isinstance(value.value, str):
            value = value.value
        text = repr(value)
        args.append(text if name == "model" else f"{name}={text}")
    return "Scenario(" + ", ".join(args) + ")"
