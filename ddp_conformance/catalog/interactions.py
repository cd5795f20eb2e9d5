"""The catalog's dimensions: what a scenario chooses, as data, and how to read the choice
from any :class:`~ddp_conformance.catalog.scenario.Scenario`.

A :class:`Dimension` names one choice (an option, a procedure, a comm hook, a kind of
model), its values, each with the phrase of torch's semantics it stands for, and
``read``: the values a scenario takes in it, computed from the scenario's fields (so every
catalog scenario counts, whoever wrote it). A scenario takes one value in most dimensions;
a model may carry several features at once (BatchNorm buffers and a tied weight), and a
hook or model outside a dimension's values takes none there.

Pairs of values of two dimensions, which of them torch can run (``catalog/exclusions.py``),
and how many the catalog covers (``catalog/pairs.py``) build on this table.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from ddp_conformance.catalog.scenario import Scenario

Values = frozenset[str]


@dataclass(frozen=True)
class Dimension:
    """One choice of a scenario: ``values`` maps each value to the phrase of torch's
    semantics it stands for (composed into generated scenarios' rules); ``read`` gives the
    values a scenario takes."""

    name: str
    about: str
    values: dict[str, str]
    read: Callable[[Scenario], Values]


def _option(name: str, default: bool) -> Callable[[Scenario], Values]:
    """A boolean constructor option read as ``on`` / ``off`` (not passed: torch's default)."""
    def read(s: Scenario) -> Values:
        value = s.ddp_options.get(name)
        return frozenset({"on" if (default if value is None else bool(value)) else "off"})

    return read


#: A bucket cap at or below this (MB) gives the catalog's models several buckets.
TINY_CAP_MB = 0.01


def _bucket_cap(s: Scenario) -> Values:
    caps = [s.ddp_options.get("bucket_cap_mb")] + list(s.ddp_options.get("bucket_cap_mb_list")
                                                         or [])
    tiny = any(c is not None and c <= TINY_CAP_MB for c in caps)
    return frozenset({"tiny" if tiny else "default"})


def _broadcast(s: Scenario) -> Values:
    return frozenset({"on" if s.broadcasts_buffers() else "off"})


def _precision(s: Scenario) -> Values:
    if "mixed_precision" in s.ddp_options:
        return frozenset({"mixed_precision"})
    return frozenset({"autocast" if s.autocast else "full"})


def _accumulation(s: Scenario) -> Values:
    if s.microbatches == 1:
        return frozenset({"one_microbatch"})
    if s.sync_strategy is not None:
        return frozenset({str(s.sync_strategy)})
    return frozenset({str(s.accumulate)})


def _join(s: Scenario) -> Values:
    return frozenset({"uneven" if s.join is not None else "off"})


def _forwards(s: Scenario) -> Values:
    return frozenset({"several" if s.forwards > 1 else "one"})


def _eval(s: Scenario) -> Values:
    return frozenset({"on" if s.eval_between_steps else "off"})


def _saved(s: Scenario) -> Values:
    return frozenset({"saved_mid_run" if s.copy_wrapper is not None else "none"})


def _set_to_none(s: Scenario) -> Values:
    return frozenset({"none" if s.zero_grad_set_to_none else "zeros"})


def _optimizer(s: Scenario) -> Values:
    return frozenset({str(s.optimizer)})


#: The comm hooks the dimension holds (others, such as PowerSGD whose tolerance is argued
#: per model, take no value in it).
HOOKS = ("allreduce", "allreduce_to_new_tensor", "fp16_compress", "builtin_allreduce",
         "builtin_fp16_compress", "bucket_position")


def _hook(s: Scenario) -> Values:
    if s.comm_hook is None:
        return frozenset({"none"})
    return frozenset({str(s.comm_hook)}) & frozenset(HOOKS)


#: Models whose parameters go without a gradient on some rank or step, and those with an
#: output left out of the loss (so the parameters producing it get none).
UNUSED_PARAMETER_MODELS = frozenset({"unused_on_rank1", "unused_first_on_rank1",
                                     "unused_always_and_alternate", "moe", "freeze_mid_run",
                                     "late_use"})
UNUSED_OUTPUT_MODELS = frozenset({"nested_outputs_aux_left_out"})
#: Models that reassign their buffers in forward rather than updating them in place.
REPLACED_BUFFER_MODELS = frozenset({"buffers_replaced"})
LOW_PRECISION = (torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=None)
def _structure(model: str, kwargs: tuple[tuple[str, object], ...]) -> Values:
    """The structural features of a model, read from the module it builds: buffers, a
    parameter used under two names (tied), float16/bfloat16 parameters, several floating
    dtypes, a sparse embedding."""
    from ddp_conformance.catalog.models import get_model

    spec = get_model(model)
    kw = dict(kwargs, rank=0) if spec.rank_aware else dict(kwargs)
    with torch.random.fork_rng():
        module: nn.Module = spec.build(**kw)
    params = list(module.parameters())
    features = set()
    if list(module.buffers()):
        features.add("buffers_in_place")
    if len(list(module.named_parameters(remove_duplicate=False))) > len(params):
        features.add("tied")
    dtypes = {p.dtype for p in params if p.is_floating_point()}
    if dtypes & set(LOW_PRECISION):
        features.add("low_precision")
    if len(dtypes) > 1:
        features.add("mixed_dtypes")
    if any(isinstance(m, nn.Embedding) and m.sparse for m in module.modules()):
        features.add("sparse")
    if any(p.is_complex() for p in params):
        features.add("complex")  # no value of the dimension: a model of its own kind
    return frozenset(features)


def _model(s: Scenario) -> Values:
    features = set(_structure(s.model, tuple(sorted(s.model_kwargs.items(), key=str))))
    if s.model in REPLACED_BUFFER_MODELS:
        features = (features - {"buffers_in_place"}) | {"buffers_replaced"}
    if s.model in UNUSED_PARAMETER_MODELS:
        features.add("unused_parameters")
    if s.model in UNUSED_OUTPUT_MODELS:
        features.add("unused_output")
    if not features:
        features.add("plain")
    return frozenset(features) & frozenset(MODEL_VALUES)


MODEL_VALUES: dict[str, str] = {
    "plain": "a float32 model whose every parameter is used once",
    "buffers_in_place": "BatchNorm buffers updated in place are broadcast from rank 0 "
                        "before forwards",
    "buffers_replaced": "buffers reassigned in forward are the module's buffers DDP "
                        "broadcasts",
    "unused_parameters": "a parameter unused on a rank is marked ready with a zero "
                         "contribution",
    "unused_output": "parameters behind an output left out of the loss get no gradient "
                     "anywhere",
    "tied": "a weight shared by two layers is one parameter, reduced once",
    "low_precision": "a bfloat16 model is reduced in bfloat16",
    "mixed_dtypes": "float32 and float64 parameters sit in buckets of their own dtype",
    "sparse": "sparse embedding gradients are reduced as sparse tensors",
}


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("bucket_cap", "bucket_cap_mb: torch's default, or tiny (a bucket per "
              "parameter)", {"default": "every gradient fits torch's default buckets",
                             "tiny": "tiny buckets reduce each parameter on its own"},
              _bucket_cap),
    Dimension("gradient_as_bucket_view", "gradients as views of the buckets",
              {"off": "gradients are tensors of their own",
               "on": "gradients are views into the buckets"},
              _option("gradient_as_bucket_view", False)),
    Dimension("static_graph", "static_graph", {
        "off": "the graph is traced every iteration",
        "on": "the first iteration's graph is recorded and replayed"},
        _option("static_graph", False)),
    Dimension("find_unused_parameters", "find_unused_parameters", {
        "off": "every parameter is expected to get a gradient",
        "on": "the autograd graph is searched for unused parameters"},
        _option("find_unused_parameters", False)),
    Dimension("broadcast_buffers", "buffers broadcast from rank 0 before forwards "
              "(broadcast_buffers, forward_sync_buffers)", {
                  "on": "buffers follow rank 0 at every synced forward",
                  "off": "each rank keeps its own buffers"}, _broadcast),
    Dimension("precision", "the forward's precision: full, autocast bfloat16, or DDP's "
              "mixed_precision", {
                  "full": "forwards run in the parameters' dtype",
                  "autocast": "forwards run under bfloat16 autocast",
                  "mixed_precision": "DDP casts parameters for forward and backward"},
              _precision),
    Dimension("accumulation", "how the microbatches of a step are reduced", {
        "one_microbatch": "one microbatch per step",
        "sync_each": "each microbatch's reduced gradient accumulates",
        "no_sync": "microbatches inside no_sync accumulate locally until the synced one",
        "nested_no_sync": "leaving a nested no_sync keeps sync off",
        "single_auto_sync": "Composer's single_auto_sync reduces the last microbatch only",
        "multi_auto_sync": "Composer's multi_auto_sync reduces every microbatch",
        "forced_sync": "Composer's forced_sync reduces by hand after the last backward"},
        _accumulation),
    Dimension("join", "Join with uneven inputs", {
        "off": "every rank runs every step",
        "uneven": "ranks that ran out of data shadow the reductions under Join"}, _join),
    Dimension("forwards", "forwards per backward", {
        "one": "one forward per backward",
        "several": "two forwards' losses summed before one backward"}, _forwards),
    Dimension("eval_between_steps", "an eval forward under no_grad between steps", {
        "off": "training forwards only",
        "on": "an eval forward between steps broadcasts buffers and leaves the next "
              "forward unsynced"}, _eval),
    Dimension("checkpointing", "the wrapper saved and reloaded mid-run (pickle, "
              "deepcopy, torch.save); the copy trains on", {
                  "none": "one wrapper trains throughout",
                  "saved_mid_run": "a wrapper saved and reloaded mid-run trains on"},
              _saved),
    Dimension("set_to_none", "zero_grad(set_to_none=True) or zeroed gradients", {
        "none": "zero_grad sets gradients to None",
        "zeros": "zero_grad leaves zero tensors the next reduction fills"}, _set_to_none),
    Dimension("optimizer", "the optimizer", {
        "sgd": "plain SGD", "sgd_momentum": "SGD with momentum",
        "adam": "Adam", "zero_sgd": "ZeroRedundancyOptimizer shards the step",
        "fused_sgd": "a fused optimizer steps each parameter after its bucket",
        "in_backward_sgd": "an optimizer applied in backward"}, _optimizer),
    Dimension("comm_hook", "the comm hook, Python or torch's C++ built-in", {
        "none": "DDP's own allreduce",
        "allreduce": "a Python allreduce hook",
        "allreduce_to_new_tensor": "a hook returning a new tensor DDP copies back",
        "fp16_compress": "a Python float16-compressing hook",
        "builtin_allreduce": "torch's C++ allreduce hook",
        "builtin_fp16_compress": "torch's C++ float16-compressing hook",
        "bucket_position": "a hook relying on bucket.index() and is_last() sees buckets "
                           "numbered in order, the last flagged"}, _hook),
    Dimension("model", "what the model holds", MODEL_VALUES, _model),
)

BY_NAME: dict[str, Dimension] = {d.name: d for d in DIMENSIONS}


def read(scenario: Scenario) -> dict[str, Values]:
    """Every dimension's values for ``scenario``."""
    return {d.name: d.read(scenario) for d in DIMENSIONS}

