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
UNUSED_OUTPUT_MODELS = frozenset({"nested_outputs_aux_left_out", "two_heads_one_left_out"})
#: Models that reassign their buffers in forward rather than updating them in place.
REPLACED_BUFFER_MODELS = frozenset({"buffers_replaced"})
LOW_PRECISION = (torch.float16, torch.bfloat16)


@functools.cache
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
    "plain": "a float32 model whose parameters each get one dense gradient per backward",
    "buffers_in_place": "BatchNorm's running statistics, updated in place, follow rank 0's "
                        "copy wherever DDP broadcasts buffers",
    "buffers_replaced": "buffers reassigned to new tensors in forward are still the "
                        "module's own, which DDP broadcasts",
    "unused_parameters": "a branch one rank skips is marked ready with nothing from that "
                         "rank, and averaged over all ranks",
    "unused_output": "parameters behind an output left out of the loss never get "
                     "a gradient anywhere",
    "tied": "a weight two layers share is one parameter with one gradient, summed over its "
            "uses and reduced once",
    "low_precision": "bfloat16 parameters are bucketed and reduced in bfloat16, rounded to "
                     "its 8-bit significand",
    "mixed_dtypes": "float32 and float64 parameters go to separate buckets, one dtype "
                    "per bucket",
    "sparse": "a sparse embedding's gradient is reduced as a sparse tensor, its rows "
              "gathered from every rank",
}

_CAP = {"default": "torch's default cap puts these small models' gradients in one bucket",
        "tiny": "100-byte bucket caps launch one allreduce per parameter as it becomes "
                "ready"}
_VIEW = {"off": "each .grad is its own tensor, copied out of the bucket after reduction",
         "on": "each .grad is a view into its bucket, written by the reduction itself"}
_STATIC = {"off": "DDP searches nothing in advance and rebuilds buckets in gradient order "
                  "after the first step",
           "on": "static_graph records the first iteration's hooks and replays them, "
                 "delaying that iteration's allreduce"}
_UNUSED = {"off": "without find_unused_parameters every parameter must produce a gradient",
           "on": "find_unused_parameters walks the autograd graph from the outputs after "
                 "each forward"}
_BROADCAST = {"on": "rank 0's buffers overwrite the others' before each synced forward",
              "off": "with broadcast_buffers off every rank keeps the buffers its own "
                     "forwards produced"}
_PRECISION = {"full": "forwards compute in the parameters' own dtype",
              "autocast": "forwards under bfloat16 autocast produce bfloat16 activations "
                          "for float32 master weights",
              "mixed_precision": "DDP's mixed_precision casts parameters for forward and "
                                 "backward and reduces in reduce_dtype"}
_ACCUMULATION = {
    "one_microbatch": "each optimizer step runs one forward and backward",
    "sync_each": "each of three microbatches reduces its gradient, and the reduced "
                 "gradients accumulate",
    "no_sync": "microbatches inside no_sync accumulate locally, and the final synced one "
               "reduces the sum",
    "nested_no_sync": "leaving an inner no_sync inside an outer one restores no-sync "
                      "rather than switching reduction on",
    "single_auto_sync": "single_auto_sync (Composer) defers reduction to the closing "
                        "microbatch through no_sync",
    "multi_auto_sync": "Composer's multi_auto_sync reduces during all three backwards, "
                       "summing what they reduced",
    "forced_sync": "forced_sync (Composer) runs the whole step under no_sync, then calls "
                   "all_reduce on every .grad by hand"}
_JOIN = {"off": "every rank has data for every step",
         "uneven": "under Join, ranks that ran out of data shadow the active ranks' "
                   "allreduces with zeros"}
_FORWARDS = {"one": "one forward feeds each backward",
             "several": "two forwards' losses are summed before a single backward"}
_EVAL = {"off": "no forward runs outside training",
         "on": "an eval forward under no_grad between steps takes the buffer broadcast, "
               "leaving the next training forward without one"}
_SAVED = {"none": "one wrapper object trains from start to end",
          "saved_mid_run": "a wrapper saved with torch.save and loaded after a step builds "
                           "a fresh reducer that trains on"}
_ZERO = {"none": "zero_grad(set_to_none=True) leaves .grad None until the next reduction "
                 "creates it",
         "zeros": "zero_grad(set_to_none=False) keeps zeroed tensors that the next "
                  "reduction overwrites"}
_OPTIMIZER = {
    "sgd": "plain SGD steps on the averaged gradient",
    "sgd_momentum": "momentum SGD carries the averaged gradients of earlier steps",
    "adam": "Adam scales each averaged gradient by its running second moment",
    "zero_sgd": "ZeroRedundancyOptimizer steps each rank's shard and broadcasts the "
                "updated parameters",
    "fused_sgd": "the fused optimizer steps each parameter inside backward, right after "
                 "its bucket's allreduce",
    "in_backward_sgd": "an optimizer applied in backward steps each parameter on its "
                       "reduced gradient"}
_HOOK = {
    "none": "DDP's own allreduce averages each bucket",
    "allreduce": "allreduce_hook divides every bucket by world size, then sums it across "
                 "ranks, all from Python",
    "allreduce_to_new_tensor": "a hook whose future returns a new tensor has it copied "
                               "back into the bucket",
    "fp16_compress": "fp16_compress_hook halves the wire: float16 sums, cast back to the "
                     "gradients' dtype afterwards",
    "builtin_allreduce": "_register_builtin_comm_hook(ALLREDUCE) averages buckets inside "
                         "the C++ reducer, no Python callback",
    "builtin_fp16_compress": "the C++ FP16_COMPRESS built-in casts buckets to half "
                             "precision before summing, then restores them",
    "bucket_position": "a hook counting buckets by index() and is_last() sees them "
                       "numbered in launch order, the last one flagged"}


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("bucket_cap", "bucket_cap_mb: torch's default, or tiny (a bucket per "
              "parameter)", _CAP, _bucket_cap),
    Dimension("gradient_as_bucket_view", "gradients as views of the buckets", _VIEW,
              _option("gradient_as_bucket_view", False)),
    Dimension("static_graph", "static_graph", _STATIC, _option("static_graph", False)),
    Dimension("find_unused_parameters", "find_unused_parameters", _UNUSED,
              _option("find_unused_parameters", False)),
    Dimension("broadcast_buffers", "buffers broadcast from rank 0 before forwards "
              "(broadcast_buffers, forward_sync_buffers)", _BROADCAST, _broadcast),
    Dimension("precision", "the forward's precision: full, autocast bfloat16, or DDP's "
              "mixed_precision", _PRECISION, _precision),
    Dimension("accumulation", "how the microbatches of a step are reduced", _ACCUMULATION,
              _accumulation),
    Dimension("join", "Join with uneven inputs", _JOIN, _join),
    Dimension("forwards", "forwards per backward", _FORWARDS, _forwards),
    Dimension("eval_between_steps", "an eval forward under no_grad between steps", _EVAL,
              _eval),
    Dimension("checkpointing", "the wrapper saved and reloaded mid-run (pickle, deepcopy, "
              "torch.save); the copy trains on", _SAVED, _saved),
    Dimension("set_to_none", "zero_grad(set_to_none=True) or zeroed gradients", _ZERO,
              _set_to_none),
    Dimension("optimizer", "the optimizer", _OPTIMIZER, _optimizer),
    Dimension("comm_hook", "the comm hook, Python or torch's C++ built-in", _HOOK, _hook),
    Dimension("model", "what the model holds", MODEL_VALUES, _model),
)

BY_NAME: dict[str, Dimension] = {d.name: d for d in DIMENSIONS}


def read(scenario: Scenario) -> dict[str, Values]:
    """Every dimension's values for ``scenario``."""
    return {d.name: d.read(scenario) for d in DIMENSIONS}

