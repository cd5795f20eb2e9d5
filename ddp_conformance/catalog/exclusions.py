"""Combinations of dimension values (``catalog/interactions.py``) that are not valid pairs,
each with its reason, as data.

An :class:`Exclusion` names values in one, two or three dimensions: a scenario taking all
of them is one torch 2.13 cannot run on Gloo/CPU, one it refuses by design, or one whose
meaning is not DDP's average (and so no oracle can judge it). A pair of values is
excluded when an exclusion's dimensions are among the pair's two and both values match;
an exclusion over three dimensions excludes no pair, it only steers generated rows away
from the third value (``unused parameters without find_unused_parameters`` is valid under
``static_graph``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ddp_conformance.catalog.interactions import HOOKS


@dataclass(frozen=True)
class Exclusion:
    """The combination where every dimension of ``when`` takes one of its values."""

    when: Mapping[str, frozenset[str]]
    reason: str

    def matches(self, row: Mapping[str, str]) -> bool:
        """Whether ``row`` (dimension -> value, possibly partial) holds the combination:
        every dimension of ``when`` is in ``row`` with one of its values."""
        return all(dim in row and row[dim] in values for dim, values in self.when.items())


def _x(reason: str, **when: str | tuple[str, ...]) -> Exclusion:
    return Exclusion({d: frozenset((v,) if isinstance(v, str) else v) for d, v in when.items()},
                     reason)


LOSSY_HOOKS = ("fp16_compress", "builtin_fp16_compress")
#: Accumulations of several microbatches.
MICROBATCHED = ("sync_each", "no_sync", "nested_no_sync", "single_auto_sync",
                "multi_auto_sync", "forced_sync")
#: Accumulations whose first microbatch runs inside no_sync.
NO_SYNC_FIRST = ("no_sync", "nested_no_sync", "single_auto_sync", "forced_sync")

EXCLUSIONS: tuple[Exclusion, ...] = (
    _x("torch 2.13 runs DDP's mixed_precision with CUDA streams and events only: on CPU its "
       "first forward raises (surface/mixed-precision-fp16)", precision="mixed_precision"),
    _x("torch 2.13's end-of-backward callback for an optimizer applied in backward waits "
       "on an accelerator stream: on CPU it raises (surface/optimizer-in-backward)",
       optimizer="in_backward_sgd"),
    _x("a parameter without a gradient needs find_unused_parameters or static_graph: "
       "without either torch raises at the next step, by design (errors/)",
       model="unused_parameters", find_unused_parameters="off", static_graph="off"),
    _x("parameters behind an output left out of the loss never get a gradient: without "
       "find_unused_parameters torch raises at the next step, by design (errors/)",
       model="unused_output", find_unused_parameters="off"),
    _x("static_graph finds unused parameters from the forward's outputs in its first "
       "iteration: those behind an output left out of the loss count as used, and torch "
       "raises at the next one (the limit errors/output-left-out-of-loss shows)",
       model="unused_output", static_graph="on"),
    _x("an output left out of the loss needs find_unused_parameters (above), under which "
       "several forwards per backward mark a parameter ready twice (below)",
       model="unused_output", forwards="several"),
    _x("Join shadows one forward per iteration (the active ranks' allreduce): several "
       "forwards per backward leave the joined ranks behind, by design",
       join="uneven", forwards="several"),
    _x("an eval forward on the active ranks broadcasts buffers that joined ranks, which "
       "shadow training iterations only, never match", join="uneven", eval_between_steps="on"),
    _x("_register_fused_optim registers torch's own comm hook: a second hook is refused",
       optimizer="fused_sgd", comm_hook=HOOKS),
    _x("the copy of the wrapper keeps no comm hook (torch's __getstate__ drops it): after "
       "the copy the reduction is another one", checkpointing="saved_mid_run",
       comm_hook=HOOKS),
    _x("the copy trains with a new optimizer: only a stateless one (SGD) goes on where the "
       "original left off", checkpointing="saved_mid_run",
       optimizer=("sgd_momentum", "adam", "zero_sgd", "fused_sgd", "in_backward_sgd")),
    _x("Adam divides by sqrt(v): a bfloat16 rounding of a near-zero gradient element "
       "becomes a full step, past any tolerance argued from bfloat16's precision",
       model="low_precision", optimizer="adam"),
    _x("Adam divides by sqrt(v): a lossy hook's float16 rounding of a near-zero gradient "
       "element becomes a full step, past any tolerance argued from float16's precision",
       optimizer="adam", comm_hook=LOSSY_HOOKS),
    _x("a float16 compression of a bfloat16 model's buckets rounds to another format than "
       "the model's: no single tolerance", model="low_precision", comm_hook=LOSSY_HOOKS),
    _x("autocast over a model wholly in bfloat16 changes nothing it would test",
       model="low_precision", precision="autocast"),
    _x("a lossy hook's rounding flips autocast's bfloat16 rounding of the weights in the "
       "next forward: trajectories part chaotically (measured in torch and the reference)",
       precision="autocast", comm_hook=LOSSY_HOOKS),
    _x("torch 2.13 fails an INTERNAL ASSERT (expect_autograd_hooks_) when a static graph's "
       "first iteration accumulates inside no_sync: tests/standalone/static_graph_no_sync.py",
       static_graph="on", accumulation=NO_SYNC_FIRST),
    _x("torch 2.13 does not reduce the first backward of a static-graph wrapper copied "
       "mid-run: tests/standalone/static_graph_deepcopy.py", static_graph="on",
       checkpointing="saved_mid_run"),
    _x("torch 2.13 reports index() 0 for every bucket and no is_last() in a static graph's "
       "first iteration with several buckets from the start (one per dtype, a sparse "
       "gradient's own): tests/standalone/static_graph_bucket_index.py",
       static_graph="on", comm_hook="bucket_position", model=("mixed_dtypes", "sparse")),
    _x("a rank that joins changes the graph a static graph replays: torch raises 'Your "
       "training graph has changed' or the joined rank's shadow allreduce meets a forward",
       static_graph="on", join="uneven"),
    _x("several forwards before one backward under find_unused_parameters mark a parameter "
       "ready twice: torch refuses it ('Expected to mark a variable ready only once')",
       forwards="several", find_unused_parameters="on"),
    _x("torch cannot add sparse float16 tensors ('cadd_sparse' not implemented for 'Half'): "
       "a float16-compressing hook fails on a sparse gradient", model="sparse",
       comm_hook=LOSSY_HOOKS),
    _x("torch 2.13's Join fails on a joined rank whose model has a sparse gradient ('Expected "
       "a proper Tensor but got None'): tests/standalone/join_sparse_gradients.py",
       model="sparse", join="uneven"),
    _x("torch's Adam refuses sparse gradients (SparseAdam is another optimizer)",
       model="sparse", optimizer="adam"),
    _x("the fused optimizer steps each parameter when its bucket is reduced: a step that "
       "accumulates microbatches steps at every synced one, or never (forced_sync)",
       optimizer="fused_sgd", accumulation=MICROBATCHED),
    _x("ZeroRedundancyOptimizer takes parameters of one dense dtype only: it refuses "
       "float32 beside float64", optimizer="zero_sgd", model="mixed_dtypes"),
    _x("ZeroRedundancyOptimizer's join hook shadows one optimizer step per Join iteration, "
       "and each microbatch's forward is one: several microbatches per step desync",
       optimizer="zero_sgd", join="uneven", accumulation=MICROBATCHED),
    _x("Composer's forced_sync all-reduces the gradients by hand, outside DDP: a joined "
       "rank's Join hook shadows DDP's reductions only, so the two streams desync",
       accumulation="forced_sync", join="uneven"),
    _x("Composer's forced_sync allreduces each gradient that is not None: ranks whose "
       "unused parameters differ issue different allreduces and desync, by its design",
       accumulation="forced_sync", model="unused_parameters"),
)


#: Valid pairs the generator does not draw (so they stay uncovered, and count as such): the
#: harness cannot judge them yet, or torch differs there and no standalone script shows why.
GAPS: tuple[Exclusion, ...] = (
    _x("several synced microbatches under Join with divide_by_initial_world_size=True (the "
       "generator's Join): torch 2.13 weighs a step's earlier synced backwards less once a rank "
       "has joined (the joined rank shadows the re-reduction of their average with zeros), "
       "against the equal weight per sample it documents and the oracle holds: "
       "tests/standalone/join_synced_microbatches.py; divided by the active ranks: "
       "join/synced-microbatches-divide-by-active, join/multi-auto-sync-divide-by-active",
       join="uneven",
       accumulation=("sync_each", "multi_auto_sync")),
    _x("a wrapper copied mid-run under Join: the Join context keeps the original wrapper as "
       "its joinable, so a joined rank shadows with it (torch and the reference alike part "
       "replicas)", join="uneven", checkpointing="saved_mid_run"),
    _x("torch's fused optimizer on sparse gradients differs from the oracle at step 1 where "
       "the reference agrees: not yet shown without the harness", model="sparse",
       optimizer="fused_sgd"),
)


def excluded(row: Mapping[str, str]) -> Exclusion | None:
    """The first exclusion ``row`` (dimension -> value, possibly partial) holds, or None."""
    return next((x for x in EXCLUSIONS if x.matches(row)), None)


def pair_exclusion(a: tuple[str, str], b: tuple[str, str]) -> Exclusion | None:
    """The exclusion of the pair (``a``, ``b``), each ``(dimension, value)``: one over at
    most these two dimensions whose values both match, or None (a valid pair)."""
    row = dict([a, b])
    return next((x for x in EXCLUSIONS if set(x.when) <= set(row) and x.matches(row)), None)
