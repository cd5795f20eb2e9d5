"""Scenarios added where a mutant of torch's own DDP survived the catalog.

Each mutant is torch 2.13's DDP with one small change (``docs/mutation.md``,
``benchmarks/mutation_score.py``); a survivor whose change a user can observe on Gloo/CPU
gets a scenario here that fails it and passes torch's DDP and the reference.

``gaps/delay-all-reduce-odd-sizes``: the delayed parameters share one flat buffer, each
gradient a view at the running sum of the sizes before it. The catalog's other
delay-all-reduce scenario delays parameters whose sizes (64 and 4) never share a bit, so
an offset computed as ``offset | numel`` instead of ``offset + numel`` gives the same
views; widths of 12 give sizes 144, 12, 48 and 4, where it does not.

``gaps/join-no-sync``: every forward under Join all-reduces whether this iteration's
backward synchronises, so that joined ranks shadow exactly the synced backwards. The Join
scenarios all synchronise every backward, where "active ranks report no sync, joined ones
sync" (inverted) gives the same sum; a no_sync microbatch in each step does not.

``gaps/throw-on-early-termination-even``: the Join scenarios with
``throw_on_early_termination`` all have uneven inputs and expect the error, so a flag that
raises at the first check, runs out or not, passes them.

``gaps/fp16-compress-on-pair``: every comm-hook scenario registers its hook on the world's
DDP, where "the group given" and the world are the same group.

``gaps/find-unused-first-bucket``: under find_unused_parameters torch's initial bucket
layout starts with a bucket of 1 MiB (``dist._DEFAULT_FIRST_BUCKET_BYTES``); every other
model of the catalog fits in it, so its size never showed. Width 512 gives 1.1 MiB, whose
checks take seconds: it runs with ``--slow``.

``gaps/powersgd-warm-start``: comm-hooks/powersgd-full-rank compresses every matrix at a
rank covering it, from a fresh random Q each step. torch's defaults take other paths: small
tensors (biases, the 4x32 head) left uncompressed and all-reduced as one flat buffer, Q kept
from the previous step (warm start), tensors of one shape batched (the two 32x32 weights).
Rank 4 is exact where every gradient matrix has rank <= 4, as with one sample per rank at
up to 4 ranks, so the oracle's tolerance stays that of rounding (rtol 1e-4, as for the
full-rank scenario). Its Gram-Schmidt path (ranks up to 2) is not judged: on gradients of
exactly its rank it loses orthogonality (measured: 0.1 relative error on torch itself).

``gaps/one-buffer``: DDP syncs buffers in forward when the module has any
(``len(buffers) > 0``); every model of the catalog whose buffers drift per rank has two or
more, so "more than one" passed them. ``one_buffer`` has exactly one, a running mean of
per-rank data.

``gaps/powersgd-from-start``: PowerSGDState refuses ``start_powerSGD_iter <= 1`` with error
feedback or warm start, and only then; every other PowerSGD scenario keeps error feedback,
so a check that refuses the options without them passed. Rank 4 on gradients of rank <= 4
is exact up to rounding, as for gaps/powersgd-warm-start.

``gaps/default-bucket-cap``: the default ``bucket_cap_mb`` is 25 (MiB). The catalog's other
models have far fewer gradients than a bucket, so a default of 24 gave the same layout.
Width 1792 and depth 4 (three 1792x1792 weights) give, in the layout DDP rebuilds after the
first step, a first bucket closed by the last weight, then two weights and their biases of
24.5 MiB: under a cap of 25 the input layer joins their bucket, under 24 it starts a new
one. Two steps, so that the rebuilt layout is traced; its checks take seconds: it runs with
``--slow``.

``gaps/broadcast-buffers-off-mid-run``: ``broadcast_buffers`` is a property of torch's DDP
whose setter sets ``forward_sync_buffers``, read at every forward. The catalog gave it only
to the constructor, so a DDP whose attribute no longer reaches the forward passed; turned
off after two steps, BatchNorm's running statistics follow each rank's own batches from
then on.

``gaps/powersgd-gram-schmidt``: torch's PowerSGD orthogonalizes P by QR above rank 2 and
by Gram-Schmidt at ranks 1 and 2, with ``orthogonalization_epsilon`` added to each column's
norm when it is not 0. Every other PowerSGD scenario runs at rank 4 (QR) with epsilon 0.
At world size 2 with one sample per rank every gradient matrix has rank <= 2, so rank 2 is
exact up to rounding; in float64, so that the rounding of Gram-Schmidt on P's two columns
stays far below the tolerance. An epsilon of 1e-12 is far below any column's norm. Batched
by shape, as torch allows: the 16x8 and the 16x16 weight are each alone of their shape, a
batch of one (gaps/powersgd-warm-start batches two of one shape).

``gaps/post-local-sgd-before-start``: post-local SGD allreduces over the whole group before
``start_localSGD_iter`` and within its local subgroup after. The catalog's other
post-local-SGD scenario takes the whole group as the subgroup (so that the average holds
after the start too), where both phases are the same allreduce; single-rank subgroups and
a start no scenario reaches tell them apart.

``gaps/device-ids-on-cpu``: ``device_ids`` belongs to single-device GPU modules; for a CPU
module DDP refuses it. The harness passes ``device_ids`` only on CUDA, so no scenario gave
it to a CPU module. On a GPU, where the same list is valid, the scenario means nothing.
"""
from ddp_conformance import Scenario
from ddp_conformance.catalog.rules import with_rules
from ddp_conformance.catalog.scenario import JoinSpec

SCENARIOS = [
    Scenario("gaps/delay-all-reduce-odd-sizes", "mlp", model_kwargs={"width": 12}, steps=3,
             barrier_after_backward=True,
             ddp_options={"delay_all_reduce_named_params": ["2.weight", "2.bias", "4.weight",
                                                            "4.bias"],
                          "param_to_hook_all_reduce": "0.weight"},
             description="delay_all_reduce_named_params over four parameters of sizes "
                         "144, 12, 48, 4: each at its own offset of the flat buffer"),
    Scenario("gaps/join-no-sync", "mlp", steps=4, min_world_size=2, join=JoinSpec(),
             microbatches=2, accumulate="no_sync",
             description="Join with uneven inputs and a no_sync microbatch in every step: "
                         "a joined rank shadows only the synced backward"),
    Scenario("gaps/powersgd-warm-start", "mlp", model_kwargs={"width": 32, "depth": 3},
             batch_size=1, steps=5, comm_hook="powersgd_warm_start", rtol=1e-4,
             trace_volume=False,
             description="PowerSGD at rank 4 on gradients of rank <= 4: two 32x32 weights "
                         "compressed as one batch, warm-started; the rest uncompressed"),
    Scenario("gaps/throw-on-early-termination-even", "mlp", steps=3, min_world_size=2,
             join=JoinSpec(throw_on_early_termination=True, fewer_steps_per_rank=0),
             description="Join with throw_on_early_termination and even inputs: nobody runs "
                         "out, so every rank trains its steps"),
    Scenario("gaps/fp16-compress-on-pair", "mlp", groups=((0, 1),), world_sizes=(3,),
             comm_hook="fp16_compress", rtol=4e-3,
             description="fp16_compress_hook on a DDP group of 2 in a world of 3: the hook "
                         "reduces over the group it is given"),
    Scenario("gaps/find-unused-first-bucket", "mlp", model_kwargs={"width": 512}, steps=1,
             ddp_options={"find_unused_parameters": True}, slow=True,
             description="find_unused_parameters with the default cap and 1.1 MiB of "
                         "gradients: a 1 MiB first bucket, then 25 MiB ones"),
    Scenario("gaps/one-buffer", "one_buffer", steps=3, min_world_size=2,
             description="a model with exactly one buffer, a running mean of per-rank data: "
                         "rank 0's is broadcast in every forward"),
    Scenario("gaps/powersgd-from-start", "mlp", model_kwargs={"width": 32, "depth": 3},
             batch_size=1, steps=3, comm_hook="powersgd_from_start", rtol=1e-4,
             trace_volume=False,
             description="PowerSGD at rank 4 from the first step, without error feedback or "
                         "warm start, on gradients of rank <= 4"),
    Scenario("gaps/default-bucket-cap", "mlp", model_kwargs={"width": 1792, "depth": 4},
             steps=2, slow=True,
             description="the default bucket cap with 24.6 MiB of gradients after the first "
                         "bucket: one bucket of 25 MiB holds them all"),
    Scenario("gaps/broadcast-buffers-off-mid-run", "conv_bn", steps=4, min_world_size=2,
             broadcast_buffers_off_at=2,
             description="ddp.broadcast_buffers = False after two steps: rank 0's running "
                         "statistics broadcast before the first two, each rank's own after"),
    # float64: Gram-Schmidt's rounding grows with the condition number of P (the ratio
    # of the two samples' directions in the gradient); rtol 1e-6 leaves it a factor 1e10
    # over float64's u (1.1e-16), and torch's measured error is 8e-10 of the largest
    # gradient; a wrong orthogonalization loses a direction: off by 0.3 or more.
    Scenario("gaps/powersgd-gram-schmidt", "mlp_float64",
             batch_size=1, steps=5, world_sizes=(2,), comm_hook="powersgd_rank2", rtol=1e-6,
             trace_volume=False,
             description="PowerSGD at rank 2 (Gram-Schmidt), batched by shape, on two "
                         "samples: gradients of rank <= 2"),
    Scenario("gaps/post-local-sgd-before-start", "mlp", steps=3, min_world_size=2,
             comm_hook="post_local_sgd_before_start",
             description="post_localSGD_hook with single-rank subgroups before "
                         "start_localSGD_iter: the global allreduce"),
    Scenario("gaps/device-ids-on-cpu", "mlp", devices=("cpu",),
             ddp_options={"device_ids": [0]},
             expect_error=r"ValueError: .*device_ids and output_device arguments only work "
                          r"with single-device/multiple-device GPU modules or CPU modules",
             description="device_ids given for a CPU module is refused"),
]

#: The DDP rule each scenario checks (``Scenario.rule``; see ddp_conformance.catalog.rules).
RULES = {
    'gaps/delay-all-reduce-odd-sizes':
        'The parameters named in delay_all_reduce_named_params are averaged over the ranks '
        'like any other, whatever their sizes: each has its own slice of the flat buffer '
        'that carries them.',
    'gaps/join-no-sync':
        'Under Join the active ranks tell the joined ones, every iteration, whether this '
        'backward synchronises: a joined rank shadows the all-reduce of a synced backward '
        'and nothing inside no_sync, so collectives match and gradients are averaged once '
        'per step.',
    'gaps/powersgd-warm-start':
        "PowerSGD's low-rank reduction is exact on gradients of at most its rank: after the "
        'uncompressed steps it gives the average up to rounding, with the small tensors '
        'all-reduced as they are and the rest compressed, batched by shape and warm-started.',
    'gaps/throw-on-early-termination-even':
        'throw_on_early_termination raises only once a rank has run out of inputs: with '
        'even inputs Join checks every iteration and training goes on undisturbed.',
    'gaps/fp16-compress-on-pair':
        "torch's compression hooks reduce over the process group they are registered with, "
        'not the world: a pair inside a world of 3 averages over the pair.',
    'gaps/find-unused-first-bucket':
        'With find_unused_parameters and the default bucket_cap_mb, DDP starts with a '
        'first bucket of 1 MiB (the gradients ready first launch early) and buckets of '
        '25 MiB after it, until the layout is rebuilt.',
    'gaps/one-buffer':
        'With broadcast_buffers (the default) DDP broadcasts the buffers of rank 0 before '
        'every training forward whenever the module has buffers, one as well as many.',
    'gaps/powersgd-from-start':
        'PowerSGD may compress from the first step (start_powerSGD_iter=1) when it keeps '
        'no error feedback and no warm start: on gradients of at most its rank it gives '
        'the average up to rounding.',
    'gaps/default-bucket-cap':
        'Without bucket_cap_mb, DDP fills buckets of 25 MiB after the first bucket: '
        'gradients of up to 25 MiB in all share one bucket.',
    'gaps/broadcast-buffers-off-mid-run':
        "Setting ddp.broadcast_buffers after construction switches the buffer broadcast: "
        "from the next forward on, each rank keeps its own buffers, such as BatchNorm's "
        "running statistics, instead of rank 0's.",
    'gaps/powersgd-gram-schmidt':
        "PowerSGD's low-rank reduction is exact on gradients of at most its rank, at rank 2 "
        "too, where torch orthogonalizes P by Gram-Schmidt: the average up to rounding.",
    'gaps/post-local-sgd-before-start':
        'post_localSGD_hook allreduces over the whole group until start_localSGD_iter, '
        'whatever its local subgroups: until then the gradients are the average over every '
        'rank, as without a hook.',
    'gaps/device-ids-on-cpu':
        'device_ids is for a module on one GPU: DDP refuses it, on every rank, for a module '
        'whose parameters are on the CPU.',
}
SCENARIOS = with_rules(SCENARIOS, RULES)
