"""Correctness bugs torch's DDP shipped, and what the catalog does about each.

:data:`HISTORY` is data: one :class:`Bug` per defect of torch's DDP (the wrapper, the C++
reducer, comm hooks, Join, ``static_graph``, ``find_unused_parameters``, bucket views,
``no_sync``, buffers, SyncBatchNorm, sparse gradients, the compiler's DDP optimizer), with
the issue or pull request that reported or fixed it, the torch release that shipped the fix,
the features where it bit and what went wrong. Each bug either names the catalog scenarios
that fail a DDP carrying it (``scenarios``; each such scenario lists the bug in
``Scenario.guards``, shown by ``list`` and in the reports), or says why none can (``why``:
one of :class:`Why`, and ``reason`` in words). ``ddp-conformance list --history`` prints the
table; ``--markdown`` writes ``docs/bug-history.md``.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class Why(str, enum.Enum):
    """Why a bug has no scenario of its own."""

    #: It needs CUDA or NCCL (SyncBatchNorm's kernels, CUDA streams): the CPU catalog cannot
    #: reach it.
    CUDA = "needs CUDA/NCCL"
    #: The feature, or the implementation that had the bug, is gone from torch.
    GONE = "feature gone"
    #: torch 2.13 still has it: shown by a torch-only script in ``tests/standalone/``.
    OPEN = "torch 2.13 still has it"
    #: The defect is in code a DDP candidate does not own (a hook module's own state, a
    #: model averager, the compiler).
    OUTSIDE = "outside the DDP"
    #: No value, collective or error a user sees changes (memory, speed, rounding only).
    UNOBSERVABLE = "no observable difference"
    #: Its trigger is not one of the catalog's procedures (said which).
    NOT_MODELLED = "trigger not in the catalog"
    #: An existing scenario, named in ``reason``, already fails a DDP carrying it.
    COVERED = "covered by an existing scenario"


@dataclass(frozen=True)
class Bug:
    """One historical defect. ``ref`` is the issue or pull request that reports it
    (``owner/repo#N``), ``fix`` the pull request that fixed it where it is another one;
    ``fixed_in`` the first torch release with the fix ("open" if none has it)."""

    ref: str
    title: str
    fixed_in: str
    features: tuple[str, ...]
    what: str
    fix: str = ""
    scenarios: tuple[str, ...] = ()
    why: Why | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if bool(self.scenarios) == (self.why is not None):
            raise ValueError(f"{self.ref}: give scenarios or a reason (why), not both or neither")
        if self.why is not None and not self.reason.strip():
            raise ValueError(f"{self.ref}: {self.why.value} needs the reason in words")

    @property
    def fixed(self) -> bool:
        return self.fixed_in != "open"


def _pt(number: int) -> str:
    return f"pytorch/pytorch#{number}"


HISTORY: tuple[Bug, ...] = (
    # --- guarded by scenarios (each with a mutant in tests/mutants/history.py) -------------
    Bug(_pt(63210), "GradBucket.is_last() answered whether the bucket was the first", "1.10",
        ("comm hooks", "buckets"), fix=_pt(63768),
        what="is_last() was true for bucket 0, the first reduced, so a hook that counts "
             "iterations on the last bucket (PowerSGD, post-local SGD) miscounted with "
             "several buckets",
        scenarios=("comm-hooks/bucket-position",)),
    Bug(_pt(63916), "Buffers reassigned in forward were not broadcast", "1.10",
        ("buffers",), fix=_pt(64472),
        what="DDP kept the buffer tensors it listed at construction; a module assigning new "
             "tensors to its buffers had them left rank-local while stale ones were broadcast",
        scenarios=("buffers/replaced-in-forward",)),
    Bug(_pt(60611), "Uneven inputs (Join) ignored a registered comm hook", "1.10",
        ("Join", "comm hooks"), fix=_pt(61020),
        what="a joined rank shadowed each bucket with a plain allreduce instead of the hook, "
             "so its collectives did not match a hook that reduces otherwise (float16, "
             "PowerSGD)",
        scenarios=("history/join-fp16-compress-hook",)),
    Bug(_pt(44425), "Join did not work with no_sync", "1.7", ("Join", "no_sync"),
        fix=_pt(44427),
        what="a joined rank shadowed gradient allreduces every iteration while the active "
             "ranks, inside no_sync, issued none: the collectives paired wrongly",
        scenarios=("history/join-no-sync",)),
    Bug(_pt(57410), "fp16 compression summed before dividing by the world size", "1.9",
        ("comm hooks", "fp16 compression"),
        what="fp16_compress_hook allreduced the float16 bucket and divided afterwards, so a "
             "sum above 65504 overflowed to inf where the mean is finite (C++ and the other "
             "hooks: pytorch/pytorch#59576, 1.10)",
        scenarios=("history/fp16-compress-near-range", "history/fp16-compress-wrapper-near-range",
                   "history/builtin-fp16-compress-near-range")),
    Bug(_pt(60733), "Outputs without grad_fn got one under find_unused_parameters", "1.10",
        ("find_unused_parameters", "outputs"), fix=_pt(60882),
        what="every output went through DDP's pass-through autograd node, so a tensor made "
             "outside autograd came back with a grad_fn; fed into the next forward "
             "(Transformer-XL's memory), backward ran into the previous iteration's graph",
        scenarios=("history/find-unused-memory-fed-back",)),
    Bug(_pt(61753), "An output left out of the loss stopped find_unused_parameters", "1.10",
        ("find_unused_parameters", "outputs"),
        what="DDP handed the outputs back without its pass-through node: the parameters of an "
             "output the loss did not use were found used by the traversal, never got a "
             "gradient, and the next iteration raised (reland of pytorch/pytorch#57081)",
        scenarios=("history/find-unused-output-left-out",)),
    Bug(_pt(69031), "find_unused_parameters ignored parameters used only inside no_sync",
        "2.4", ("find_unused_parameters", "no_sync"), fix=_pt(124193),
        what="a parameter used on accumulated microbatches but not on the synced one counted "
             "as unused on every rank: its gradient was never reduced",
        scenarios=("history/no-sync-find-unused-used-early",)),
    Bug(_pt(28294), "Globally unused parameters got zero gradients instead of None", "1.4",
        ("find_unused_parameters",), fix=_pt(28883),
        what="a parameter no rank used received a zero .grad, so momentum and weight decay "
             "moved it as if it had been trained",
        scenarios=("unused/always-and-alternate",)),
    Bug(_pt(42400), "Comm hooks got buckets already divided by the world size", "1.7",
        ("comm hooks",),
        what="the reducer divided each bucket before the hook, which divides too: averaging "
             "hooks returned gradients divided twice",
        scenarios=("comm-hooks/allreduce",)),
    Bug(_pt(43307), "A hook's returned tensor took over the bucket views", "1.7",
        ("comm hooks", "bucket views"),
        what="after a hook returned a new tensor the bucket views pointed into it, so later "
             "gradients were copied there while the hook read the bucket's stale buffer "
             "(loss became NaN)",
        scenarios=("comm-hooks/returns-new-tensor",)),
    Bug(_pt(19354), "find_unused_parameters did not look inside dict outputs", "1.1",
        ("find_unused_parameters", "outputs"),
        what="DDP searched lists and tuples for output tensors; a dict output gave it none, "
             "so every parameter was marked unused and ready before its gradient came",
        scenarios=("unused/nested-outputs",)),
    Bug(_pt(3023), "DistributedDataParallel.__getstate__ returned nothing", "0.3",
        ("pickling",),
        what="a pickled or deep-copied wrapper came back without its attributes",
        scenarios=("surface/copy-pickle", "surface/copy-deepcopy")),
    Bug(_pt(53793), "DDP used the global rank where it needed its group rank", "1.9",
        ("process groups", "Join", "buffers"),
        what="dist.get_rank() instead of the rank in DDP's process group: on a subgroup, Join "
             "picked the rank to take buffers from by a number that is not a group rank",
        scenarios=("history/join-buffers-subgroup",)),
    Bug(_pt(63375), "The C++ FP16_COMPRESS hook reduced in float32", "1.10",
        ("comm hooks", "fp16 compression"),
        what="the built-in hook copied its float16 cast back into the float32 bucket and "
             "allreduced that: no compression at all",
        scenarios=("surface/builtin-fp16-compress",)),
    Bug(_pt(73547), "Ranks with different parameter counts were not refused", "1.12",
        ("construction",), fix=_pt(74113),
        what="the constructor's same-model check compared shapes but not the number of "
             "parameters, so a rank with an extra layer failed or hung in the broadcasts",
        scenarios=("errors/mismatched-models",)),
    Bug(_pt(58097), "static_graph's bucket rebuild left out unused parameters", "1.9",
        ("static_graph", "bucket rebuilding", "find_unused_parameters"),
        what="the rebuilt layout listed only parameters whose gradients arrived, not those "
             "the static graph had found unused: it no longer covered every parameter",
        scenarios=("surface/static-graph-with-find-unused",)),
    # --- torch 2.13 still has it --------------------------------------------------------------
    Bug(_pt(143580), "static_graph with no_sync fails an internal assert", "open",
        ("static_graph", "no_sync"),
        what="the static graph's first iteration queues its delayed allreduce in a backward "
             "inside no_sync; the synced backward then finds no backward expected "
             "(a regression from pytorch/pytorch#103487; fix pytorch/pytorch#187732 open)",
        why=Why.OPEN,
        reason="tests/standalone/static_graph_no_sync.py shows it with torch only; the "
               "catalog's static_graph scenarios do not accumulate in their first iteration"),
    # --- needs CUDA / NCCL --------------------------------------------------------------------
    Bug(_pt(36382), "SyncBatchNorm gradient wrong with different batch sizes per rank", "1.5",
        ("SyncBatchNorm",),
        what="the backward ignored the per-rank counts added for variable batch sizes: wrong "
             "input gradients",
        why=Why.CUDA, reason="SyncBatchNorm runs on CUDA only; on CPU DDP refuses it "
                             "(surface scenarios check the refusal)"),
    Bug(_pt(22192), "SyncBatchNorm running variance wrong with uneven batches", "1.2",
        ("SyncBatchNorm", "buffers"), fix=_pt(22248),
        what="the running statistics were combined as if every rank had the same batch size",
        why=Why.CUDA, reason="SyncBatchNorm's kernels are CUDA-only"),
    Bug(_pt(64039), "SyncBatchNorm beside BatchNorm2d gave wrong gradients", "1.10",
        ("SyncBatchNorm",), fix=_pt(64100),
        what="the backward read a channels-last gradient with a contiguous input as if both "
             "were channels-last",
        why=Why.CUDA, reason="a CUDA kernel's layout choice"),
    Bug(_pt(57077), "Channels-last SyncBatchNorm zeroed channels past 64", "1.9",
        ("SyncBatchNorm",),
        what="a launch configuration left all but the first 64 channels of the output at zero",
        why=Why.CUDA, reason="a CUDA launch configuration"),
    Bug(_pt(36530), "SyncBatchNorm crashed on a rank with an empty batch", "1.12",
        ("SyncBatchNorm", "uneven inputs"), fix=_pt(74944),
        what="a rank with no samples could not compute its statistics and left its peers "
             "waiting",
        why=Why.CUDA, reason="SyncBatchNorm is CUDA-only"),
    Bug(_pt(78656), "SyncBatchNorm CUDA ops refused 0-sized batches", "2.1",
        ("SyncBatchNorm",), fix=_pt(109085),
        what="the CUDA statistics kernels raised on an empty batch",
        why=Why.CUDA, reason="CUDA kernels"),
    Bug(_pt(22569), "convert_sync_batchnorm made frozen BatchNorm parameters trainable", "1.2",
        ("SyncBatchNorm", "frozen parameters"),
        what="the converted layers had requires_grad set whatever the original's, so frozen "
             "affine parameters started training",
        why=Why.CUDA, reason="SyncBatchNorm layers run on CUDA only; on CPU DDP refuses them"),
    Bug(_pt(111998), "convert_sync_batchnorm put layers in eval mode back into training",
        "2.2", ("SyncBatchNorm", "buffers"),
        what="the converted layers did not keep the original's training flag, so a layer held "
             "in eval mode updated its running statistics again",
        why=Why.CUDA, reason="SyncBatchNorm layers run on CUDA only"),
    Bug(_pt(53159), "find_unused_parameters raced when every parameter was used", "1.9",
        ("find_unused_parameters",), fix=_pt(53160),
        what="the lazily awaited allreduce of the used-parameter map raced with work queued "
             "on the CUDA stream",
        why=Why.CUDA, reason="a race between CUDA streams; Gloo on CPU completes in order"),
    Bug(_pt(60891), "Model averaging allreduced parameters while gradients were in flight",
        "1.10", ("post-local SGD",),
        what="without a synchronisation the parameter allreduce could overlap the "
             "per-machine gradient allreduce",
        why=Why.CUDA, reason="CUDA stream ordering; also outside DDP (the model averager)"),
    # --- outside the DDP ------------------------------------------------------------------------
    Bug(_pt(51427), "PowerSGD failed with start_powerSGD_iter=1", "1.8",
        ("comm hooks", "PowerSGD", "bucket rebuilding"),
        what="compressing from the first iteration overlapped the bucket rebuild after it, so "
             "the error tensors no longer matched the buckets",
        why=Why.OUTSIDE,
        reason="the fix is PowerSGDState's own argument check, whatever the DDP; "
               "comm-hooks/powersgd-full-rank compresses from the third iteration, across the "
               "rebuild"),
    Bug(_pt(48867), "PowerSGD keyed its error feedback by tensor hash", "1.8",
        ("comm hooks", "PowerSGD", "bucket rebuilding"),
        what="the key changed when buckets were rebuilt, so error feedback could be lost or "
             "grow without bound; it is keyed by the bucket's index now",
        why=Why.OUTSIDE,
        reason="the hook's state; what it needs of a DDP, an index() that names the same "
               "bucket every iteration, comm-hooks/bucket-position checks"),
    Bug(_pt(74157), "Post-local SGD lost accuracy against plain DDP", "1.12",
        ("post-local SGD",), fix=_pt(74894),
        what="the model averager averaged at the wrong iterations, so a subgroup covering "
             "the world did not reproduce plain DDP",
        why=Why.OUTSIDE,
        reason="the model averager is not part of DDP; post_localSGD_hook itself is in "
               "surface/post-local-sgd"),
    Bug(_pt(160745), "DDPOptimizer reused the wrong graph's metadata for donated buffers",
        "2.9", ("torch.compile",),
        what="compiling the split subgraphs overwrote one shared metadata record, so backward "
             "graphs compiled later could write into buffers another graph still needed",
        why=Why.OUTSIDE,
        reason="a defect of torch.compile, not of a DDP; the torch-compile candidates "
               "(ddp_conformance/builtins/torch_compile.py) run the catalog through it"),
    Bug(_pt(104639), "DDPOptimizer split graphs inside activation checkpointing", "2.1",
        ("torch.compile", "checkpointing"),
        what="splitting a compiled graph at bucket boundaries inside a checkpointed region "
             "failed; the optimizer now falls back to one bucket there",
        why=Why.OUTSIDE,
        reason="the compiler's graph splitting, not a DDP's; the torch-compile candidates "
               "(ddp_conformance/builtins/torch_compile.py) run the checkpointing scenarios "
               "through it"),
    # --- no observable difference ---------------------------------------------------------------
    Bug(_pt(61814), "Sparse gradients were divided after the allreduce", "1.10",
        ("sparse gradients",),
        what="dense buckets were divided before summing, sparse ones after: a float16 sum "
             "could overflow",
        why=Why.UNOBSERVABLE,
        reason="on the catalog's float32 sparse embedding both orders give the mean within "
               "rounding (models/sparse-embedding checks it); the overflow needs float16 "
               "sparse gradients"),
    # --- the feature is gone --------------------------------------------------------------------
    Bug(_pt(43557), "Gradients as bucket views broke zero_grad's detach_", "1.7",
        ("bucket views",),
        what="making every gradient a view of its bucket (pytorch/pytorch#41954) broke code "
             "that detaches gradients in place; it was backed out",
        why=Why.GONE,
        reason="gradients are bucket views only under the opt-in gradient_as_bucket_view "
               "since; options/gradient-as-bucket-view covers that"),
    Bug(_pt(2428), "The first DDP failed on a model without buffers", "0.3", ("buffers",),
        what="the Python DDP of 0.2 flattened the module's buffers for the broadcast and "
             "raised on an empty list",
        why=Why.GONE,
        reason="that implementation was replaced by the C++ reducer (1.1); the catalog's "
               "MLP has no buffer"),
    Bug(_pt(14675), "A frozen parameter of its own dtype stopped every reduction", "1.1",
        ("frozen parameters", "buckets"),
        what="a parameter that needs no gradient, alone in its dtype's bucket and reduced "
             "first, never became ready, and every later bucket waited for it",
        why=Why.GONE,
        reason="buckets are no longer made of parameters that need no gradient, and the "
               "reducer of 1.1 replaced that bucketing; models/frozen and buckets/mixed-"
               "dtypes check frozen parameters and per-dtype buckets"),
    Bug(_pt(2464), "The first DDP failed on parameters that do not require grad", "0.2",
        ("frozen parameters",),
        what="the Python DDP of 0.2 bucketed every parameter and waited for gradients frozen "
             "ones never get",
        why=Why.GONE,
        reason="that implementation was replaced by the C++ reducer (1.1); "
               "models/frozen checks frozen parameters"),
    # --- trigger not in the catalog -------------------------------------------------------------
    Bug(_pt(114194), "_update_process_group left the reducer in a bad state after an error",
        "2.2", ("process groups",),
        what="after a backward that raised, updating the process group did not reset the "
             "reducer's iteration state",
        why=Why.NOT_MODELLED,
        reason="needs a backward that raises mid-iteration; surface/update-process-group "
               "updates between complete steps"),
    Bug(_pt(128092), "_update_process_group did not reset the used-parameter map", "2.4",
        ("process groups", "find_unused_parameters"),
        what="a stale map after an interrupted backward led to 'gradient which is undefined, "
             "but still allreduced' errors",
        why=Why.NOT_MODELLED,
        reason="needs a backward that raises mid-iteration before the update"),
    Bug(_pt(63812), "backward(create_graph=True) through DDP raised", "1.10",
        ("create_graph",), fix=_pt(63831),
        what="the reducer divided gradients with an out= multiply, which autograd refuses "
             "when the gradient itself requires grad",
        why=Why.NOT_MODELLED,
        reason="the catalog has no backward with create_graph (and DDP does not reduce "
               "higher-order gradients)"),
    # --- covered by an existing scenario --------------------------------------------------------
    Bug(_pt(111138), "broadcast_buffers=False also skipped the buffer broadcast at "
        "construction", "2.12", ("buffers", "init sync"), fix=_pt(178054),
        what="from 2.1 (pytorch/pytorch#100729) turning off the forward broadcast left "
             "buffers drawn per rank unsynchronised at construction too; forward_sync_buffers "
             "now switches the forward broadcast alone",
        why=Why.COVERED,
        reason="surface/forward-sync-buffers-off (per-rank initial buffers, "
               "forward_sync_buffers=False) fails a DDP that skips the construction "
               "broadcast"),
    Bug(_pt(40407), "find_unused_parameters was inferred from an empty unused set", "1.6",
        ("find_unused_parameters",),
        what="a rank that found no unused parameter skipped the allreduce of the used map that "
             "its peers issued",
        why=Why.COVERED,
        reason="unused/used-on-some-ranks (rank 0 uses everything, rank 1 not) desyncs "
               "such a DDP"),
)


def bugs_guarded_by(scenario_id: str, history: Iterable[Bug] = HISTORY) -> tuple[str, ...]:
    """The refs of the bugs whose ``scenarios`` name ``scenario_id`` (``Scenario.guards``)."""
    return tuple(bug.ref for bug in history if scenario_id in bug.scenarios)
